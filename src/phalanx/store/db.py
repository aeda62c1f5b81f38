"""Store: the index of jobs and their summaries. Bulk data stays in the job directories.

Concurrency: every process that writes (CLI, supervisors) opens its own connection;
SQLite's WAL mode gives readers a consistent snapshot while one writer commits, and
``busy_timeout`` serialises writers. State changes are compare-and-set
(``transition``), so a stop racing a finish cannot overwrite a terminal state.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from ..core.state import RESUMABLE, TERMINAL, JobState, sources_of
from ..errors import JobNotFound, StoreError
from .migrations import MIGRATIONS
from .sql import like_prefix as _like_prefix

if TYPE_CHECKING:  # imported where used: `phalanx --help` and `ps` need neither
    from ..core.paths import JobPaths
    from ..core.spec import JobSpec
    from .sweeps import SweepTable

_COLUMNS = (
    "id name state backend nnodes nproc_per_node command job_dir spec_json created_at "
    "started_at ended_at exit_code attempt supervisor_pid supervisor_started root_cause state_synced_at retries "
    "sweep_id trial params_json objective"
).split()


@dataclass(frozen=True)
class JobRecord:
    id: str
    name: str
    state: JobState
    backend: str
    nnodes: int
    nproc_per_node: int
    command: str
    job_dir: str
    spec_json: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    attempt: int
    supervisor_pid: int | None
    supervisor_started: float | None
    root_cause: str | None
    state_synced_at: float | None = None
    retries: int = 0
    sweep_id: str | None = None
    trial: int | None = None
    params_json: str | None = None
    objective: float | None = None

    @property
    def topology(self) -> str:
        return f"{self.nnodes}x{self.nproc_per_node}"

    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at

    def root_cause_dict(self) -> dict[str, Any] | None:
        return json.loads(self.root_cause) if self.root_cause else None

    @cached_property
    def spec(self) -> "JobSpec":
        """The job's spec, parsed once per record (the one way to get it from a record)."""
        from ..core.spec import JobSpec

        return JobSpec.from_dict(json.loads(self.spec_json))

    @property
    def paths(self) -> "JobPaths":
        from ..core.paths import JobPaths

        return JobPaths(Path(self.job_dir))

    def to_dict(self) -> dict[str, Any]:
        data = {c: getattr(self, c) for c in _COLUMNS if c not in ("spec_json", "root_cause")}
        data["state"] = self.state.value
        data["topology"] = self.topology
        data["root_cause"] = self.root_cause_dict()
        data["params"] = json.loads(self.params_json) if self.params_json else None
        del data["params_json"]
        return data


class Store:
    """Open (creating and migrating if needed) the store at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA busy_timeout=30000")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open the job store {path}: {exc}", "move the file aside to start a new store") from None
        self._lock = threading.Lock()
        self._migrate()

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
                    for statement in MIGRATIONS[number].split(";"):
                        if statement.strip():
                            self._conn.execute(statement)
                    self._conn.execute(f"PRAGMA user_version = {number + 1}")
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def _write(self, sql: str, params: Iterable[Any] = ()) -> int:
        with self._lock:
            cur = self._conn.execute(sql, tuple(params))
            return cur.rowcount

    # -- writes -----------------------------------------------------------------

    def insert_job(self, **fields: Any) -> None:
        fields.setdefault("created_at", time.time())
        fields.setdefault("state", JobState.PENDING.value)
        cols = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        self._write(f"INSERT INTO jobs ({cols}) VALUES ({marks})", fields.values())

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

    def trials(self, sweep_id: str) -> list[JobRecord]:
        """A sweep's trial jobs, in trial order."""
        return self._rows("WHERE sweep_id = ? ORDER BY trial, created_at", [sweep_id])

    def reopen(self, job_id: str, attempt: int, **fields: Any) -> bool:
        """``resume``: move a resumable job back to PENDING for ``attempt``. Compare-and-set."""
        marks = ", ".join("?" for _ in RESUMABLE)
        changed = self._write(
            "UPDATE jobs SET state = ?, attempt = ?, ended_at = NULL, exit_code = NULL, root_cause = NULL,"
            " retries = 0, supervisor_pid = ?, supervisor_started = ?"
            f" WHERE id = ? AND state IN ({marks})",
            [JobState.PENDING.value, attempt, fields.get("supervisor_pid"), fields.get("supervisor_started"),
             job_id, *(s.value for s in RESUMABLE)],
        )
        return changed == 1

    # -- reads ------------------------------------------------------------------

    def _rows(self, sql: str, params: Iterable[Any] = ()) -> list[JobRecord]:
        cur = self._conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs {sql}", tuple(params))
        return [_record(row) for row in cur.fetchall()]

    def get(self, job_id: str) -> JobRecord:
        rows = self._rows("WHERE id = ?", [job_id])
        if not rows:
            raise JobNotFound(f"no job '{job_id}'", "list jobs with: phalanx ps --all")
        return rows[0]

    def find(self, ref: str) -> JobRecord:
        """A job by exact id, unique id prefix, or name (the latest job with that name)."""
        exact = self._rows("WHERE id = ?", [ref])
        if exact:
            return exact[0]
        by_prefix = self._rows("WHERE id LIKE ? ESCAPE '\\' ORDER BY created_at DESC LIMIT 2", [_like_prefix(ref)])
        if len(by_prefix) == 1:
            return by_prefix[0]
        if len(by_prefix) > 1:
            raise JobNotFound(f"job id prefix '{ref}' is ambiguous", "type more characters of the id")
        by_name = self._rows("WHERE name = ? ORDER BY created_at DESC LIMIT 1", [ref])
        if by_name:
            return by_name[0]
        raise JobNotFound(f"no job with id or name '{ref}'", "list jobs with: phalanx ps --all")

    def list(self, active_only: bool = False, limit: int | None = None, trials: bool = False) -> list[JobRecord]:
        """Jobs, newest first; a sweep's trials only with ``trials=True`` (the sweep is listed instead)."""
        clauses = [] if trials else ["sweep_id IS NULL"]
        params: list[Any] = []
        if active_only:
            marks = ", ".join("?" for _ in TERMINAL)
            clauses.append(f"state NOT IN ({marks})")
            params = [s.value for s in TERMINAL]
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"{where} ORDER BY created_at DESC"
        if limit:
            sql += " LIMIT ?"
            params.append(limit)
        return self._rows(sql, params)

    def count(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])


def _record(row: tuple[Any, ...]) -> JobRecord:
    data = dict(zip(_COLUMNS, row))
    data["state"] = JobState(data["state"])
    return JobRecord(**data)
