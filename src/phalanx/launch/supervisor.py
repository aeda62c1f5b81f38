"""The supervisor: runs one job from its plan to a final state in the store.

It starts every node agent through the backend, then watches them (signal-driven, no
busy loop) and owns the job-level decisions:

- a node that fails stops the whole job at once (fail fast: SIGTERM to the other nodes,
  their grace period, then SIGKILL), instead of leaving peers hung in a collective;
- a stop request (SIGTERM/SIGINT/SIGHUP/SIGUSR1, as sent by ``phalanx stop``, Ctrl-C or a
  scheduler) is forwarded to every node; a second request kills at once;
- the root cause is the *first* failure by timestamp across all ranks and nodes.

Runs in the ``phalanx run`` process for foreground jobs, and as
``python -m phalanx.launch.supervisor JOB_ID`` (its own session) for detached ones.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..core.paths import HomePaths, JobPaths, read_json, write_atomic, write_json
from ..core.state import JobState
from ..store import JobRecord, Store
from .plan import Plan
from .procs import ChildWatcher, signal_name

LOG_TAIL_LINES = 20


def write_launch_files(plan: Plan, paths: JobPaths) -> None:
    write_atomic(paths.plan, plan.to_json())
    for node in plan.nodes:
        write_json(
            paths.node_launch(plan.attempt, node.node_rank),
            {"node": node.to_dict(), "job_dir": str(paths.root), "attempt": plan.attempt, "grace": plan.grace},
        )


def supervise(store: Store, record: JobRecord, plan: Plan, on_started: Callable[[], None] | None = None) -> int:
    """Run ``plan`` to completion; returns the job's exit code. Blocking. Main thread only."""
    from ..backends.registry import get_backend

    backend = get_backend(plan.backend)
    paths = JobPaths(Path(record.job_dir))
    write_launch_files(plan, paths)
    me = _self_identity()
    with ChildWatcher() as watcher:
        if not store.transition(record.id, JobState.RUNNING, attempt=plan.attempt, **me):
            return 1  # stopped before it started
        handles = [backend.start_node(node, paths, plan.attempt) for node in plan.nodes]
        if on_started:
            on_started()
        stopping: int | None = None
        failed_node: int | None = None
        kill_at: float | None = None
        while True:
            codes = [h.poll() for h in handles]
            if all(c is not None for c in codes):
                break
            if watcher.stop_requests and stopping is None:
                stopping = watcher.stop_requests[0]
                store.transition(record.id, JobState.STOPPING)
                for h in handles:
                    h.signal(stopping)
                kill_at = time.monotonic() + plan.grace + max(h.kill_margin for h in handles)
            elif len(watcher.stop_requests) > 1 and stopping is not None:
                kill_at = time.monotonic()  # asked twice: no more grace
            if failed_node is None and stopping is None:
                for h, c in zip(handles, codes):
                    if c not in (None, 0):
                        failed_node = h.node_rank
                        for other in handles:
                            other.signal(signal.SIGTERM)
                        kill_at = time.monotonic() + plan.grace + max(h.kill_margin for h in handles)
                        break
            if kill_at is not None and time.monotonic() >= kill_at:
                for h in handles:
                    h.kill()
                continue
            watcher.wait(1.0 if kill_at is None else max(0.0, min(1.0, kill_at - time.monotonic())))
        codes = [h.poll() for h in handles]
    return _finish(store, record, paths, plan, codes, stopping)


def _self_identity() -> dict[str, Any]:
    import psutil

    return {"supervisor_pid": os.getpid(), "supervisor_started": psutil.Process().create_time()}


def _finish(store: Store, record: JobRecord, paths: JobPaths, plan: Plan, codes: list[int | None], stopping: int | None) -> int:
    if stopping is not None:
        code = 128 + int(stopping)
        if not store.transition(record.id, JobState.CANCELLED, exit_code=code):
            store.transition(record.id, JobState.FAILED, exit_code=code)
        return code
    if all(c == 0 for c in codes):
        store.transition(record.id, JobState.SUCCEEDED, exit_code=0)
        return 0
    cause = root_cause(paths, plan.attempt, len(plan.nodes), codes)
    code = int(cause.get("exitcode") or 1)
    store.transition(record.id, JobState.FAILED, exit_code=code, root_cause=_json(cause))
    return code


def _json(data: Any) -> str:
    import json

    return json.dumps(data, sort_keys=True)


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
        first["log_tail"] = _tail(paths.rank_log(attempt, first["rank"]))
        first["log"] = str(paths.rank_log(attempt, first["rank"]))
        if not first.get("message"):
            sig = first.get("signal")
            first["message"] = f"killed by {sig}" if sig else f"exited with code {first['exitcode']}"
        return first
    for node_rank, code in enumerate(codes):
        if code not in (None, 0):
            log = paths.agent_log(attempt, node_rank)
            sig = signal_name(-code if code < 0 else code)
            return {
                "node_rank": node_rank,
                "exitcode": 128 - code if code < 0 else code,
                "signal": sig,
                "message": f"node agent {node_rank} {'was killed by ' + sig if sig else f'exited with code {code}'}",
                "log": str(log),
                "log_tail": _tail(log),
            }
    return {"exitcode": 1, "message": "the job failed for an unknown reason"}


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
    from ..launch.plan import Plan as PlanCls

    args = sys.argv[1:] if argv is None else argv
    home = HomePaths(config.home())
    store = Store(home.db)
    record = store.get(args[0])
    plan = PlanCls.from_dict(read_json(JobPaths(Path(record.job_dir)).plan))
    code = supervise(store, record, plan)
    sys.stdout.flush()
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
