"""``phalanx doctor``: the health check as a job, on the nodes a job with the same options would get.

The check runs as a job of its own (named ``doctor``, tagged ``phalanx=doctor``): the same
backend, hosts, partition, namespace and topology as the user's options say, started, watched
and collected exactly as a job is, so it finds what a job would meet (an unreachable host, a
missing torch, a node that cannot reach node 0). Its program is ``health/doctor_probe.py``, one
process per node (``--spawn self``: no rendezvous to wait for, so a broken node cannot keep the
others from reporting), each burning every device of its node and then meeting the other nodes
for the link matrix. The verdict is read back from the rank logs (``health/doctor_report.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.contracts import read_attempts, read_node_result
from ..core.paths import HomePaths
from ..core.spec import Entrypoint, EntrypointKind, Framework, JobSpec, Spawn
from ..health.checks import Limits, Verdict
from ..health.doctor_report import read, render
from ..launch.procs import signal_name
from ..store import JobRecord, Store
from . import liveness
from .job import supervise
from .leaveout import node_name
from .submit import create_job, plan_job

PROBE = "phalanx.health.doctor_probe"
NAME = "doctor"


@dataclass(frozen=True)
class Diagnosis:
    record: JobRecord  # the doctor's own job (its logs: phalanx logs ID)
    verdict: Verdict
    names: dict[int, str]  # node rank -> host, as the backend knows it
    links: dict[str, Any]  # what node 0 said of the links
    seconds: float
    # Hosts the backend could not use and replaced with spare ones (ssh: --hosts a,b,c -n 2x...):
    # bad too, though the check ran on others.
    replaced: dict[str, str] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return self.verdict.healthy and not self.replaced

    def render(self) -> str:
        text = render(self.verdict, self.names, self.links)
        return text + "".join(f"bad: {host}: could not be used, a spare host was checked instead: {why}\n"
                              for host, why in sorted(self.replaced.items()))

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.record.id, "seconds": round(self.seconds, 3), "names": {str(k): v for k, v in self.names.items()},
                **self.verdict.to_dict(), "healthy": self.healthy, "replaced": self.replaced,
                "links_backend": self.links.get("backend"), "links_error": self.links.get("error")}


def doctor_spec(spec: JobSpec, burn: float = 2.0) -> JobSpec:
    """``spec`` (the user's options) turned into the doctor's job: the probe, one per node."""
    return spec.with_(
        entrypoint=Entrypoint(EntrypointKind.MODULE, PROBE, ("--burn", f"{burn:g}")), spawn=Spawn.SELF,
        framework=Framework.TORCH, name=NAME, state_name="", tags={"phalanx": NAME}, notify=(), metrics=(),
        auto_metrics=False, max_retries=0, no_retry_on=(), stall_timeout=120.0 + burn, channels=(), output_uri=None,
        state_uri=None, skip_if_done=False, health_check=False, health_check_cmd=None, left_out=(),
    )


def diagnose(store: Store, home: HomePaths, spec: JobSpec, events: Callable[[str], None] | None = None,
             burn: float = 2.0, limits: Limits = Limits()) -> Diagnosis:
    """Run the doctor's job to its end (blocking; main thread) and judge what it found."""
    started = time.monotonic()
    spec = doctor_spec(spec, burn)
    plan = plan_job(spec, home)
    record = create_job(store, home, spec, plan, **liveness.identity())
    if events is not None:
        events(f"checking {spec.resources.nnodes} node(s) on {spec.backend} as job {record.id} "
               f"(its logs: phalanx logs {record.id})")
    supervise(store, home, record, plan, events)
    record = store.get(record.id)
    verdict, links, names = judged(record, [n.host for n in plan.nodes], limits)
    unusable = {str(n["node"]): str(n["why"]) for a in read_attempts(record.paths.attempts_log) for n in a.left_out}
    replaced = {host: why for host, why in unusable.items() if host not in names.values()}
    return Diagnosis(record, verdict, names, links, time.monotonic() - started, replaced)


def judged(record: JobRecord, planned_hosts: list[str], limits: Limits = Limits()) -> tuple[Verdict, dict[str, Any], dict[int, str]]:
    """The verdict over a finished doctor job's files, the links said, and each node's name."""
    paths, attempt = record.paths, record.attempt
    # Hosts the backend could not use at all (ssh's preflight) are in the attempts log; then no
    # node ran the check, and the others are "not checked", not bad.
    unusable = {str(n["node"]): str(n["why"]) for a in read_attempts(paths.attempts_log) for n in a.left_out}
    cause = record.root_cause_dict() or {}
    names, why, unchecked = {}, {}, {}
    for node_rank, host in enumerate(planned_hosts):
        result = read_node_result(paths.node_result(attempt, node_rank))
        names[node_rank] = (node_name(result) if result is not None else "") or host
        if result is None and names[node_rank] in unusable:
            why[node_rank] = unusable[names[node_rank]]
        elif result is None and unusable:
            unchecked[node_rank] = f"the check could not start ({cause.get('message', 'see phalanx logs')})"
        elif result is None:
            why[node_rank] = "the node never reported (see phalanx logs)"
        elif result.exitcode != 0:
            how = signal_name(result.exitcode) or f"exit {result.exitcode}"
            why[node_rank] = f"{result.error or 'the check ended'} ({how})"
    logs = {}
    for rank in paths.ranks(attempt):
        try:
            logs[rank] = paths.rank_log(attempt, rank).read_text(errors="replace")
        except OSError:
            continue
    verdict, links = read(logs, len(planned_hosts), why, limits, unchecked)
    return verdict, links, names
