"""The SQL of admission (``supervise/admission.py``): what a project's admitted jobs hold, its
queue in admission order, and the writes that admit, queue and cancel. Each runs inside the
caller's unit of work (``tx.atomic``), so what it read is still true when it writes.

A job holds its share of its project's quota from ``admitted_at`` until it ends (states PENDING,
QUEUED once admitted, RUNNING, STOPPING). The queue is the QUEUED jobs not admitted yet: higher
``priority`` first, then the order they were submitted in (``jobs_queue``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ..core.state import JobState
from .records import COLUMNS, JobRecord, from_row
from .tx import Tx

HOLDING = tuple(s.value for s in (JobState.PENDING, JobState.QUEUED, JobState.RUNNING, JobState.STOPPING))
# The partial indexes' conditions (migration 8), as literals: SQLite uses such an index only for a
# query whose WHERE has the index's terms as they are written there.
HOLDS = f"admitted_at IS NOT NULL AND state IN ({', '.join(repr(s) for s in HOLDING)})"
WAITS = f"state = '{JobState.QUEUED.value}' AND admitted_at IS NULL"
PAGE = 100  # queued jobs read at a time: admission looks at the head of a queue, rarely further


@dataclass(frozen=True)
class Queued:
    id: str
    priority: int
    created_at: float
    gpus: int
    cpus: int
    backend: str
    sweep_id: str | None
    supervisor_pid: int | None
    supervisor_started: float | None
    supervisor_host: str | None


def _not_in(backends: Sequence[str]) -> tuple[str, list[Any]]:
    if not backends:
        return "", []
    return f" AND backend NOT IN ({', '.join('?' for _ in backends)})", list(backends)


def holders(t: Tx, project: str, skip_backends: Sequence[str] = ()) -> list[JobRecord]:
    """The project's admitted jobs that have not ended (those another engine admits left out)."""
    extra, args = _not_in(skip_backends)
    sql = f"SELECT {', '.join(COLUMNS)} FROM jobs WHERE project = ? AND {HOLDS}{extra}"
    return [from_row(r) for r in t.rows(sql, [project, *args])]


def waiting(t: Tx, project: str, skip_backends: Sequence[str] = ()) -> Iterator[Queued]:
    """The project's queue, in admission order, read ``PAGE`` jobs at a time as it is walked
    (after the last one seen: jobs admitted or ended meanwhile move nothing)."""
    extra, args = _not_in(skip_backends)
    sql = ("SELECT id, priority, created_at, gpus, cpus, backend, sweep_id, supervisor_pid, supervisor_started, "
           f"supervisor_host FROM jobs WHERE project = ? AND {WAITS}{extra}")
    order = f" ORDER BY priority DESC, created_at, id LIMIT {PAGE}"
    after = ""
    keys: list[Any] = []
    while True:
        page = [Queued(*r) for r in t.rows(sql + after + order, [project, *args, *keys])]
        yield from page
        if len(page) < PAGE:
            return
        last = page[-1]
        after = " AND (priority < ? OR (priority = ? AND (created_at > ? OR (created_at = ? AND id > ?))))"
        keys = [last.priority, last.priority, last.created_at, last.created_at, last.id]


def ahead(t: Tx, project: str, priority: int, created_at: float, job_id: str) -> int:
    """How many queued jobs of the project come before a job with these keys."""
    found = t.row(f"SELECT COUNT(*) FROM jobs WHERE project = ? AND {WAITS} AND "
                  "(priority > ? OR (priority = ? AND (created_at < ? OR (created_at = ? AND id < ?))))",
                  [project, priority, priority, created_at, created_at, job_id])
    return int(found[0]) if found else 0


def projects_waiting(t: Tx) -> list[str]:
    return [r[0] for r in t.rows(f"SELECT DISTINCT project FROM jobs WHERE {WAITS}")]


def job(t: Tx, job_id: str) -> JobRecord | None:
    found = t.row(f"SELECT {', '.join(COLUMNS)} FROM jobs WHERE id = ?", [job_id])
    return from_row(found) if found else None


def admit(t: Tx, job_id: str, at: float) -> bool:
    """Mark a waiting (PENDING or QUEUED) job admitted: it holds its share from now."""
    return t.execute("UPDATE jobs SET admitted_at = ? WHERE id = ? AND state IN (?, ?) AND admitted_at IS NULL",
                     [at, job_id, JobState.PENDING.value, JobState.QUEUED.value]) == 1


def enqueue(t: Tx, job_id: str, waiter: dict[str, Any]) -> bool:
    """PENDING -> QUEUED; ``waiter``: the supervisor identity of whoever waits for it (empty: nobody)."""
    return t.execute("UPDATE jobs SET state = ?, supervisor_pid = ?, supervisor_started = ?, supervisor_host = ? "
                     "WHERE id = ? AND state = ?",
                     [JobState.QUEUED.value, waiter.get("supervisor_pid"), waiter.get("supervisor_started"),
                      waiter.get("supervisor_host"), job_id, JobState.PENDING.value]) == 1


def end_queued(t: Tx, job_id: str, state: JobState, message: str, exit_code: int | None) -> bool:
    """A queued job that will never run: CANCELLED, FAILED or LOST, saying why."""
    cause = json.dumps({"message": message, "exitcode": exit_code}, sort_keys=True)
    return t.execute("UPDATE jobs SET state = ?, ended_at = ?, exit_code = ?, root_cause = ? WHERE id = ? AND state = ?",
                     [state.value, time.time(), exit_code, cause, job_id, JobState.QUEUED.value]) == 1


def queued_ids(t: Tx, project: str) -> list[str]:
    return [r[0] for r in t.rows(f"SELECT id FROM jobs WHERE project = ? AND state = '{JobState.QUEUED.value}'", [project])]
