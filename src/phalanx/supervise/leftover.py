"""Attempts that outlived their supervisor: a scheduler (SLURM) kept running what a supervisor
started after that supervisor vanished (the job is LOST). Found again from the attempt's launch
files and ``Backend.attach``; a new supervisor watches it (``phalanx resume``) or ``phalanx
stop`` stops it. Backends whose nodes die with their supervisor never have one."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from typing import Callable

from ..backends.base import NodeHandle
from ..backends.registry import get_backend
from ..core.contracts import OutcomeKind, read_launch
from ..core.paths import HomePaths
from ..core.plan import Plan
from ..errors import ContractError
from ..store import JobRecord, Store
from .history import log_attempt
from .outcome import Outcome
from .submit import plan_attempt

Events = Callable[[str], None]


@dataclass
class Leftover:
    """An attempt that a supervisor started, then vanished, while the scheduler kept the
    attempt running or queued."""

    plan: Plan
    handles: list[NodeHandle]  # one per node
    started: float  # when it was submitted
    where: str  # what a person can look up: "SLURM job 4711"


def attempt_plan(record: JobRecord, attempt: int) -> Plan | None:
    """The plan ``attempt`` was started with: the job's ``plan.json`` when it is that attempt's
    (with the backend's ``context``), else read back from the attempt's launch files (and batch
    script); None when the attempt never got that far."""
    paths = record.paths
    try:
        saved = Plan.from_dict(json.loads(paths.plan.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        saved = None
    if saved is not None and saved.attempt == attempt and paths.node_launch(attempt, 0).exists():
        return saved
    nodes, grace = [], 0.0
    for node_rank in range(record.nnodes):
        try:
            launch = read_launch(paths.node_launch(attempt, node_rank))
        except ContractError:
            return None
        if launch is None:
            return None
        nodes.append(launch.node)
        grace = launch.grace
    try:
        submission = paths.batch_script(attempt).read_text()
    except OSError:
        submission = ""
    return Plan(record.id, attempt, record.backend, tuple(nodes), grace, submission)


def find(record: JobRecord, upto: int | None = None) -> Leftover | None:
    """The job's latest attempt (at most ``upto``) when something of it still runs although
    no supervisor watches it; None otherwise, and always on backends whose agents die with
    their supervisor (local, ssh). Asks the scheduler at most once; starts and stops nothing.

    Only the latest attempt can be left: a supervisor starts the next one after the last ended.
    """
    paths = record.paths
    attempts = [a for a in paths.attempts() if upto is None or a <= upto]
    plan = attempt_plan(record, max(attempts)) if attempts else None
    handles = get_backend(record.backend).attach(plan, paths) if plan is not None else None
    if not handles or plan is None:
        return None
    first = handles[0]
    return Leftover(plan, handles, first.submitted or time.time(), first.where or f"attempt {plan.attempt}")


def resume_plan(record: JobRecord, home: HomePaths) -> Plan:
    """The plan ``phalanx resume`` continues a job with: its latest attempt while that still
    runs (a LOST job the scheduler kept going; the new supervisor watches it), else a new one."""
    left = find(record)
    if left is not None:
        return left.plan
    paths = record.paths
    spec = record.spec
    return plan_attempt(get_backend(spec.backend), spec, record.id, max([*paths.attempts(), record.attempt]) + 1, home)


def stop(store: Store, record: JobRecord, events: Events | None = None, poll: float = 0.5) -> Leftover | None:
    """Stop what a LOST job left running, as a supervisor stops an attempt: SIGTERM to every
    node (the ranks get the grace period to checkpoint), then SIGKILL. Blocking, until every
    node has ended; idempotent: None when nothing was left. The job stays LOST; its root cause
    and attempts log say what was stopped."""
    left = find(record)
    if left is None:
        return None
    say = events or (lambda text: None)
    attempt = left.plan.attempt
    say(f"job {record.id} is LOST (its supervisor vanished) but {left.where} (attempt {attempt}) still runs; stopping it")
    for h in left.handles:
        h.signal(signal.SIGTERM)
    margin = max(h.kill_margin for h in left.handles)
    deadline, killed = time.monotonic() + left.plan.grace + margin, False
    while any(h.poll() is None for h in left.handles):
        for h in left.handles:
            h.collect()  # as a supervisor would: what the nodes write elsewhere comes here
        if time.monotonic() >= deadline:
            if killed:
                say(f"warning: {left.where} had not ended {margin:g}s after SIGKILL; check it with your scheduler")
                break
            for h in left.handles:
                h.kill()
            killed, deadline = True, time.monotonic() + margin
        time.sleep(poll)
    for h in left.handles:
        h.collect(final=True)
    done = f"phalanx stop stopped {left.where} (attempt {attempt}), which ran on without it"
    log_attempt(record.paths, attempt, left.started, Outcome(OutcomeKind.CANCELLED, 128 + signal.SIGTERM), False, done)
    cause = record.root_cause_dict() or {}
    cause["message"] = "; ".join(filter(None, [cause.get("message"), done]))
    store.update(record.id, root_cause=json.dumps(cause, sort_keys=True))
    say(f"stopped {left.where}")
    return left


__all__ = ["Leftover", "attempt_plan", "find", "resume_plan", "stop"]
