"""Whether a job's (or sweep's) supervisor still lives, and what a read shows when it does not.

A supervisor is identified by its pid and its process's start time (so a reused pid is no
false "alive"), on its own machine: a supervisor a team server's replica started on another
machine (``supervisor_host``) is judged by its row's lease instead, which the replica and the
supervisor itself renew (``relay.py``; a sweep's runner stamps its sweep's lease on its trials).
When it is gone while the store says the job runs, the job is LOST. Reads
(``ps``, ``status``, the dashboard) *show* that at once (``effective``) but never write it: the
first writer with a reason to (``resume``, ``stop``, a sweep runner taking over its trials)
records it (``record_lost``). A trial's supervisor is its sweep's runner, so trials of a
runner that died show LOST too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.state import SUPERVISOR_ELSEWHERE, JobState, is_terminal
from ..store import JobRecord, Store

if TYPE_CHECKING:
    from ..store.queue import Queued
    from ..store.sweeps import SweepRecord

# A supervisor that has not written its identity yet (a detached one starting) is given this
# long before its job counts as LOST.
START_GRACE = 60.0

Row = TypeVar("Row", JobRecord, "SweepRecord")


# A job supervised on another machine (k8s --in-cluster): its backend's refresh records what became of it.
ELSEWHERE = SUPERVISOR_ELSEWHERE


HOST = socket.gethostname()


def identity() -> dict[str, Any]:
    """This process as a supervisor: the columns ``effective`` checks."""
    import psutil

    return {"supervisor_pid": os.getpid(), "supervisor_started": psutil.Process().create_time(), "supervisor_host": HOST}


def elsewhere_host(row: JobRecord | SweepRecord | Queued) -> bool:
    """Its supervisor runs on another machine (a team server's replica there started it): its pid
    means nothing here."""
    return row.supervisor_host is not None and row.supervisor_host != HOST


def elsewhere(row: JobRecord | SweepRecord) -> bool:
    return row.supervisor_pid == ELSEWHERE


def gone_here(row: JobRecord | SweepRecord | Queued) -> bool:
    """No supervisor waits for it: none recorded, or one of this machine that is gone (one on
    another machine is not known gone from here)."""
    return not elsewhere_host(row) and not alive(row.supervisor_pid, row.supervisor_started)


def alive(pid: int | None, started: float | None) -> bool:
    if pid is None:
        return False
    import psutil

    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - (started or 0)) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def is_lost(row: JobRecord | SweepRecord, now: float | None = None) -> bool:
    """The store says it runs, but nothing supervises it any more. Asks the OS; writes nothing.
    A job waiting in its project's queue needs no supervisor (``admission.py``) until admitted."""
    if is_terminal(row.state) or row.supervisor_pid == ELSEWHERE:
        return False
    admitted = getattr(row, "admitted_at", None)
    if row.state is JobState.QUEUED and (admitted is None or (now or time.time()) - admitted < START_GRACE):
        return False  # waiting, or admitted and its supervisor starting
    if row.supervisor_pid is None:
        return (now or time.time()) - max(row.created_at, admitted or 0.0) >= START_GRACE
    if elsewhere_host(row):  # judged by the lease its replica (or itself) keeps renewing
        expires = getattr(row, "lease_expires", None)
        return expires is not None and expires < (now or time.time())
    return not alive(row.supervisor_pid, row.supervisor_started)


def lost_cause(row: JobRecord | SweepRecord) -> str:
    return json.dumps({"message": f"the supervisor (pid {row.supervisor_pid}) vanished without recording an end",
                       "exitcode": None})


def effective(row: Row) -> Row:
    """``row`` as it truly stands: LOST when its supervisor is gone. A copy; nothing is written."""
    if not is_lost(row):
        return row
    if isinstance(row, JobRecord):
        return dataclasses.replace(row, state=JobState.LOST, root_cause=lost_cause(row),
                                   ended_at=row.ended_at or time.time())
    return dataclasses.replace(row, state=JobState.LOST, ended_at=row.ended_at or time.time())


def record_lost(store: Store, record: JobRecord) -> JobRecord:
    """Write down that a job is LOST (compare-and-set: a supervisor that ends it meanwhile wins);
    returns the record as it now is. For writers about to act on the job (resume, stop)."""
    if is_lost(record):
        store.transition(record.id, JobState.LOST, root_cause=lost_cause(record))
    return store.get(record.id)


def record_sweep_lost(store: Store, sweep: SweepRecord) -> SweepRecord:
    """``record_lost`` for a sweep: its runner is gone."""
    if is_lost(sweep):
        store.sweeps.transition(sweep.id, JobState.LOST)
    return store.sweeps.get(sweep.id)
