"""Leases of the jobs and sweeps a team server's replicas supervise (migrations 9 and 11): the
row's ``lease_holder`` (a replica's id) and ``lease_expires`` (a unix time). A sweep's trials carry
their sweep's lease (its runner stamps it on them, ``stamp_trials``) and are adopted with it,
never on their own. The SQL only; what a
replica does with a lease (renew it, take an expired one over, adopt the job) is
``server/replica.py``'s.

Every change is one statement and a compare-and-set where two replicas may race: ``take``
moves a lease only while it is expired, so of two replicas reaching for one job exactly one
gets it; ``claim_start`` records a new supervisor only over the identity it replaces.
"""

from __future__ import annotations

import time

from .engine import Engine
from .keys import ACTIVE
from .records import COLUMNS, JobRecord, from_row
from .sweeps import SweepRecord, sweep_from_row
from .sweeps import _COLUMNS as SWEEP_COLUMNS

_ACTIVE = ", ".join("?" for _ in ACTIVE)
_SELECT = ", ".join(COLUMNS)
_SWEEP_SELECT = ", ".join(SWEEP_COLUMNS)
_TABLES = ("jobs", "sweeps")


class LeaseTable:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def _write(self, sql: str, params: list[object]) -> int:
        return self._engine.write(sql, tuple(params))

    def renew(self, holder: str, ttl: float, now: float | None = None) -> int:
        """Extend ``holder``'s leases of jobs and sweeps still running by ``ttl`` seconds, and
        release its leases of those that ended; returns how many jobs it still holds."""
        now = time.time() if now is None else now
        held = 0
        for table in _TABLES:
            count = self._write(f"UPDATE {table} SET lease_expires = ? WHERE lease_holder = ? AND state IN ({_ACTIVE})",
                                [now + ttl, holder, *ACTIVE])
            held = count if table == "jobs" else held
            self._write(f"UPDATE {table} SET lease_holder = NULL, lease_expires = NULL WHERE lease_holder = ? "
                        f"AND state NOT IN ({_ACTIVE})", [holder, *ACTIVE])
        return held

    def renew_own(self, row_id: str, host: str, ttl: float, table: str = "jobs", now: float | None = None) -> bool:
        """A supervisor (a sweep's runner) keeps its own row's lease while a replica of its
        machine (``host``) holds it, so that its replica's death alone does not let one elsewhere
        take it over; False once the lease is gone or held elsewhere."""
        assert table in _TABLES
        now = time.time() if now is None else now
        return self._write(f"UPDATE {table} SET lease_expires = ? WHERE id = ? AND substr(lease_holder, 1, ?) = ? "
                           f"AND state IN ({_ACTIVE})", [now + ttl, row_id, len(host) + 1, host + "/", *ACTIVE]) == 1

    def stamp_trials(self, sweep_id: str, holder: str, expires: float) -> int:
        """A sweep's running trials carry its lease (its runner supervises them)."""
        return self._write(f"UPDATE jobs SET lease_holder = ?, lease_expires = ? WHERE sweep_id = ? AND state IN ({_ACTIVE})",
                           [holder, expires, sweep_id, *ACTIVE])

    def hold(self, job_id: str, holder: str, ttl: float, table: str = "jobs") -> None:
        """``holder`` supervises ``job_id`` from now on (a resume started its supervisor)."""
        assert table in _TABLES
        self._write(f"UPDATE {table} SET lease_holder = ?, lease_expires = ? WHERE id = ?", [holder, time.time() + ttl, job_id])

    def expired(self, now: float | None = None, limit: int = 100) -> list[tuple[JobRecord, str]]:
        """Jobs still running whose lease has expired (their holder stopped renewing it), oldest
        expiry first, with the holder that let it lapse. Not trials: their sweep's are."""
        now = time.time() if now is None else now
        rows = self._engine.rows(
            f"SELECT {_SELECT}, lease_holder FROM jobs WHERE lease_holder IS NOT NULL AND lease_expires < ? "
            f"AND state IN ({_ACTIVE}) AND sweep_id IS NULL ORDER BY lease_expires LIMIT ?", (now, *ACTIVE, limit))
        return [(from_row(row[:-1]), str(row[-1])) for row in rows]

    def expired_sweeps(self, now: float | None = None, limit: int = 100) -> list[tuple[SweepRecord, str]]:
        """``expired`` for sweeps."""
        now = time.time() if now is None else now
        rows = self._engine.rows(
            f"SELECT {_SWEEP_SELECT}, lease_holder FROM sweeps WHERE lease_holder IS NOT NULL AND lease_expires < ? "
            f"AND state IN ({_ACTIVE}) ORDER BY lease_expires LIMIT ?", (now, *ACTIVE, limit))
        return [(sweep_from_row(row[:-1]), str(row[-1])) for row in rows]

    def held(self, holder: str) -> list[JobRecord]:
        """The jobs still running under ``holder``'s leases (not trials: their sweep's)."""
        rows = self._engine.rows(f"SELECT {_SELECT} FROM jobs WHERE lease_holder = ? AND state IN ({_ACTIVE}) "
                                 "AND sweep_id IS NULL", (holder, *ACTIVE))
        return [from_row(row) for row in rows]

    def held_sweeps(self, holder: str) -> list[SweepRecord]:
        """The sweeps still running under ``holder``'s leases."""
        rows = self._engine.rows(f"SELECT {_SWEEP_SELECT} FROM sweeps WHERE lease_holder = ? AND state IN ({_ACTIVE})",
                                 (holder, *ACTIVE))
        return [sweep_from_row(row) for row in rows]

    def release_ended(self, now: float | None = None) -> int:
        """Drop the expired leases of jobs and sweeps that ended (their holder died before
        releasing them)."""
        now = time.time() if now is None else now
        return sum(self._write(f"UPDATE {table} SET lease_holder = NULL, lease_expires = NULL WHERE lease_holder IS NOT NULL "
                               f"AND lease_expires < ? AND state NOT IN ({_ACTIVE})", [now, *ACTIVE]) for table in _TABLES)

    def take(self, row_id: str, holder: str, ttl: float, now: float | None = None, table: str = "jobs") -> bool:
        """Take ``row_id``'s lease over if it is still expired (compare-and-set: of replicas
        racing for it, one wins)."""
        assert table in _TABLES
        now = time.time() if now is None else now
        return self._write(f"UPDATE {table} SET lease_holder = ?, lease_expires = ? WHERE id = ? AND lease_expires < ? "
                           f"AND state IN ({_ACTIVE})", [holder, now + ttl, row_id, now, *ACTIVE]) == 1

    def holder(self, row_id: str, table: str = "jobs") -> tuple[str, float] | None:
        """Who holds ``row_id``'s lease, and until when (None: nobody)."""
        assert table in _TABLES
        row = self._engine.row(f"SELECT lease_holder, lease_expires FROM {table} WHERE id = ?", (row_id,))
        if row is None or row[0] is None:
            return None
        return str(row[0]), float(row[1] or 0.0)

    def claim_start(self, job_id: str, replaced: int | None, pid: int, started: float, host: str | None = None) -> bool:
        """Record ``pid`` as the supervisor of a job still PENDING whose supervisor never
        started (``replaced``: the identity recorded, None or a dead pid). False when another
        supervisor came first: that one runs the job (and the new one, losing the job's own
        PENDING -> RUNNING compare-and-set, exits)."""
        same = "supervisor_pid IS NULL" if replaced is None else "supervisor_pid = ?"
        return self._write(f"UPDATE jobs SET supervisor_pid = ?, supervisor_started = ?, supervisor_host = ? WHERE id = ? "
                           f"AND state = ? AND {same}",
                           [pid, started, host, job_id, "PENDING", *([] if replaced is None else [replaced])]) == 1
