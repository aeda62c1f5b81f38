"""The supervisor: runs one job from its plan to a final state in the store.

It starts every node agent through the backend, then watches them (signal-driven, no
busy loop) and owns the job-level decisions:

- **fail fast**: a node that fails stops the whole job at once (SIGTERM to the other nodes,
  their grace period, then SIGKILL) instead of leaving peers hung in a collective;
- **stall**: with ``stall_timeout``, a job whose ranks print nothing for that long gets every
  rank's Python stacks dumped to its log (SIGUSR2 -> faulthandler), then counts as failed;
- **retry**: a failed attempt is rerun as a whole (all nodes, fresh rendezvous, same job id,
  ``PHALANX_ATTEMPT`` + 1, same state directory) while retries remain and the failure is
  retryable (``no_retry_on`` patterns, ``retry_on_exit_codes``);
- **stop vs preemption**: ``phalanx stop`` (the store says STOPPING) and Ctrl-C cancel the job;
  SIGTERM/SIGUSR1/SIGHUP from anyone else mean the machine is being taken away: every rank
  gets SIGTERM and the grace period to checkpoint, and the job is recorded PREEMPTED, ready
  for ``phalanx resume``. A second signal kills at once;
- **state**: with ``state_uri``, the state directory is pulled before the first attempt,
  pushed periodically while running and once more at the end;
- the **root cause** is the first failure by timestamp across all ranks and nodes.

Runs in the ``phalanx run`` process for foreground jobs, and as
``python -m phalanx.launch.supervisor JOB_ID`` (its own session) for detached ones.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..core.paths import HomePaths, JobPaths, read_json, write_atomic, write_json
from ..core.spec import JobSpec
from ..core.state import JobState
from ..store import JobRecord, Store
from .plan import Plan
from .procs import ChildWatcher, signal_name

LOG_TAIL_LINES = 20
Events = Callable[[str], None]


@dataclass
class Outcome:
    kind: str  # succeeded | failed | stalled | cancelled | preempted
    exit_code: int
    cause: dict[str, Any] | None = None


def write_launch_files(plan: Plan, paths: JobPaths) -> None:
    write_atomic(paths.plan, plan.to_json())
    for node in plan.nodes:
        write_json(
            paths.node_launch(plan.attempt, node.node_rank),
            {"node": node.to_dict(), "job_dir": str(paths.root), "attempt": plan.attempt, "grace": plan.grace},
        )


def supervise(store: Store, home: HomePaths, record: JobRecord, plan: Plan, events: Events | None = None) -> int:
    """Run ``plan`` (and its retries) to completion; returns the job's exit code.

    Blocking; main thread only (it handles signals).
    """
    from ..backends.registry import get_backend

    say = events or (lambda text: None)
    spec = JobSpec.from_dict(json.loads(record.spec_json))
    backend = get_backend(plan.backend)
    paths = JobPaths(Path(record.job_dir))
    with ChildWatcher() as watcher:
        if not store.transition(record.id, JobState.RUNNING, attempt=plan.attempt, **_self_identity()):
            return 1  # stopped before it started
        sync = _state_sync(store, home, record, spec, say)
        if isinstance(sync, Outcome):
            return _finish(store, record, sync)
        retries = 0
        while True:
            write_launch_files(plan, paths)
            started = time.time()
            outcome = _run_attempt(store, backend, record, spec, plan, paths, watcher)
            retry, reason = _should_retry(spec, outcome, retries, paths, plan)
            _log_attempt(paths, plan.attempt, started, outcome, retry, reason)
            if not retry:
                break
            retries += 1
            say(f"attempt {plan.attempt} {outcome.kind} (exit {outcome.exit_code}): {_short(outcome)}; "
                f"retrying ({retries}/{spec.max_retries}) as attempt {plan.attempt + 1}")
            plan = backend.plan(spec, record.id, plan.attempt + 1, home)
            store.update(record.id, attempt=plan.attempt, retries=retries)
        if sync is not None:
            sync.stop()
    return _finish(store, record, outcome)


def _run_attempt(
    store: Store, backend: Any, record: JobRecord, spec: JobSpec, plan: Plan, paths: JobPaths, watcher: ChildWatcher
) -> Outcome:
    handles = [backend.start_node(node, paths, plan.attempt) for node in plan.nodes]
    margin = max(h.kill_margin for h in handles)
    stop_kind: str | None = None
    stop_signal = signal.SIGTERM
    stalled_for: float | None = None
    kill_at: float | None = None
    seen_requests = 0
    last_activity = time.time()
    while True:
        codes = [h.poll() for h in handles]
        if all(c is not None for c in codes):
            break
        if len(watcher.stop_requests) > seen_requests:
            if stop_kind is None:
                stop_signal = watcher.stop_requests[seen_requests]
                stop_kind = _stop_kind(store, record.id, stop_signal)
                if stop_kind == "cancelled":
                    store.transition(record.id, JobState.STOPPING)
                for h in handles:
                    h.signal(signal.SIGINT if stop_signal == signal.SIGINT else signal.SIGTERM)
                kill_at = time.monotonic() + plan.grace + margin
            else:
                kill_at = time.monotonic()  # asked twice: no more grace
            seen_requests = len(watcher.stop_requests)
        if kill_at is None and any(c not in (None, 0) for c in codes):
            for h in handles:  # fail fast: the rest of the job stops now
                h.signal(signal.SIGTERM)
            kill_at = time.monotonic() + plan.grace + margin
        if spec.stall_timeout and kill_at is None:
            last_activity = max(last_activity, _last_output(paths, plan.attempt))
            if time.time() - last_activity > spec.stall_timeout:
                stalled_for = time.time() - last_activity
                _dump_stacks(paths, plan.attempt)
                for h in handles:
                    h.signal(signal.SIGTERM)
                kill_at = time.monotonic() + plan.grace + margin
        if kill_at is not None and time.monotonic() >= kill_at:
            for h in handles:
                h.kill()
            continue
        tick = 1.0 if kill_at is None else max(0.0, min(1.0, kill_at - time.monotonic()))
        watcher.wait(tick)
    codes = [h.poll() for h in handles]
    if stop_kind is not None:
        return Outcome(stop_kind, 128 + int(stop_signal))
    if stalled_for is not None:
        return Outcome("stalled", 124, {
            "exitcode": 124,
            "message": f"no output from any rank for {stalled_for:.0f}s (--stall-timeout {spec.stall_timeout:g}); "
                       "each rank's Python stacks were dumped to its log",
        })
    if all(c == 0 for c in codes):
        return Outcome("succeeded", 0)
    cause = root_cause(paths, plan.attempt, len(plan.nodes), codes)
    return Outcome("failed", int(cause.get("exitcode") or 1), cause)


def _stop_kind(store: Store, job_id: str, signum: int) -> str:
    """A user stop (``phalanx stop`` marks the store first; Ctrl-C is SIGINT) or a preemption."""
    if signum == signal.SIGINT or store.get(job_id).state is JobState.STOPPING:
        return "cancelled"
    return "preempted"


def _should_retry(spec: JobSpec, outcome: Outcome, retries: int, paths: JobPaths, plan: Plan) -> tuple[bool, str]:
    if outcome.kind not in ("failed", "stalled"):
        return False, outcome.kind
    if retries >= spec.max_retries:
        return False, f"no retries left ({retries}/{spec.max_retries} used)"
    if spec.retry_on_exit_codes and outcome.exit_code not in spec.retry_on_exit_codes:
        return False, f"exit code {outcome.exit_code} is not in --retry-on-exit-codes"
    text = "\n".join(_tail(paths.rank_log(plan.attempt, r), 200) for r in paths.ranks(plan.attempt))
    for pattern in spec.no_retry_on:
        if re.search(pattern, text):
            return False, f"the output matches --no-retry-on '{pattern}'"
    return True, "retryable"


def _log_attempt(paths: JobPaths, attempt: int, started: float, outcome: Outcome, retry: bool, reason: str) -> None:
    entry = {
        "attempt": attempt, "started": started, "ended": time.time(), "outcome": outcome.kind,
        "exit_code": outcome.exit_code, "message": _short(outcome), "retry": retry, "reason": reason,
    }
    with open(paths.attempts_log, "a") as fh:
        fh.write(json.dumps(entry) + "\n")


def _short(outcome: Outcome) -> str:
    cause = outcome.cause or {}
    where = f"rank {cause['rank']}: " if "rank" in cause else ""
    return f"{where}{cause.get('message', outcome.kind)}"


def _last_output(paths: JobPaths, attempt: int) -> float:
    latest = 0.0
    for rank in paths.ranks(attempt):
        for path in (paths.rank_log(attempt, rank), paths.rank_user_metrics(attempt, rank)):
            try:
                latest = max(latest, path.stat().st_mtime)
            except FileNotFoundError:
                pass
    return latest


def _dump_stacks(paths: JobPaths, attempt: int) -> None:
    """SIGUSR2 to every rank: the bootstrap's faulthandler prints all Python stacks to its log."""
    for rank in paths.ranks(attempt):
        proc = read_json(paths.rank_proc(attempt, rank)) or {}
        if proc.get("pid"):
            try:
                os.kill(int(proc["pid"]), signal.SIGUSR2)
            except (ProcessLookupError, PermissionError):
                pass
    time.sleep(1.0)  # let faulthandler write before the ranks are stopped


def _state_sync(store: Store, home: HomePaths, record: JobRecord, spec: JobSpec, say: Events) -> Any:
    """Pull the remote state before the first attempt; returns the running sync, None, or a failed Outcome."""
    if not spec.state_uri:
        return None
    from ..errors import PhalanxError
    from ..storage.state import StateSync

    sync = StateSync(
        home.state_dir(spec.name), spec.state_uri,
        on_pushed=lambda ts: store.update(record.id, state_synced_at=ts),
        on_error=lambda msg: say(f"warning: {msg}"),
    )
    try:
        pulled = sync.pull()
    except PhalanxError as exc:
        return Outcome("failed", 1, {"exitcode": 1, "message": f"could not restore the state directory: {exc}"})
    if pulled:
        say(f"restored {pulled} file(s) of state from {spec.state_uri}")
    from .. import config

    sync.start(float(config.get("state_sync_interval")))
    return sync


def _self_identity() -> dict[str, Any]:
    import psutil

    return {"supervisor_pid": os.getpid(), "supervisor_started": psutil.Process().create_time()}


def _finish(store: Store, record: JobRecord, outcome: Outcome) -> int:
    code = outcome.exit_code
    if outcome.kind == "succeeded":
        store.transition(record.id, JobState.SUCCEEDED, exit_code=0)
    elif outcome.kind == "cancelled":
        if not store.transition(record.id, JobState.CANCELLED, exit_code=code):
            store.transition(record.id, JobState.FAILED, exit_code=code)
    elif outcome.kind == "preempted":
        cause = {"exitcode": code, "message": f"preempted ({signal_name(code)}); continue with: phalanx resume {record.id}"}
        store.transition(record.id, JobState.PREEMPTED, exit_code=code, root_cause=json.dumps(cause, sort_keys=True))
    else:
        store.transition(record.id, JobState.FAILED, exit_code=code, root_cause=json.dumps(outcome.cause, sort_keys=True))
    return code


def rank_failures(paths: JobPaths, attempt: int, nnodes: int) -> list[dict[str, Any]]:
    """Every rank failure reported by the node agents, enriched with the rank's error.json."""
    failures = []
    for node_rank in range(nnodes):
        result = read_json(paths.node_result(attempt, node_rank)) or {}
        for failure in result.get("failures", []):
            failure = dict(failure, node_rank=node_rank, host=result.get("host"))
            error = read_json(paths.rank_error(attempt, failure["rank"]))
            if error:
                failure.update(
                    timestamp=error["timestamp"], type=error["type"], message=error["message"], traceback=error["traceback"]
                )
            failures.append(failure)
    return failures


def root_cause(paths: JobPaths, attempt: int, nnodes: int, codes: list[int | None]) -> dict[str, Any]:
    """The first failure by timestamp; falls back to the first failed node agent."""
    failures = rank_failures(paths, attempt, nnodes)
    if failures:
        first = dict(min(failures, key=lambda f: f["timestamp"]))
        first["attempt"] = attempt
        first["log_tail"] = _tail(paths.rank_log(attempt, first["rank"]))
        first["log"] = str(paths.rank_log(attempt, first["rank"]))
        if not first.get("message"):
            sig = first.get("signal")
            first["message"] = f"killed by {sig}" if sig else f"exited with code {first['exitcode']}"
        return first
    for node_rank, code in enumerate(codes):
        if code not in (None, 0):
            log = paths.agent_log(attempt, node_rank)
            sig = signal_name(code)
            return {
                "attempt": attempt,
                "node_rank": node_rank,
                "exitcode": code,
                "signal": sig,
                "message": f"node agent {node_rank} {'was killed by ' + sig if sig else f'exited with code {code}'}",
                "log": str(log),
                "log_tail": _tail(log),
            }
    return {"attempt": attempt, "exitcode": 1, "message": "the job failed for an unknown reason"}


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def main(argv: list[str] | None = None) -> None:
    """Detached entry point: ``python -m phalanx.launch.supervisor JOB_ID``."""
    from .. import config

    args = sys.argv[1:] if argv is None else argv
    home = HomePaths(config.home())
    store = Store(home.db)
    record = store.get(args[0])
    plan = Plan.from_dict(read_json(JobPaths(Path(record.job_dir)).plan))

    def say(text: str) -> None:
        print(f"phalanx: {text}", flush=True)

    code = supervise(store, home, record, plan, events=say)
    sys.stdout.flush()
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
