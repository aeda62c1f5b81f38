"""How a node's ranks ended, and which failed first: the node agent's accounting, kept apart
from starting and supervising the workers (``agent``).

torch notices a failure by the whole second and may notice a rank cut off by its peer before the
peer that raised; each rank's own records (``error.json``, ``proc.json``, ``exit.json``, written by
the bootstrap) say what really happened and when."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from typing import Any

from ..core.contracts import read_rank_error
from ..core.paths import JobPaths
from ..errors import ContractError
from .procs import ChildWatcher, exit_code, signal_name


def died_at(paths: JobPaths, attempt: int, rank: int, noticed: float) -> float:
    """When a failed rank died, to the millisecond, given that it was ``noticed`` dead by then.

    torch dates a failure by the whole second it noticed it, and the direct launcher polls once
    a second, so a rank that raised and the rank that crashed because of it tie, or swap, and
    the root cause names the casualty. A rank's own exception record is exact. Without one, its
    log's last write is: a dying worker prints its stack (faulthandler) or "terminate called..."
    there. A rank killed silently is dated by its last output, which is before its death, never
    after a failure it caused."""
    error = rank_error(paths, attempt, rank)
    if error is not None:
        return error.timestamp
    try:
        return min(paths.rank_log(attempt, rank).stat().st_mtime, noticed)
    except OSError:
        return noticed


def add_unnoticed_raises(result: dict[str, Any], paths: JobPaths, attempt: int, node_rank: int) -> None:
    """Count as failures this node's ranks that raised before the first failure that was noticed.

    A rank that raised is still exiting (torch tearing down, gloo closing its pairs) while its
    peers, cut off mid-collective, raise "Connection closed by peer" or abort. When one of those
    exits first, torch notices only it and SIGTERMs the rank that caused it, and the root cause
    names the casualty. The bootstrap's exception record says who really failed first."""
    failures = result.get("failures") or []
    if not failures:
        return
    noticed = min(f["timestamp"] for f in failures)
    known = {f["rank"] for f in failures}
    for rank in paths.ranks(attempt):
        error = rank_error(paths, attempt, rank) if rank not in known else None
        if error is None or error.node_rank != node_rank or not error.timestamp < noticed:
            continue
        failures.append({"rank": rank, "local_rank": error.local_rank, "pid": error.pid,
                         "exitcode": error.exitcode, "signal": None, "timestamp": error.timestamp})
        if rank in result.get("terminated", []):
            result["terminated"].remove(rank)
    failures.sort(key=lambda f: f["rank"])
    result["exitcode"] = min(failures, key=lambda f: f["timestamp"])["exitcode"] or 1


def node_ranks(paths: JobPaths, attempt: int, node_rank: int) -> dict[int, dict[str, Any]]:
    """This node's ranks that started (their bootstrap wrote ``proc.json``): rank -> proc.json."""
    import json

    ranks: dict[int, dict[str, Any]] = {}
    for rank in paths.ranks(attempt):
        try:
            proc = json.loads(paths.rank_proc(attempt, rank).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(proc, dict) and proc.get("node_rank") == node_rank:
            ranks[rank] = proc
    return ranks


def rank_exits(paths: JobPaths, attempt: int, node_rank: int, unknown: int) -> dict[str, dict[str, Any]]:
    """How this node's ranks ended, from what each bootstrap wrote (``proc.json`` at start,
    ``exit.json`` at its end), for workers torch started and reaped; a rank without an exit
    record died of a signal: ``unknown``."""
    import json

    ranks: dict[str, dict[str, Any]] = {}
    for rank, proc in node_ranks(paths, attempt, node_rank).items():
        try:
            code = int(json.loads(paths.rank_exit(attempt, rank).read_text())["exitcode"])
        except (OSError, ValueError, KeyError, TypeError):
            code = unknown
        ranks[str(rank)] = {"pid": proc.get("pid"), "exitcode": code}
    return ranks


def interrupted_code(ranks: dict[str, dict[str, Any]]) -> int:
    """A node's exit code after Ctrl-C is its scripts': 0 when every rank ended with 0, else
    the lowest rank's nonzero code (130: an uncaught KeyboardInterrupt)."""
    codes = [ranks[r]["exitcode"] for r in sorted(ranks, key=int)]
    return next((c for c in codes if c != 0), 0)


def failure_of(rank: int, proc: subprocess.Popen[bytes], paths: JobPaths, attempt: int) -> dict[str, Any]:
    code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    return {"rank": rank, "pid": proc.pid, "exitcode": exit_code(code), "signal": signal_name(code),
            "timestamp": died_at(paths, attempt, rank, time.time())}


def rank_error(paths: JobPaths, attempt: int, rank: int) -> Any:
    """The rank's error.json (``contracts.RankError``); None when it has none or it is unreadable:
    dating a failure must not stop the node's report."""
    try:
        return read_rank_error(paths.rank_error(attempt, rank))
    except ContractError:
        return None


def end_strays(paths: JobPaths, attempt: int, node_rank: int, job_id: str, grace: float,
               watcher: ChildWatcher | None = None) -> list[dict[str, Any]]:
    """End what this node's ranks left running (``strays``): SIGTERM, ``grace``, SIGKILL; a stop
    signal meanwhile (``watcher``'s, else one of its own) skips the rest of the grace. Returns them,
    for ``result.json``. Blocking."""
    from . import strays

    ranks = node_ranks(paths, attempt, node_rank)
    dirs = {rank: str(paths.rank_dir(attempt, rank)) for rank in ranks}
    try:
        with ExitStack() as stack:
            watcher = watcher or stack.enter_context(ChildWatcher())
            seen = len(watcher.stop_requests)
            ending = strays.Ending(job_id, attempt, dirs, grace, strays.sessions(ranks))
            while (done := ending.poll()) is None:
                watcher.wait(ending.wait_hint())
                if len(watcher.stop_requests) > seen:
                    done = ending.kill_now()
                    break
    except OSError as exc:  # the node's report matters more than this
        print(f"phalanx agent: could not end what the ranks left running: {exc}", file=sys.stderr, flush=True)
        return []
    return [s.to_dict() for s in done]
