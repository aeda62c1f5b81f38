"""Store: the index of jobs and their summaries. Bulk data stays in the job directories.

Concurrency: every process that writes (CLI, supervisors) opens its own connection;
SQLite's WAL mode gives readers a consistent snapshot while one writer commits, and
``busy_timeout`` serialises writers. State changes are compare-and-set
(``transition``), so a stop racing a finish cannot overwrite a terminal state.

Scale: every read the CLI makes costs the same at a thousand jobs and at a million (an index
seek, then the rows it returns; ``tests/unit/test_store_plans.py`` pins the plans). Listings
page by key (``page``, ``iter``): each page is one short query, so a long listing holds
neither memory nor a read transaction that would keep writers waiting.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from ..core.state import RESUMABLE, TERMINAL, JobState, sources_of
from ..errors import JobNotFound, StoreError
from .keys import ACTIVE, decode_cursor, encode_cursor, prefix_range
from .keys import scope as _scope
from .migrations import MIGRATIONS
from .records import COLUMNS, JobRecord, Page, from_row
from .sql import TextConnection

if TYPE_CHECKING:
    from .sweeps import SweepTable
    from .teams import ProjectTable
    from .users import UserTable

# 8 hex digits: short to type and read; collisions are excluded by checking (``new_id``), not
# made unlikely by length.
ID_BYTES = 4
PAGE = 500  # rows per query when a listing is iterated


class Store:
    """Open (creating and migrating if needed) the store at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = self._open_writable()
        except sqlite3.DatabaseError as exc:
            self._conn = self._read_only(exc)
        self._lock = threading.Lock()
        self._migrate()

    def _open_writable(self) -> sqlite3.Connection:
        """A connection in WAL mode. Setting the journal mode does not wait on SQLite's busy
        handler while another connection creates the store or switches it to WAL (two processes, or
        a supervisor thread and a reader, opening a new home at once): "database is locked" then
        means "try again shortly", for as long as a write would wait."""
        deadline = time.monotonic() + 30
        while True:
            conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None, check_same_thread=False,
                                   factory=TextConnection)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA busy_timeout=30000")
                return conn
            except sqlite3.OperationalError as exc:
                conn.close()
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
            except BaseException:
                conn.close()
                raise

    def _read_only(self, exc: sqlite3.DatabaseError) -> sqlite3.Connection:
        """A store on a read-only filesystem or directory (a shared, mounted home), or on a full
        disk: SQLite cannot create the WAL's ``-shm`` beside it (no connection has it open, so
        nobody writes), so it is opened ``immutable`` (SQLite's URI option for read-only media):
        reads work, every write is refused in words (``write_error``)."""
        from ..core.disk import free_bytes

        full = (free_bytes(self.path.parent) or 0) < 64 * 1024
        self._full_at_open = full
        if not self.path.exists() or (os.access(self.path.parent, os.W_OK) and not full):
            raise StoreError(f"cannot open the job store {self.path}: {exc}", "move the file aside to start a new store") from None
        try:
            return sqlite3.connect(f"{self.path.resolve().as_uri()}?immutable=1", uri=True, isolation_level=None,
                                   check_same_thread=False, factory=TextConnection)
        except sqlite3.DatabaseError as again:
            raise StoreError(f"cannot open the read-only job store {self.path}: {again}",
                             "check the file, or set PHALANX_HOME to another store") from None

    def close(self) -> None:
        self._conn.close()

    def _migrate(self) -> None:
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise StoreError(
                f"the job store {self.path} has schema {version}, newer than this phalanx knows ({len(MIGRATIONS)})",
                "upgrade phalanx",
            )
        if version == len(MIGRATIONS):
            return
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                # Re-read inside the write lock: another process may have migrated meanwhile.
                version = self._conn.execute("PRAGMA user_version").fetchone()[0]
                for number in range(version, len(MIGRATIONS)):
                    for statement in _statements(MIGRATIONS[number]):
                        self._conn.execute(statement)
                    self._conn.execute(f"PRAGMA user_version = {number + 1}")
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def _write(self, sql: str, params: Iterable[Any] = ()) -> int:
        with self._lock:
            try:
                cur = self._conn.execute(sql, tuple(params))
            except sqlite3.OperationalError as exc:
                raise self.write_error(exc) from exc
            return cur.rowcount

    def write_error(self, exc: sqlite3.OperationalError) -> Exception:
        """A refused write in words: the disk is full, or the store is read-only (a shared,
        mounted store: reads work, writes need a home of one's own). Anything else as it was."""
        from ..core.disk import as_disk_full, is_full

        if is_full(exc) or getattr(self, "_full_at_open", False):
            return as_disk_full(exc, f"the job store ({self.path.name})", self.path.parent)
        if "readonly" in str(exc) or "read-only" in str(exc):
            return StoreError(f"the job store {self.path} is read-only, so this command cannot record anything "
                              "(ps, status and logs work)",
                              "run it where the store is writable, or set PHALANX_HOME to a writable directory")
        return exc

    # -- writes -----------------------------------------------------------------

    def new_id(self) -> str:
        """A job or sweep id no job or sweep of this store ever had: random, and checked.

        The id is recorded (table ``ids``) in the same statement that checks it, so two
        processes can never be handed the same one; a taken id is drawn again. An id handed
        out but never used (a dry run, a submit that failed) stays taken.
        """
        for _ in range(64):  # even a store holding half of all ids finds a free one at once
            candidate = secrets.token_hex(ID_BYTES)
            try:
                self._write("INSERT INTO ids (id) VALUES (?)", [candidate])
                return candidate
            except sqlite3.IntegrityError:
                continue
        raise StoreError(f"no free job id found in the store {self.path}", "move the store aside to start a new one")

    def insert_job(self, then: Callable[[], None] | None = None, **fields: Any) -> None:
        """Insert a job's row; ``then`` (moving its directory into place) runs inside the same
        transaction, which commits only once it returned: a failure of either leaves neither."""
        fields.setdefault("created_at", time.time())
        fields.setdefault("state", JobState.PENDING.value)
        cols = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    self._conn.execute(f"INSERT INTO jobs ({cols}) VALUES ({marks})", tuple(fields.values()))
                    if then is not None:
                        then()
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:  # SQLite may have rolled back itself (disk full)
                        self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:
                raise self.write_error(exc) from exc

    def insert_jobs(self, rows: Iterable[dict[str, Any]]) -> int:
        """Insert many jobs in one transaction (imports, benchmarks); every row has the same
        keys. All or nothing; returns how many."""
        it = iter(rows)
        first = next(it, None)
        if first is None:
            return 0
        cols = list(first)
        sql = f"INSERT INTO jobs ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                cur = self._conn.executemany(sql, (tuple(r[c] for c in cols) for r in _chain(first, it)))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return cur.rowcount

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
    def users(self) -> "UserTable":
        from .users import UserTable

        return UserTable(self)

    @property
    def projects(self) -> "ProjectTable":
        from .teams import ProjectTable

        return ProjectTable(self)

    def trials(self, sweep_id: str) -> list[JobRecord]:
        """A sweep's trial jobs, in trial order."""
        return self._rows("WHERE sweep_id = ? ORDER BY trial, created_at", [sweep_id])

    def reopen(self, job_id: str, attempt: int, **fields: Any) -> bool:
        """``resume``: move a resumable job back to PENDING for ``attempt``. Compare-and-set."""
        marks = ", ".join("?" for _ in RESUMABLE)
        changed = self._write(
            "UPDATE jobs SET state = ?, attempt = ?, ended_at = NULL, exit_code = NULL, root_cause = NULL,"
            " retries = 0, supervisor_pid = ?, supervisor_started = ?, admitted_at = NULL"
            f" WHERE id = ? AND state IN ({marks})",
            [JobState.PENDING.value, attempt, fields.get("supervisor_pid"), fields.get("supervisor_started"),
             job_id, *(s.value for s in RESUMABLE)],
        )
        return changed == 1

    # -- reads ------------------------------------------------------------------

    def _rows(self, sql: str, params: Iterable[Any] = ()) -> list[JobRecord]:
        cur = self._conn.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs {sql}", tuple(params))
        return [from_row(row) for row in cur.fetchall()]

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
        """SQLite's plan for a read of this store (what tests pin)."""
        return [row[3] for row in self._conn.execute(f"EXPLAIN QUERY PLAN {sql}", tuple(params))]

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
        return int(self._conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])


def _listing(active_only: bool, trials: bool) -> tuple[list[str], list[Any]]:
    """WHERE terms of a listing. Active states are named (IN), not terminal ones excluded (NOT
    IN): an IN seeks the few active rows in the state index; a NOT IN reads every row."""
    where: list[str] = [] if trials else ["sweep_id IS NULL"]
    params: list[Any] = []
    if active_only:
        where.append(f"state IN ({', '.join('?' for _ in ACTIVE)})")
        params.extend(ACTIVE)
    return where, params


def _statements(script: str) -> Iterator[str]:
    """The statements of a migration script; ``;`` inside a trigger's body does not end one."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.replace(";", "").strip():
                yield pending
            pending = ""
    if pending.replace(";", "").strip():
        raise StoreError("a store migration ends inside a statement", "this is a bug in phalanx: report it")


def _chain(first: dict[str, Any], rest: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield first
    yield from rest
