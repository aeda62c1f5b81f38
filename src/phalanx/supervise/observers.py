"""What the supervisor watches while an attempt runs: the ranks' output (metrics, and the stall
clock: the last new byte any rank printed), resource samples of nodes that have no agent to
sample them, and, on a stall, every rank's Python stacks."""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any, Callable

from ..backends.base import NodeHandle
from ..core.contracts import NodeResult
from ..core.paths import JobPaths, read_json
from ..core.spec import JobSpec
from ..monitor import logindex

Events = Callable[[str], None]


class Watch:
    """One attempt's metrics, samplers and stall clock. ``collect`` is cheap when nothing
    changed and bounded when a job floods its output."""

    EVERY = 1.0  # seconds between reads of the ranks' output

    def __init__(self, paths: JobPaths, attempt: int, spec: JobSpec, handles: list[NodeHandle], say: Events,
                 observer: Any = None) -> None:
        from ..monitor.metrics import MetricsCollector

        self.paths, self.attempt, self.spec, self.say = paths, attempt, spec, say
        self.handles = handles
        # observer: told of every piece of output and every value read (the attempt's health guard)
        self.collector = MetricsCollector(paths, attempt, spec.metrics, spec.auto_metrics, observer)
        self.collected_at = 0.0
        # The stall clock runs from here, or from when the last node the scheduler held back runs.
        self.stall_from = time.time()
        self.samplers = [self._sampler(h.node_rank) for h in handles if not h.samples_itself]

    def _sampler(self, node_rank: int) -> Any:
        from ..health.straggler_probe import StateProbe
        from ..monitor.resources import ResourceSampler, rank_pids

        paths, attempt = self.paths, self.attempt

        def pids() -> dict[int, int]:
            return rank_pids(paths, attempt, node_rank)

        return ResourceSampler(paths.node_resources(attempt, node_rank), node_rank, pids, self.spec.sample_interval,
                               StateProbe(pids)).start()

    def due(self) -> bool:
        return time.monotonic() - self.collected_at >= self.EVERY

    def collect(self, final: bool = False) -> None:
        """Bring the nodes' files here (``NodeHandle.collect``), then read new output for metrics."""
        self.collected_at = time.monotonic()
        for handle in self.handles:
            handle.collect(final)
        try:
            # Bounded reads keep the loop responsive when a job floods its output.
            self.collector.poll(final=final, max_bytes=None if final else 32 << 20)
        except OSError as exc:  # metrics are an aid; never let them stop the job
            self.say(f"warning: reading metrics failed: {exc}")
        logindex.note(self.paths, self.attempt)  # logs --since: how long each log is now

    def silent_for(self) -> float:
        """Seconds since any rank printed, not counting time a scheduler held a node back."""
        now = time.time()
        if not all(h.running() for h in self.handles):
            self.stall_from = now  # queued, requeued or suspended: nothing could print
        # The metrics collector reads every rank's output anyway: its last new byte is the activity.
        return now - max(self.collector.last_activity, self.stall_from)

    def close(self) -> None:
        for sampler in self.samplers:
            sampler.stop()


def _local_ranks(paths: JobPaths, attempt: int) -> list[dict[str, Any]]:
    """The ``proc.json`` of every rank of ``attempt`` that ran on this machine (a pid on another
    host means nothing here)."""
    here = (socket.gethostname(), os.uname().nodename, None)
    procs = [read_json(paths.rank_proc(attempt, rank)) or {} for rank in paths.ranks(attempt)]
    return [p for p in procs if p.get("pid") and p.get("host") in here]


def dump_stacks(paths: JobPaths, attempt: int) -> None:
    """SIGUSR2 to every rank on this machine: the bootstrap's faulthandler prints all Python
    stacks to its log."""
    for proc in _local_ranks(paths, attempt):
        try:
            os.kill(int(proc["pid"]), signal.SIGUSR2)
        except (ProcessLookupError, PermissionError):
            pass
    time.sleep(1.0)  # let faulthandler write before the ranks are stopped


def end_stragglers(paths: JobPaths, attempt: int, timeout: float = 10.0) -> None:
    """Once every node of ``attempt`` has ended: wait until every rank of it on this machine has
    ended too, SIGKILLing any still there, so that no rank outlives the attempt. A killed node
    agent's death reaches its ranks a moment later (PR_SET_PDEATHSIG; a warm rank through its
    pool), on a loaded machine after the supervisor would have reported; and a rank that
    cleared its death signal would not die of it at all. A pid now held by a process started
    after the rank recorded itself is someone else's."""
    local = _local_ranks(paths, attempt)
    if not local:
        return
    try:
        import psutil
    except ImportError:  # a supervisor without psutil (a Kubernetes supervisor pod) has no local ranks
        return
    ranks = []
    for proc in local:
        try:
            process = psutil.Process(int(proc["pid"]))
            if process.create_time() <= float(proc.get("started") or 0) + 1.0:  # psutil's clock: 1 s steps of boot time
                ranks.append(process)
        except (psutil.Error, ValueError):
            continue
    deadline = time.monotonic() + timeout
    while ranks and time.monotonic() < deadline:
        for process in ranks:
            try:
                process.kill()
            except psutil.Error:
                pass
        ranks = [p for p in ranks if _running(p)]
        if ranks:
            time.sleep(0.05)


def end_left_strays(paths: JobPaths, attempt: int, job_id: str, results: list[NodeResult]) -> list[NodeResult]:
    """For nodes whose agent never reported (killed at the end of the grace period, or lost):
    what their ranks on this machine left running, which that agent did not get to end
    (``launch/strays.py``), is killed now (their grace is spent) and added to the node's result."""
    from dataclasses import replace

    from ..core.contracts import write_node_result
    from ..launch import strays
    from ..launch.exits import node_ranks

    here = (socket.gethostname(), os.uname().nodename, None)
    updated = []
    for result in results:
        node = result.node_rank
        if result.synthesized and node is not None:
            ranks = {rank: proc for rank, proc in node_ranks(paths, attempt, node).items() if proc.get("host") in here}
            dirs = {rank: str(paths.rank_dir(attempt, rank)) for rank in ranks}
            ended = strays.end(job_id, attempt, dirs, 0.0, strays.sessions(ranks)) if dirs else []
            if ended:
                result = replace(result, strays=(*result.strays, *ended))
                write_node_result(paths.node_result(attempt, node), result)
        updated.append(result)
    return updated


def _running(process: Any) -> bool:
    import psutil

    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
