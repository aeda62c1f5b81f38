"""The backend contract.

A backend turns a :class:`~phalanx.core.spec.JobSpec` into a :class:`~phalanx.launch.plan.Plan`
(``plan``: pure, no side effects, golden-tested) and starts the plan's node agents
(``start``), returning one handle per node that the supervisor watches and signals. The job-level logic
(state in the store, fail-fast, stop with a grace period, root cause) lives once in
:mod:`phalanx.launch.supervisor`, not in each backend.

Public methods are concrete and enforce the contract; backends fill in the narrow ``_hooks``.
"""

from __future__ import annotations

import abc
import socket
from typing import Callable

from ..core.paths import HomePaths, JobPaths
from ..core.spec import JobSpec
from ..errors import UsageError
from ..launch.plan import NodePlan, Plan
from .options import BackendOption, validate

PortSource = Callable[[], int]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the kernel's choice, so two jobs differ)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class NodeHandle(abc.ABC):
    """One running node agent, as seen by the supervisor."""

    node_rank: int
    # Extra seconds after the job's grace before SIGKILL: an agent needs time to run its own
    # grace period for its workers and report back.
    kill_margin: float = 10.0
    # A node agent samples its node's resources itself; a process the supervisor started
    # directly is sampled by the supervisor.
    samples_itself: bool = True

    @abc.abstractmethod
    def poll(self) -> int | None:
        """The agent's exit code (128+N when killed by signal N), or None while it runs. Non-blocking."""

    @abc.abstractmethod
    def signal(self, signum: int) -> None:
        """Send ``signum`` to the agent. Idempotent; a gone agent is not an error."""

    @abc.abstractmethod
    def kill(self) -> None:
        """SIGKILL the agent and everything it started. Idempotent."""

    def running(self) -> bool:
        """Whether the node's processes can run now: False while a scheduler holds the node back
        (queued, requeued, suspended), so the supervisor's stall clock does not count that time.
        Non-blocking; an answer a few seconds old is fine."""
        return True


class Backend(abc.ABC):
    name: str = ""
    options: tuple[BackendOption, ...] = ()
    # Trials of a sweep are packed onto this machine's GPUs or cores; a scheduler places
    # them itself (False), and only --parallel limits how many run at once.
    local_slots: bool = True
    # The platform itself brings the input channels to the nodes and keeps the state directory
    # in step with ``state_uri`` (SageMaker's channels and checkpoints): the supervisor then
    # neither stages inputs here nor syncs the local state directory.
    remote_data: bool = False
    # Seconds ``phalanx stop`` waits, beyond the grace period, for the ranks to end: a platform that
    # stops through its own API (SageMaker's StopTrainingJob) takes minutes to report the end.
    stop_margin: float = 15.0

    def check(self, spec: JobSpec) -> None:
        """Checks that need the outside world (credentials, buckets), run once before the job
        is recorded, so bad input fails with nothing created. Raises UsageError. Default: none."""

    def plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, ports: PortSource = free_port) -> Plan:
        """The plan for one attempt of ``spec``. Pure apart from asking ``ports`` for free ports.

        Raises UsageError when the spec cannot run on this backend.
        """
        if spec.resources.nnodes < 1 or spec.resources.nproc_per_node < 1:
            raise UsageError("a job needs at least 1 node and 1 process per node", "for example -n 2x4")
        spec = spec.with_(backend_options=validate(self.name, self.options, spec.backend_options))
        from ..launch.explain import annotate

        return annotate(self._plan(spec, job_id, attempt, home, home.job(job_id), ports), spec, self.shares_files(spec), home.root)

    def shares_files(self, spec: JobSpec) -> bool:
        """Whether the nodes see this machine's files at the same paths (the user's directory, the
        phalanx home): the job then runs in the user's directory there; otherwise in a shipped copy."""
        return True

    def start(self, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
        """Start every node agent of ``plan``; returns at once (non-blocking), one handle per
        node in node-rank order. Each agent's own output goes to its agent.log."""
        for node in plan.nodes:
            paths.node_dir(plan.attempt, node.node_rank).mkdir(parents=True, exist_ok=True)
        return self._start(plan, paths)

    def _start(self, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
        """Default: one independent start per node. Schedulers that place all nodes at once
        (SLURM) override this."""
        return [self._start_node(node, paths, plan.attempt) for node in plan.nodes]

    def _start_node(self, node: NodePlan, paths: JobPaths, attempt: int) -> NodeHandle:
        raise NotImplementedError

    def attach(self, plan: Plan, paths: JobPaths) -> list[NodeHandle] | None:
        """Handles for ``plan``'s attempt, started earlier by a supervisor that has since vanished
        (the job is LOST), when something of it still runs or waits in a queue; None when nothing
        of it is left, or when this backend's agents die with their supervisor (they cannot be
        left running). Non-blocking; starts nothing. The handles stop and kill as ``start``'s do."""
        return self._attach(plan, paths)

    def _attach(self, plan: Plan, paths: JobPaths) -> list[NodeHandle] | None:
        return None

    @abc.abstractmethod
    def _plan(
        self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, ports: PortSource
    ) -> Plan: ...

