"""Leases of the jobs a team server's replicas supervise (migration 8): the job row's
``lease_holder`` (a replica's id) and ``lease_expires`` (a unix time). The SQL only; what a
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

_ACTIVE = ", ".join("?" for _ in ACTIVE)
_SELECT = ", ".join(COLUMNS)


class LeaseTable:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def _write(self, sql: str, params: list[object]) -> int:
        return self._engine.write(sql, tuple(params))

    def renew(self, holder: str, ttl: float, now: float | None = None) -> int:
        """Extend ``holder``'s leases of jobs still running by ``ttl`` seconds, and release its
        leases of jobs that ended; returns how many it still holds."""
        now = time.time() if now is None else now
        held = self._write(f"UPDATE jobs SET lease_expires = ? WHERE lease_holder = ? AND state IN ({_ACTIVE})",
                           [now + ttl, holder, *ACTIVE])
        self._write(f"UPDATE jobs SET lease_holder = NULL, lease_expires = NULL WHERE lease_holder = ? "
                    f"AND state NOT IN ({_ACTIVE})", [holder, *ACTIVE])
        return held

    def hold(self, job_id: str, holder: str, ttl: float) -> None:
        """``holder`` supervises ``job_id`` from now on (a resume started its supervisor)."""
        self._write("UPDATE jobs SET lease_holder = ?, lease_expires = ? WHERE id = ?", [holder, time.time() + ttl, job_id])

    def expired(self, now: float | None = None, limit: int = 100) -> list[tuple[JobRecord, str]]:
        """Jobs still running whose lease has expired (their holder stopped renewing it), oldest
        expiry first, with the holder that let it lapse."""
        now = time.time() if now is None else now
        rows = self._engine.rows(
            f"SELECT {_SELECT}, lease_holder FROM jobs WHERE lease_holder IS NOT NULL AND lease_expires < ? "
            f"AND state IN ({_ACTIVE}) ORDER BY lease_expires LIMIT ?", (now, *ACTIVE, limit))
        return [(from_row(row[:-1]), str(row[-1])) for row in rows]

    def held(self, holder: str) -> list[JobRecord]:
        """The jobs still running under ``holder``'s leases."""
        rows = self._engine.rows(f"SELECT {_SELECT} FROM jobs WHERE lease_holder = ? AND state IN ({_ACTIVE})",
                                 (holder, *ACTIVE))
        return [from_row(row) for row in rows]

    def release_ended(self, now: float | None = None) -> int:
        """Drop the expired leases of jobs that ended (their holder died before releasing them)."""
        now = time.time() if now is None else now
        return self._write(f"UPDATE jobs SET lease_holder = NULL, lease_expires = NULL WHERE lease_holder IS NOT NULL "
                           f"AND lease_expires < ? AND state NOT IN ({_ACTIVE})", [now, *ACTIVE])

    def take(self, job_id: str, holder: str, ttl: float, now: float | None = None) -> bool:
        """Take ``job_id``'s lease over if it is still expired (compare-and-set: of replicas
        racing for it, one wins)."""
        now = time.time() if now is None else now
        return self._write(f"UPDATE jobs SET lease_holder = ?, lease_expires = ? WHERE id = ? AND lease_expires < ? "
                           f"AND state IN ({_ACTIVE})", [holder, now + ttl, job_id, now, *ACTIVE]) == 1

    def holder(self, job_id: str) -> tuple[str, float] | None:
        """Who holds ``job_id``'s lease, and until when (None: nobody)."""
        row = self._engine.row("SELECT lease_holder, lease_expires FROM jobs WHERE id = ?", (job_id,))
        if row is None or row[0] is None:
            return None
        return str(row[0]), float(row[1] or 0.0)

    def claim_start(self, job_id: str, replaced: int | None, pid: int, started: float) -> bool:
        """Record ``pid`` as the supervisor of a job still PENDING whose supervisor never
        started (``replaced``: the identity recorded, None or a dead pid). False when another
        supervisor came first: that one runs the job (and the new one, losing the job's own
        PENDING -> RUNNING compare-and-set, exits)."""
        same = "supervisor_pid IS NULL" if replaced is None else "supervisor_pid = ?"
        return self._write(f"UPDATE jobs SET supervisor_pid = ?, supervisor_started = ? WHERE id = ? AND state = ? "
                           f"AND {same}", [pid, started, job_id, "PENDING", *([] if replaced is None else [replaced])]) == 1
