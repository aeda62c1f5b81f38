"""Sweep rows: one per sweep, with counters and the best trial kept up to date incrementally,
so listing a sweep of 1,000 trials costs the same as listing one of 10."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Sequence

from ..core.state import RESUMABLE, JobState
from ..errors import JobNotFound
from .keys import ACTIVE, prefix_range
from .keys import scope as in_projects
from .sql import Writer

if TYPE_CHECKING:
    from ..core.spec import JobSpec

_COLUMNS = (
    "id name state strategy objective direction total launched finished failed pruned best_job best_value "
    "best_params command topology spec_json settings_json sweep_dir created_at started_at ended_at "
    "supervisor_pid supervisor_started user_name project priority supervisor_host lease_holder lease_expires"
).split()


@dataclass(frozen=True)
class SweepRecord:
    id: str
    name: str
    state: JobState
    strategy: str
    objective: str | None
    direction: str | None
    total: int | None
    launched: int
    finished: int
    failed: int
    pruned: int
    best_job: str | None
    best_value: float | None
    best_params: str | None
    command: str
    topology: str
    spec_json: str
    settings_json: str
    sweep_dir: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    supervisor_pid: int | None
    supervisor_started: float | None
    user_name: str | None = None  # who submitted it
    project: str = "default"
    priority: int = 0  # its trials' (--priority)
    supervisor_host: str | None = None  # the machine its runner runs on (None: this one, or from before)
    lease_holder: str | None = None  # the team server's replica answering for it (``store/leases.py``)
    lease_expires: float | None = None

    @property
    def progress(self) -> str:
        return f"{self.finished}/{self.total if self.total is not None else '?'}"

    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at

    @cached_property
    def spec(self) -> "JobSpec":
        """The spec its trials are made from, parsed once per record."""
        from ..core.spec import JobSpec

        return JobSpec.from_dict(json.loads(self.spec_json))

    def to_dict(self) -> dict[str, Any]:
        data = {c: getattr(self, c) for c in _COLUMNS
                if c not in ("spec_json", "settings_json", "best_params", "lease_holder", "lease_expires")}
        data["state"] = self.state.value
        data["best_params"] = json.loads(self.best_params) if self.best_params else None
        data["settings"] = json.loads(self.settings_json)
        data["progress"] = self.progress
        return data


def sweep_from_row(row: tuple[Any, ...]) -> SweepRecord:
    data = dict(zip(_COLUMNS, row))
    data["state"] = JobState(data["state"])
    return SweepRecord(**data)


class SweepTable:
    def __init__(self, store: Writer) -> None:
        self._store = store

    def insert(self, **fields: Any) -> None:
        fields.setdefault("created_at", time.time())
        fields.setdefault("state", JobState.PENDING.value)
        cols = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        self._store._write(f"INSERT INTO sweeps ({cols}) VALUES ({marks})", fields.values())

    def update(self, sweep_id: str, **fields: Any) -> None:
        sets = ", ".join(f"{k} = ?" for k in fields)
        self._store._write(f"UPDATE sweeps SET {sets} WHERE id = ?", [*fields.values(), sweep_id])

    def count(self, sweep_id: str, column: str, by: int = 1) -> None:
        """Add to a counter column (launched, finished, failed, pruned) in place."""
        assert column in ("launched", "finished", "failed", "pruned")
        self._store._write(f"UPDATE sweeps SET {column} = {column} + ? WHERE id = ?", [by, sweep_id])

    def transition(self, sweep_id: str, new: JobState, **fields: Any) -> bool:
        return self._store._transition("sweeps", sweep_id, new, fields)

    def reopen(self, sweep_id: str, **fields: Any) -> bool:
        marks = ", ".join("?" for _ in RESUMABLE)
        sets = ", ".join(["state = ?", "ended_at = NULL", *(f"{k} = ?" for k in fields)])
        changed = self._store._write(
            f"UPDATE sweeps SET {sets} WHERE id = ? AND state IN ({marks})",
            [JobState.PENDING.value, *fields.values(), sweep_id, *(s.value for s in RESUMABLE)],
        )
        return changed == 1

    def _rows(self, sql: str, params: list[Any]) -> list[SweepRecord]:
        out = []
        for row in self._store.engine.rows(f"SELECT {', '.join(_COLUMNS)} FROM sweeps {sql}", tuple(params)):
            out.append(sweep_from_row(row))
        return out

    def get(self, sweep_id: str) -> SweepRecord:
        rows = self._rows("WHERE id = ?", [sweep_id])
        if not rows:
            raise JobNotFound(f"no sweep '{sweep_id}'", "list sweeps with: phalanx ps --all")
        return rows[0]

    def find(self, ref: str, projects: Sequence[str] | None = None) -> SweepRecord | None:
        """By id, unique id prefix, or name (latest); None when nothing matches. ``projects``:
        only sweeps of these exist for the lookup (as ``Store.find``)."""
        scope, extra = in_projects(projects)
        low, high = prefix_range(ref)
        for sql, args in (("WHERE id = ?", [ref]), ("WHERE id >= ? AND id < ?", [low, high]),
                          ("WHERE name = ?", [ref])):
            rows = self._rows(f"{sql}{scope} ORDER BY created_at DESC LIMIT 2", [*args, *extra])
            if len(rows) == 1 or (rows and sql.startswith("WHERE name")):
                return rows[0]
            if len(rows) > 1:
                raise JobNotFound(f"sweep id prefix '{ref}' is ambiguous", "type more characters of the id")
        return None

    def list(self, active_only: bool = False, limit: int | None = None) -> list[SweepRecord]:
        where, params = "", []
        if active_only:
            where = f"WHERE state IN ({', '.join('?' for _ in ACTIVE)})"
            params = list(ACTIVE)
        sql = f"{where} ORDER BY created_at DESC" + (" LIMIT ?" if limit else "")
        return self._rows(sql, [*params, limit] if limit else params)
