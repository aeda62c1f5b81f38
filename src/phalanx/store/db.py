"""Store: the index of jobs and their summaries. Bulk data stays in the job directories.

Two engines behind this one face (``engine.py``): a SQLite file in the home (the default) and
PostgreSQL for a team (``PHALANX_STORE=postgresql://...``, ``postgres.py``). Every process that
writes (CLI, supervisors) opens its own store; state changes are compare-and-set
(``transition``), so a stop racing a finish cannot overwrite a terminal state, on either engine.

Scale: every read the CLI makes costs the same at a thousand jobs and at a million (an index
seek, then the rows it returns; ``tests/unit/test_store_plans.py`` pins the plans of both
engines). Listings page by key (``page``, ``iter``): each page is one short query, so a long
listing holds neither memory nor a read transaction that would keep writers waiting.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from ..core.state import RESUMABLE, TERMINAL, JobState, sources_of
from ..errors import JobNotFound, StoreError
from .engine import Engine, Tx
from .keys import ACTIVE, decode_cursor, encode_cursor, prefix_range
from .keys import scope as _scope
from .records import COLUMNS, JobRecord, Page, from_row
from .sqlite import SqliteEngine

if TYPE_CHECKING:
    import sqlite3

    from .leases import LeaseTable
    from .secrets import SecretTable
    from .sweeps import SweepTable
    from .teams import ProjectTable
    from .users import UserTable

# 8 hex digits: short to type and read; collisions are excluded by checking (``new_id``), not
# made unlikely by length.
ID_BYTES = 4
PAGE = 500  # rows per query when a listing is iterated
_SELECT = ", ".join(COLUMNS)


class Store:
    """Open (creating and migrating if needed) the store at ``where``: a SQLite file's path, or
    a ``postgresql://`` URL (``options``: ``retry_for``, ``pool_size``; see ``postgres.py``).
    ``open_store`` picks the one the settings name."""

    def __init__(self, where: Path | str, **options: Any) -> None:
        self.engine: Engine = open_engine(where, **options)
        self.where = self.engine.where  # for messages: never holds a password
        self.engine.migrate()

    @property
    def _conn(self) -> "sqlite3.Connection":
        """The SQLite connection (tests trace its statements; benchmarks fill stores through it)."""
        return self.engine.conn  # type: ignore[attr-defined, no-any-return]

    def close(self) -> None:
        self.engine.close()

    def _write(self, sql: str, params: Iterable[Any] = ()) -> int:
        return self.engine.write(sql, tuple(params))

    # -- writes -----------------------------------------------------------------

    def new_id(self) -> str:
        """A job or sweep id no job or sweep of this store ever had: random, and checked.

        The id is recorded (table ``ids``) in the same statement that checks it, so two
        processes can never be handed the same one; a taken id is drawn again. An id handed
        out but never used (a dry run, a submit that failed) stays taken.
        """
        for _ in range(64):  # even a store holding half of all ids finds a free one at once
            candidate = secrets.token_hex(ID_BYTES)
            if self._write("INSERT INTO ids (id) VALUES (?) ON CONFLICT DO NOTHING", [candidate]) == 1:
                return candidate
        raise StoreError(f"no free job id found in the store {self.where}", "move the store aside to start a new one")

    def insert_job(self, then: Callable[[], None] | None = None, undo: Callable[[], None] | None = None,
                   **fields: Any) -> None:
        """Insert a job's row; ``then`` (moving its directory into place) runs inside the same
        transaction, which commits only once it returned: a failure of either leaves neither.
        ``undo`` reverses ``then`` when the commit then fails (on PostgreSQL the transaction is
        then tried again, ``then`` included; a commit whose answer a broken connection lost
        counts as done when the row is there)."""
        fields.setdefault("created_at", time.time())
        fields.setdefault("state", JobState.PENDING.value)
        sql = f"INSERT INTO jobs ({', '.join(fields)}) VALUES ({', '.join('?' for _ in fields)})"
        values = tuple(fields.values())

        def insert(tx: Tx) -> None:
            tx.execute(sql, values)
            if then is not None:
                then()

        def there(tx: Tx) -> bool:
            return bool(tx.rows("SELECT 1 FROM jobs WHERE id = ?", [fields["id"]]))

        self.engine.atomic(insert, retry=then is None or undo is not None, undo=undo, committed=there)

    def insert_jobs(self, rows: Iterable[dict[str, Any]]) -> int:
        """Insert many jobs in one transaction (imports, benchmarks); every row has the same
        keys. All or nothing; returns how many."""
        it = iter(rows)
        first = next(it, None)
        if first is None:
            return 0
        cols = list(first)
        return self.engine.insert_many("jobs", cols, (tuple(r[c] for c in cols) for r in _chain(first, it)))

    def update(self, job_id: str, **fields: Any) -> None:
        """Set non-state fields (pid, attempt, ...)."""
        assert "state" not in fields, "use transition() for state changes"
        sets = ", ".join(f"{k} = ?" for k in fields)
        self._write(f"UPDATE jobs SET {sets} WHERE id = ?", [*fields.values(), job_id])

    def transition(self, job_id: str, new: JobState, **fields: Any) -> bool:
        """Move to ``new`` if the state machine allows it from the current state.

        Atomic compare-and-set; returns False (and changes nothing) when the job is already
        in a state that cannot move to ``new`` (e.g. terminal).
        """
        return self._transition("jobs", job_id, new, fields)

    def _transition(self, table: str, row_id: str, new: JobState, fields: dict[str, Any]) -> bool:
        sources = [s.value for s in sources_of(new)]
        if not sources:
            return False
        if new in TERMINAL:
            fields.setdefault("ended_at", time.time())
        elif new is JobState.RUNNING:
            fields.setdefault("started_at", time.time())
        sets = ", ".join(["state = ?", *(f"{k} = ?" for k in fields)])
        marks = ", ".join("?" for _ in sources)
        changed = self._write(
            f"UPDATE {table} SET {sets} WHERE id = ? AND state IN ({marks})",
            [new.value, *fields.values(), row_id, *sources],
        )
        return changed == 1

    @property
    def sweeps(self) -> "SweepTable":
        from .sweeps import SweepTable

        return SweepTable(self)

    @property
    def leases(self) -> "LeaseTable":
        from .leases import LeaseTable

        return LeaseTable(self.engine)

    @property
    def users(self) -> "UserTable":
        from .users import UserTable

        return UserTable(self)

    @property
    def projects(self) -> "ProjectTable":
        from .teams import ProjectTable

        return ProjectTable(self)

    @property
    def secrets(self) -> "SecretTable":
        from .secrets import SecretTable

        return SecretTable(self)

    def trials(self, sweep_id: str) -> list[JobRecord]:
        """A sweep's trial jobs, in trial order."""
        return self._rows("WHERE sweep_id = ? ORDER BY trial, created_at", [sweep_id])

    def reopen(self, job_id: str, attempt: int, **fields: Any) -> bool:
        """``resume``: move a resumable job back to PENDING for ``attempt``. Compare-and-set."""
        marks = ", ".join("?" for _ in RESUMABLE)
        changed = self._write(
            "UPDATE jobs SET state = ?, attempt = ?, ended_at = NULL, exit_code = NULL, root_cause = NULL,"
            " retries = 0, supervisor_pid = ?, supervisor_started = ?, supervisor_host = ?, admitted_at = NULL"
            f" WHERE id = ? AND state IN ({marks})",
            [JobState.PENDING.value, attempt, fields.get("supervisor_pid"), fields.get("supervisor_started"),
             fields.get("supervisor_host"), job_id, *(s.value for s in RESUMABLE)],
        )
        return changed == 1

    # -- reads ------------------------------------------------------------------

    def _rows(self, sql: str, params: Iterable[Any] = ()) -> list[JobRecord]:
        return [from_row(row) for row in self.engine.rows(f"SELECT {_SELECT} FROM jobs {sql}", tuple(params))]

    def get(self, job_id: str) -> JobRecord:
        rows = self._rows("WHERE id = ?", [job_id])
        if not rows:
            raise JobNotFound(f"no job '{job_id}'", "list jobs with: phalanx ps --all")
        return rows[0]

    def find(self, ref: str, projects: Sequence[str] | None = None) -> JobRecord:
        """A job by exact id, unique id prefix, or name (the latest job with that name).
        ``projects``: only jobs of these projects exist for this lookup (a principal's, see
        ``core/identity.py``): the condition is part of each query, so a job of another project
        is never read, counted in an ambiguity, or told apart from one that does not exist."""
        scope, args = _scope(projects)
        exact = self._rows(f"WHERE id = ?{scope}", [ref, *args])
        if exact:
            return exact[0]
        by_prefix = self._by_prefix(ref, scope, args)
        if len(by_prefix) == 1:
            return by_prefix[0]
        if len(by_prefix) > 1:
            raise JobNotFound(f"job id prefix '{ref}' is ambiguous", "type more characters of the id")
        by_name = self._rows(f"WHERE name = ?{scope} ORDER BY created_at DESC LIMIT 1", [ref, *args])
        if by_name:
            return by_name[0]
        raise JobNotFound(f"no job with id or name '{ref}'", "list jobs with: phalanx ps --all")

    def _by_prefix(self, ref: str, scope: str = "", args: Sequence[Any] = ()) -> list[JobRecord]:
        """At most two jobs whose id starts with ``ref``; ``3F2A`` finds ``3f2a...`` as well
        (ids are lower case, and the LIKE this range replaced ignored case)."""
        for text in dict.fromkeys((ref, ref.lower())):
            low, high = prefix_range(text)
            rows = self._rows(f"WHERE id >= ? AND id < ?{scope} LIMIT 2", [low, high, *args])
            if rows:
                return rows
        return []

    def latest(self, name: str, state: JobState | None = None, trials: bool = False) -> JobRecord | None:
        """The newest job named ``name`` (in ``state`` if given; a sweep's trials count only
        with ``trials=True``), or None."""
        clauses, params = ["name = ?"], [name]
        if not trials:
            clauses.append("sweep_id IS NULL")
        if state is not None:
            clauses.append("state = ?")
            params.append(state.value)
        rows = self._rows(f"WHERE {' AND '.join(clauses)} ORDER BY created_at DESC LIMIT 1", params)
        return rows[0] if rows else None

    def explain(self, sql: str, params: Iterable[Any] = ()) -> list[str]:
        """The engine's plan for a read of this store (what tests pin)."""
        return self.engine.explain(sql, tuple(params))

    def page(self, limit: int = 50, after: str | None = None, active_only: bool = False,
             trials: bool = False) -> Page:
        """Jobs newest first, ``limit`` at a time: ``after`` is the ``next`` cursor of the
        previous page (keyset paging: every page costs the same, however deep)."""
        where, params = _listing(active_only, trials)
        if after is not None:
            where.append("(created_at, id) < (?, ?)")
            params.extend(decode_cursor(after))
        sql = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._rows(f"{sql} ORDER BY created_at DESC, id DESC LIMIT ?", [*params, limit + 1])
        more = len(rows) > limit
        rows = rows[:limit]
        return Page(rows, encode_cursor(rows[-1].created_at, rows[-1].id) if more else None)

    def iter(self, active_only: bool = False, limit: int | None = None, trials: bool = False) -> Iterator[JobRecord]:
        """Like ``list``, one page at a time: memory stays flat however many jobs there are."""
        after: str | None = None
        left = limit
        while left is None or left > 0:
            page = self.page(PAGE if left is None else min(PAGE, left), after, active_only, trials)
            yield from page.records
            if page.next is None:
                return
            after = page.next
            if left is not None:
                left -= len(page.records)

    def list(self, active_only: bool = False, limit: int | None = None, trials: bool = False) -> list[JobRecord]:
        """Jobs, newest first; a sweep's trials only with ``trials=True`` (the sweep is listed instead)."""
        return list(self.iter(active_only, limit or None, trials))

    def count(self) -> int:
        row = self.engine.row("SELECT COUNT(*) FROM jobs")
        return int(row[0]) if row else 0


def is_url(where: str | Path) -> bool:
    return isinstance(where, str) and where.split(":", 1)[0].lower() in ("postgresql", "postgres")


def open_engine(where: str | Path, **options: Any) -> Engine:
    """SQLite for a path (or ``sqlite:///path``), PostgreSQL for a ``postgresql://`` URL."""
    if is_url(where):
        from .postgres import connect

        return connect(str(where), **options)
    if isinstance(where, str) and where.startswith("sqlite://"):
        where = where[len("sqlite://"):]
    if isinstance(where, Path):
        return SqliteEngine(where)
    if "://" in where:
        raise StoreError(f"unknown job store '{where.split('://', 1)[0]}://...'",
                         "use a path, sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE")
    return SqliteEngine(Path(where).expanduser())


def _listing(active_only: bool, trials: bool) -> tuple[list[str], list[Any]]:
    """WHERE terms of a listing. Active states are named (IN), not terminal ones excluded (NOT
    IN): an IN seeks the few active rows in the state index; a NOT IN reads every row."""
    where: list[str] = [] if trials else ["sweep_id IS NULL"]
    params: list[Any] = []
    if active_only:
        where.append(f"state IN ({', '.join('?' for _ in ACTIVE)})")
        params.extend(ACTIVE)
    return where, params


def _chain(first: dict[str, Any], rest: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield first
    yield from rest
