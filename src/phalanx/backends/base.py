"""The backend interface: how N node agents start somewhere, and nothing else.

A backend is one class (and whatever modules it keeps beside it) registered under a name in the
``phalanx.backends`` entry-point group. ``docs/backends.md`` walks through writing one. The
calls, in the order the supervisor (``phalanx.supervise``) makes them::

    facts = backend.facts(spec)                               # impure, once per plan
    plan = backend.plan(spec, job_id, attempt, home, facts)    # pure: what --dry-run prints
    handles = backend.start(plan, paths)                       # non-blocking: one handle per node
    ... every tick: handle.poll(), handle.running(), handle.collect()
    ... to stop:   handle.signal(SIGTERM), after the grace period handle.kill()
    ... at the end: handle.collect(final=True)
    ... a retry:   backend.start(next_plan, paths, previous=handles)   # kept agents run it
    ... the last:  handle.release()

and, for an attempt whose supervisor vanished: ``backend.attach(plan, paths)``.

The public methods here are concrete and enforce the contract once; a backend fills in the
narrow hooks (``_facts``, ``_plan``, ``_start`` or ``_start_node``, ``_attach``).

What the supervisor does and a backend therefore must not: touch the store; decide retries,
the outcome or the root cause; print (say things through ``NodeResult.error``, the node's
``agent.log`` or an exception's message); read configuration or the environment in ``plan``
(ask in ``facts``); start a process except through ``backends/commands.py`` (or call an API
except through its own client module); join job-directory paths by hand (``core/paths.py``);
write launch or result files except through ``core/contracts.py``; import ``supervise``,
``sweeps``, ``jobs``, ``query``, ``cli`` or ``web`` (a test enforces the layers); import its
SDK at module level (``phalanx ps`` must stay fast); kill processes by name; block in ``poll``;
put a secret's value anywhere but the ranks' environment, by the platform's safest way (no
argv, no file, no plan, no manifest, no log: ``secret_env``, docs/secrets.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import abc
import random
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.contracts import NodeResult, read_node_result, write_node_result
from ..core.paths import HomePaths, JobPaths
from ..core.plan import NodePlan, Plan
from ..core.spec import Framework, JobSpec
from ..errors import BackendError, SecretError, UsageError
from ..launch.console import Console
from ..launch.explain import annotate
from ..launch.host import HostFacts
from .options import BackendOption, validate

if TYPE_CHECKING:  # the records of jobs whose supervisor a backend hosts (k8s --in-cluster)
    from ..store import JobRecord, Store

Events = Callable[[str], None]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now, that stays free until the job binds it: one below the kernel's
    ephemeral range (net.ipv4.ip_local_port_range), because every outgoing connection and every
    port-0 listener (gloo's pair sockets, another job's TCPStore) draws from that range and could
    take a port the kernel had just handed out here, before torchrun binds it (EADDRINUSE).
    Chosen at random (from the OS, not a generator a warm pool's forks share) so that two jobs
    started at once differ; the kernel's choice where the range leaves no room below it."""
    low = _ephemeral_low()
    if low - _LOWEST_PORT >= 1000:
        pick = random.SystemRandom()
        for _ in range(64):
            port = pick.randrange(_LOWEST_PORT, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_LOWEST_PORT = 10000  # below: the well-known ports of databases, dashboards, Ray's 6379/8265


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; elsewhere only a lower bound matters


@dataclass(frozen=True)
class Facts:
    """Everything a plan needs from the world, found by ``Backend.facts``. Backends that need
    more (resolved addresses, cluster context) subclass it."""

    host: HostFacts
    ports: tuple[int, ...] = ()  # free ports on the rendezvous host, in the order the plan uses them
    single_files: frozenset[str] = frozenset()  # inputs whose local source is one file (backends that ship inputs)

    def port(self, index: int) -> int:
        if index >= len(self.ports):
            raise UsageError(f"the plan needs {index + 1} free port(s) but the facts hold {len(self.ports)}",
                             "gather facts with Backend.facts(spec) before planning")
        return self.ports[index]


class NodeHandle(abc.ABC):
    """One node of a started attempt, as the supervisor sees it.

    Every method is non-blocking (an answer a few seconds old is fine) unless it says
    otherwise, and may be called from the supervisor's loop only (not thread-safe)."""

    node_rank: int
    # Extra seconds after the job's grace before SIGKILL: an agent needs time to run its own
    # grace period for its workers and report back.
    kill_margin: float = 10.0
    # A node agent samples its node's resources itself; a process the supervisor started
    # directly is sampled by the supervisor.
    samples_itself: bool = True
    # For an attached attempt: what a person can look up ("SLURM job 4711"), and when it was
    # submitted (None: unknown).
    where: str = ""
    submitted: float | None = None

    @abc.abstractmethod
    def poll(self) -> NodeResult | None:
        """None while the node runs (or waits in a queue); once it has ended, its result: the
        one its agent wrote, or one synthesized in its place (``synthesize``) when it never
        reported. Idempotent once ended. Non-blocking; never raises for a node that died."""

    @abc.abstractmethod
    def signal(self, signum: int) -> None:
        """Send ``signum`` to the node's agent (which forwards it to the ranks). Idempotent; a
        node that has ended is not an error. The supervisor owns the grace period: it calls
        ``kill`` when that is over. Concerns this handle's attempt only: once that has ended,
        an agent kept for the next attempt is not signalled."""

    @abc.abstractmethod
    def kill(self) -> None:
        """End the node now (SIGKILL to the agent and everything it started, or the
        scheduler's equivalent). Idempotent. May block for a few seconds while the kill lands.
        Like ``signal``, nothing once this handle's attempt has ended."""

    def rerun(self, node: NodePlan, paths: JobPaths, attempt: int) -> "NodeHandle | None":
        """Run the next attempt's ``node`` on this node's agent, kept alive after this handle's
        attempt ended, and return the new attempt's handle; None when this node has no agent
        left to run it (default: agents run one attempt), and ``Backend.start`` starts a new
        one. The launch file is in ``paths`` already. Non-blocking. Called by ``Backend.start``
        only, after this handle's attempt has ended."""
        return None

    def release(self) -> None:
        """The supervisor starts no further attempt on this node's agent: let a kept agent go
        (it exits; nothing of the job is left on the node). Idempotent, non-blocking or briefly
        blocking; nothing for a handle whose agent was handed to a later attempt (``rerun``)."""

    def wait_hint(self) -> float | None:
        """Seconds within which this handle wants its next ``poll`` (a node ending what its
        processes left running, ``launch/strays.py``); None: whenever (child exits and the
        supervisor's own tick wake it)."""
        return None

    def running(self) -> bool:
        """Whether the node's processes can run now: False while a scheduler holds the node back
        (queued, requeued, suspended), so the supervisor's stall clock does not count that time."""
        return True

    def collect(self, final: bool = False) -> None:
        """Bring what the node wrote elsewhere (logs, metrics, its result) into the local job
        directory. Called every tick and once with ``final`` after the node ended; ``final``
        must leave everything local. Default: nothing, for nodes that write into the local job
        directory themselves (local processes, a shared filesystem, a link that mirrors as it
        goes)."""


def synthesize(paths: JobPaths, attempt: int, result: NodeResult) -> NodeResult:
    """The node's own result when it wrote one; else ``result`` (``NodeResult.synthesize``),
    written in its place so that status and the supervisor read the same. For handles whose
    node ended without a word: killed, lost, never started."""
    assert result.node_rank is not None
    path = paths.node_result(attempt, result.node_rank)
    reported = read_node_result(path)
    if reported is not None:
        return reported
    write_node_result(path, result)
    return result


class Backend(abc.ABC):
    name: str = ""
    # Options of this backend: they become --flags of ``phalanx run`` and job-file keys, and
    # arrive validated in ``spec.backend_options``.
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
    # How a retry avoids a node found bad (``JobSpec.left_out``, by the name in its node's
    # ``NodeResult``: ``node_name`` or ``host``): "exclude" (the plan places no node there: ssh
    # spare hosts, SLURM's --exclude, Kubernetes node anti-affinity), "new" (every attempt gets
    # new machines: SageMaker, SkyPilot), or "" (it cannot: this machine, Ray).
    leaves_out: str = ""
    # Set by a foreground ``phalanx run`` at a shell: the terminal a lone process may be lent
    # (``launch/console.py``: stdin, and stdout/stderr relayed as they come). Backends that
    # start no process here ignore it.
    console: Console | None = None

    def lends_console(self, plan: Plan) -> bool:
        """Whether ``start`` runs ``plan`` as one process here that can be lent ``console``."""
        return False

    # The plan's Python processes start on this machine with its interpreter, so the supervisor
    # may start them from the warm pool (``launch/warm/plan.py``, applied in ``supervise.submit``).
    warm_starts: bool = False
    # Where ``secret_env`` reads secret values: None is this user's own store on this machine
    # (``phalanx.secrets.local``); a team server's supervisor sets the store of the job's owner.
    secret_store: Any = None

    def check_secrets(self, spec: JobSpec, online: bool = True) -> None:
        """Every secret ``spec`` names exists and may be read, before the job is recorded (the
        values are dropped at once). Default: in ``secret_store`` (this user's own). ``online``
        False (``--dry-run``): only what needs no cluster or cloud. Raises SecretError (exit 2)."""
        if spec.secrets:
            from ..secrets.resolve import check
            from ..secrets.server import for_spec

            check(spec.secrets, self.secret_store or for_spec(spec, _open_store))

    def secret_env(self, node: NodePlan) -> dict[str, str]:
        """The values of ``node``'s secrets (``NodePlan.secrets``: variable -> secret name), read
        now, for ``start`` to hand to the node's ranks and nothing else. Called at every start, so
        a retry gets each value as it is then. Raises BackendError (the attempt could not start)
        when one no longer exists or may not be read."""
        if not node.secrets:
            return {}
        from ..secrets.resolve import resolve

        try:
            return resolve(node.secrets, self.secret_store)
        except SecretError as exc:
            raise BackendError(exc.message, exc.hint) from None

    def validated(self, spec: JobSpec) -> JobSpec:
        """``spec`` with this backend's options checked and their defaults filled in. Raises
        UsageError naming a bad option and the valid ones."""
        if spec.resources.nnodes < 1 or spec.resources.nproc_per_node < 1:
            raise UsageError("a job needs at least 1 node and 1 process per node", "for example -n 2x4")
        return spec.with_(backend_options=validate(self.name, self.options, spec.backend_options))

    def avoids(self, spec: JobSpec) -> str:
        """How a retry of ``spec`` avoids a node found bad: ``leaves_out``, unless the job's
        options pin the machines (a SkyPilot cluster the user named)."""
        return self.leaves_out

    def check(self, spec: JobSpec) -> None:
        """Checks that need the outside world (credentials, buckets), run once before the job
        is recorded, so bad input fails with nothing created. Raises UsageError. Default: none."""

    def host_supervisor(self, record: JobRecord, plan: Plan, events: Events | None = None) -> dict[str, Any] | None:
        """A detached job (``-d``) whose supervisor this backend runs itself, away from this
        machine (k8s ``--in-cluster``: a supervisor pod): start it and return the job's
        supervisor columns. None (the default): a supervisor process here."""
        return None

    def stop_elsewhere(self, store: Store, record: JobRecord, events: Events | None,
                       stop_attempt: Callable[..., Any]) -> JobRecord:
        """``phalanx stop`` of a job whose supervisor ``host_supervisor`` started; its record.
        ``stop_attempt(store, record, events)`` stops what a lost supervisor left running
        (``supervise.leftover.stop``, passed in: backends sit below supervise)."""
        raise NotImplementedError(f"the {self.name} backend hosts no supervisors")

    # The jobs whose supervisor this backend hosts, seen from any machine (``query``, ``ps``).
    # Only backends named in ``builtin.HOSTS_SUPERVISORS`` are asked.

    def refresh_hosted(self, store: Store, record: JobRecord, home: HomePaths) -> JobRecord:
        """``record`` (a job it supervises) brought up to date in ``store`` from where it runs."""
        return record

    def find_hosted(self, ref: str, store: Store, home: HomePaths) -> JobRecord | None:
        """The job of id ``ref`` that this home never saw, imported into ``store``; None if none."""
        return None

    def import_hosted(self, store: Store, home: HomePaths) -> int:
        """Every job it supervises, imported into or refreshed in ``store``; how many."""
        return 0

    def describe_hosted(self, record: JobRecord) -> str:
        """Where the supervisor of ``record`` runs, in words."""
        return f"supervised by the {self.name} backend"

    def shares_files(self, spec: JobSpec) -> bool:
        """Whether the nodes see this machine's files at the same paths (the user's directory, the
        phalanx home): the job then runs in the user's directory there; otherwise in a shipped copy."""
        return True

    def facts(self, spec: JobSpec, host: HostFacts | None = None) -> Facts:
        """What a plan of ``spec`` needs from the world (free ports, addresses, cluster
        context), read now: the only impure look-up before planning. Blocking, briefly (it may
        ask a host or an API). Raises UsageError when the spec cannot be looked up (unknown
        host), BackendError when the world does not answer."""
        return self._facts(self.validated(spec), host or HostFacts.read())

    def plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, facts: Facts) -> Plan:
        """The plan for one attempt of ``spec``: ``_plan`` is a pure function of its arguments
        (no files, no environment, no network; what it needs is in ``facts``). The plan then
        gets its notes, what the script will see in words (``launch/explain.py``: it reads the
        script's imports, and lists the code root for a shipped copy). Raises UsageError when
        the spec cannot run on this backend."""
        spec = self.validated(spec)
        plan = self._plan(spec, job_id, attempt, home, home.job(job_id), facts)
        return annotate(plan, spec, self.shares_files(spec), home.root)

    def start(self, plan: Plan, paths: JobPaths, previous: Sequence[NodeHandle] = ()) -> list[NodeHandle]:
        """Start every node agent of ``plan``; returns one handle per node, in node-rank order,
        without waiting for the nodes (it may block briefly: a submission, a preflight, copying
        the code). Each node's launch file (``contracts.LaunchFile``) is in ``paths`` already.
        Not idempotent: every call starts the nodes again. Raises BackendError when nothing
        could be started (then nothing runs).

        ``previous``: the handles of the job's attempt before this one (all ended), for a retry.
        A node whose agent was kept (``NodeHandle.rerun``) runs the new attempt on it; the
        others get a new agent. Every handle of ``previous`` is either handed over or released."""
        for node in plan.nodes:
            paths.node_dir(plan.attempt, node.node_rank).mkdir(parents=True, exist_ok=True)
        kept = _rerun(plan, paths, previous)
        try:
            if not kept:
                return self._start(plan, paths)
            return [kept.get(n.node_rank) or self._start_node(n, paths, plan.attempt) for n in plan.nodes]
        except BaseException:
            for handle in kept.values():  # none of the attempt may run on without a supervisor
                handle.kill()
                handle.release()
            raise

    def attach(self, plan: Plan, paths: JobPaths) -> list[NodeHandle] | None:
        """Handles for ``plan``'s attempt, started earlier by a supervisor that has since vanished,
        when something of it still runs or waits in a queue; None when nothing of it is left,
        or when this backend's nodes die with their supervisor (they cannot be left running).
        Starts nothing; may ask the scheduler once. The handles stop and kill as ``start``'s do."""
        return self._attach(plan, paths)

    # -- hooks ---------------------------------------------------------------------------------

    def _facts(self, spec: JobSpec, host: HostFacts) -> Facts:
        """Default: the host and the free ports a plan on this machine's loopback needs."""
        return Facts(host, tuple(free_port() for _ in range(ports_needed(spec))))

    @abc.abstractmethod
    def _plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, facts: Facts) -> Plan:
        """``plan`` for a validated spec; ``paths`` is ``home.job(job_id)``. Pure."""

    def _start(self, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
        """Default: one independent start per node. Schedulers that place all nodes at once
        (SLURM) override this."""
        return [self._start_node(node, paths, plan.attempt) for node in plan.nodes]

    def _start_node(self, node: NodePlan, paths: JobPaths, attempt: int) -> NodeHandle:
        raise NotImplementedError(f"the {self.name} backend implements neither _start nor _start_node")

    def _attach(self, plan: Plan, paths: JobPaths) -> list[NodeHandle] | None:
        return None


def _rerun(plan: Plan, paths: JobPaths, previous: Sequence[NodeHandle]) -> dict[int, NodeHandle]:
    """The new attempt's handles of the nodes whose kept agents run it; every other handle of
    ``previous`` released."""
    kept: dict[int, NodeHandle] = {}
    nodes = {n.node_rank: n for n in plan.nodes}
    for old in previous:
        node = nodes.get(old.node_rank)
        handle = old.rerun(node, paths, plan.attempt) if node is not None else None
        if handle is None:
            old.release()
        else:
            kept[old.node_rank] = handle
    return kept


def ports_needed(spec: JobSpec) -> int:
    """The rendezvous port, and one per worker for TF_CONFIG."""
    workers = spec.resources.nnodes * spec.procs_per_node_started
    return 1 + (workers if spec.framework is Framework.TF else 0)


def _open_store() -> Any:
    """The store the settings name (a team server's, in its processes)."""
    from .. import config
    from ..core.paths import HomePaths
    from ..store import open_store

    return open_store(HomePaths(config.home()).db)
