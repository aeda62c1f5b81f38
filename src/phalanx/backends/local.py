"""The local backend: every node agent is a process on this machine.

``-n 2x2`` starts two node agents that really rendezvous (c10d) over loopback, exactly as
two machines would; only the addresses are 127.0.0.1. Networking is pinned to loopback
(``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``) unless the user set it.

Node agents are kept between attempts (``launch/control.py``): a retry runs on the agents of
the attempt before, which have torch imported already; an agent that died is replaced.
"""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import replace
from typing import Callable

from ..core.contracts import NodeResult, Stray
from ..core.env import Topology
from ..core.paths import HomePaths, JobPaths, read_json
from ..core.plan import NodePlan, Plan
from ..core.spec import Framework, JobSpec, in_snapshot
from ..launch import strays, trace
from ..launch.console import RELAY, RELAY_ENV, TTY_ENV, Console, Streams
from ..launch.control import AgentControl
from ..launch.nodes import RESTART_SAFE_ENV, build_nodes
from ..launch.procs import exit_code, signal_group, signal_name
from . import commands
from .base import Backend, Facts, NodeHandle, synthesize

LOOPBACK = "127.0.0.1"


class LocalBackend(Backend):
    name = "local"
    _lent: Console | None = None
    _grace = 30.0  # the plan's, for what a lone process leaves running (set by _start)
    warm_starts = True  # its Python processes start here, from this interpreter (launch/warm/plan.py)

    def _plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, facts: Facts) -> Plan:
        if spec.snapshot:
            spec = in_snapshot(spec, str(paths.code_dir))
        nnodes = spec.resources.nnodes
        nworkers = nnodes * spec.procs_per_node_started
        topo = Topology(
            job_id=job_id,
            attempt=attempt,
            node_addrs=(LOOPBACK,) * nnodes,
            master_port=facts.port(0),
            worker_ports=tuple(facts.port(1 + i) for i in range(nworkers)) if spec.framework is Framework.TF else (),
            state_dir=str(home.state_dir(spec.state_key)),
            output_dir=str(paths.output_dir),
            job_dir=str(paths.root),
            num_gpus=facts.host.gpus,
            channels=tuple((c.name, str(home.channel_path(c))) for c in spec.channels),
            num_cpus=facts.host.cpus,
            preset_env=frozenset(facts.host.env),
        )
        net_env = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", **RESTART_SAFE_ENV}
        hosts = tuple(f"localhost-{i}" if nnodes > 1 else "localhost" for i in range(nnodes))
        nodes = build_nodes(spec, topo, paths, hosts, (LOOPBACK,) * nnodes, net_env)
        if spec.rendezvous is not None:  # this machine is one node; the others are started elsewhere
            nodes = (replace(nodes[spec.rendezvous.node_rank or 0], host="localhost"),)
        return Plan(job_id=job_id, attempt=attempt, backend=self.name, nodes=nodes, grace=spec.grace)

    def lends_console(self, plan: Plan) -> bool:
        return len(plan.nodes) == 1 and _lone(plan.nodes[0])

    def _start(self, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
        # The terminal goes to the job's only process; a node's lone process of a bigger job
        # writes to its log like every other rank.
        self._lent = self.console if self.lends_console(plan) else None
        self._grace = plan.grace
        return super()._start(plan, paths)

    def _start_node(self, node: NodePlan, paths: JobPaths, attempt: int) -> NodeHandle:
        log = paths.agent_log(attempt, node.node_rank)
        # At a terminal, rank 0 writes to a pseudo-terminal of its size (isatty() as under torchrun).
        size = self.console.terminal_size() if self.console is not None and node.node_rank == 0 else None
        tty = {TTY_ENV: f"{size[0]}x{size[1]}"} if size else {}
        # Secret values reach the process through the environment it is started with (execve),
        # never its argv or a file; its bootstrap masks them in its output (phalanx.secrets.mask).
        secrets = self.secret_env(node)
        if _lone(node):
            # A lone process needs no agent in between: one interpreter less, so
            # `phalanx run train.py` costs about what `python train.py` does.
            proc = node.processes[0]
            if self._lent is None:
                popen = commands.spawn(proc.argv, {**node.env, **proc.env, **tty, **secrets}, log, cwd=node.cwd)
                return SingleProcessNode(node, proc.rank, popen, paths, attempt, self._grace)
            # Lent the terminal, it writes to phalanx's relay, which masks what it copies.
            streams = self._lent.open(paths.rank_log(attempt, proc.rank), list(secrets.values()))
            try:
                popen = commands.spawn(proc.argv, {**node.env, **proc.env, RELAY_ENV: RELAY, **secrets}, log,
                                       cwd=node.cwd, stdio=streams.child)
            except BaseException:
                streams.abandon()
                raise
            streams.started()
            return SingleProcessNode(node, proc.rank, popen, paths, attempt, self._grace, streams)
        control = AgentControl()
        line = control.agent_end.fileno()
        # The agent applies node.env to itself anyway; starting it with it lets a warm agent share
        # its workers' pool (one pool per environment; secrets are left out of a pool's own).
        agent_env = {**node.env, **tty, **secrets}
        try:
            agent = commands.spawn((*node.agent_argv, "--control", str(line)), agent_env, log, cwd=node.cwd,
                                   pass_fds=(line,))
        except BaseException:
            control.agent_end.close()
            control.close()
            raise
        control.started()
        return LocalNode(node, agent, paths, attempt, control, self.secret_env)


def _lone(node: NodePlan) -> bool:
    return node.torchrun_argv is None and len(node.processes) == 1


class SingleProcessNode(NodeHandle):
    """The node's only process, started by the supervisor itself; its result is written here."""

    kill_margin = 0.0  # no agent in between that has its own grace period
    samples_itself = False

    def __init__(self, node: NodePlan, rank: int, proc: subprocess.Popen[bytes], paths: JobPaths, attempt: int,
                 grace: float, streams: Streams | None = None) -> None:
        self.streams = streams  # its output relayed from the terminal lent to it, into its log
        self.node_rank = node.node_rank
        self.host = node.host
        self.rank = rank
        self.proc = proc
        self.paths, self.attempt = paths, attempt
        self.started = time.time()
        self.grace = grace
        self.job_id = node.env.get("PHALANX_JOB_ID", "")
        self._signalled: int | None = None
        self._result: NodeResult | None = None
        self._strays: strays.Ending | None = None
        self._ended_at = 0.0

    def poll(self) -> NodeResult | None:
        if self.streams is not None and self.streams.log_error is not None and self._signalled is None:
            raise self.streams.log_error  # its log cannot be written (disk full): the supervisor ends the job
        if self._result is None:
            code = self.proc.poll()
            if code is None:
                return None
            if self._strays is None:  # what it left running ends with it (launch/strays.py), without blocking
                self._ended_at = time.time()
                proc = read_json(self.paths.rank_proc(self.attempt, self.rank)) or {}
                self._strays = strays.Ending(self.job_id, self.attempt,
                                             {self.rank: str(self.paths.rank_dir(self.attempt, self.rank))}, self.grace,
                                             strays.sessions({self.rank: proc}))
            ended = self._strays.poll()
            if ended is None:
                return None
            if self.streams is not None:
                self.streams.join()  # its last words are in its log before anyone reads it
            self._result = synthesize(self.paths, self.attempt, self._report(code, tuple(ended)))
        return self._result

    def wait_hint(self) -> float | None:
        return self._strays.wait_hint() if self._strays is not None and self._result is None else None

    def _report(self, code: int, left: tuple[Stray, ...]) -> NodeResult:
        from ..core.contracts import RankExit, RankFailure

        failed = code != 0 and self._signalled is None
        failures = (RankFailure(self.rank, exit_code(code), self._ended_at, pid=self.proc.pid, signal=signal_name(code)),) if failed else ()
        return NodeResult(
            self.node_rank, exit_code(code), self.host, failures, ranks={self.rank: RankExit(exit_code(code), self.proc.pid)},
            stopped_by=signal.Signals(self._signalled).name if self._signalled is not None else None,
            started=self.started, finished=time.time(), strays=left,
        )

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self._signalled = signum
            signal_group(self.proc.pid, signum)

    def kill(self) -> None:
        self._signalled = self._signalled or signal.SIGKILL
        signal_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        if self.poll() is None and self._strays is not None:  # the grace is over for what it left, too
            self._strays.kill_now()
            self.poll()


class LocalNode(NodeHandle):
    """A node agent started here; it writes the node's result itself. The agent is kept: once
    its attempt has ended it waits on its control line, for the next attempt (``rerun``) or to
    be let go (``release``)."""

    def __init__(self, node: NodePlan, proc: subprocess.Popen[bytes], paths: JobPaths, attempt: int,
                 control: AgentControl, secret_env: Callable[[NodePlan], dict[str, str]]) -> None:
        self.secret_env = secret_env  # the backend's: a rerun's secrets are read again, for its attempt
        self.node_rank = node.node_rank
        self.node = node
        self.proc = proc
        self.control = control
        self.paths, self.attempt = paths, attempt
        self._signalled: int | None = None
        self._result: NodeResult | None = None
        self._handed_over = False

    def _reported(self) -> bool:
        """The agent said this attempt is over (and wrote its result); it may live on."""
        return self.attempt in self.control.ends

    def poll(self) -> NodeResult | None:
        if self._result is None:
            if self._reported():
                self._result = synthesize(self.paths, self.attempt, NodeResult.synthesize(
                    self.node_rank, self.control.ends[self.attempt], f"node agent {self.node_rank} reported the end "
                    "of its attempt but no result"))
                return self._result
            code = self.proc.poll()
            if code is None:
                return None
            code = exit_code(code)
            # An agent that ends writes its result first; one that was killed leaves none.
            stopped = signal.Signals(self._signalled).name if self._signalled is not None and code > 128 else None
            self._result = synthesize(self.paths, self.attempt, NodeResult.synthesize(
                self.node_rank, code, f"node agent {self.node_rank} ended ({signal_name(code) or f'exit code {code}'}) "
                "without reporting", stopped_by=stopped))
        return self._result

    def signal(self, signum: int) -> None:
        if self._reported() or self.proc.poll() is not None:
            return  # this attempt is over; a kept agent waits for the supervisor's next word
        self._signalled = signum
        try:
            self.proc.send_signal(signum)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        if self._reported():
            return
        # The agent leads its own session; its workers lead theirs and die with it
        # (PR_SET_PDEATHSIG in the bootstrap), so killing the agent's group suffices.
        self._signalled = signal.SIGKILL
        if self.proc.poll() is None:  # not reaped yet: the pid is still the agent's
            signal_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def rerun(self, node: NodePlan, paths: JobPaths, attempt: int) -> NodeHandle | None:
        # The agent's interpreter and working directory were chosen when it started.
        same = (node.agent_argv[:1], node.cwd) == (self.node.agent_argv[:1], self.node.cwd)
        if self._handed_over or not same or not self._reported() or self.proc.poll() is not None:
            return None
        if not self.control.run(str(paths.node_launch(attempt, node.node_rank)), str(paths.agent_log(attempt, node.node_rank)),
                                self.secret_env(node)):
            return None
        self._handed_over = True
        trace.mark(paths, "supervisor", "agent kept", attempt=attempt, node=node.node_rank, pid=self.proc.pid)
        return LocalNode(node, self.proc, paths, attempt, self.control, self.secret_env)

    def release(self) -> None:
        if self._handed_over:
            return
        self.control.close()
        try:
            self.proc.wait(timeout=5)  # an agent between attempts leaves at once
        except subprocess.TimeoutExpired:
            signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
