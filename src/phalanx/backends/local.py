"""The local backend: every node agent is a process on this machine.

``-n 2x2`` starts two node agents that really rendezvous (c10d) over loopback, exactly as
two machines would; only the addresses are 127.0.0.1. Networking is pinned to loopback
(``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``) unless the user set it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any
from pathlib import Path

from ..core.env import Topology, node_env, process_env, template_values
from ..core.paths import HomePaths, JobPaths, write_json
from ..core.spec import JobSpec, Framework, in_snapshot, render_template
from ..launch.plan import NodePlan, Plan, ProcessPlan
from ..launch.procs import exit_code, signal_group, signal_name
from ..launch.torchrun import BOOTSTRAP_MODULE, torchrun_argv, worker_command
from . import commands
from .base import Backend, NodeHandle, PortSource

LOOPBACK = "127.0.0.1"

# torchrun's in-place restarts (--max-restarts) hang or fail most of the time when workers
# share the agent's rendezvous TCPStore (see docs/restarts.md); a store per round is reliable.
RESTART_SAFE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def local_gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    gpus = Path("/proc/driver/nvidia/gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else 0


def agent_argv(python: str, paths: JobPaths, attempt: int, node_rank: int | str) -> tuple[str, ...]:
    return (
        python,
        "-m",
        "phalanx.launch.agent",
        "--launch",
        str(paths.node_launch(attempt, node_rank)),
    )


def build_nodes(
    spec: JobSpec, topo: Topology, paths: JobPaths, hosts: tuple[str, ...], local_addrs: tuple[str, ...],
    net_env: dict[str, str],
) -> tuple[NodePlan, ...]:
    """Per-node plans; shared by every backend that runs node agents."""
    nodes = []
    for node_rank in range(spec.resources.nnodes):
        env = node_env(spec, topo, node_rank)
        env["PHALANX_FRAMEWORK"] = spec.framework.value
        env["PHALANX_RANK_DIR"] = paths.rank_dir_template(topo.attempt)
        for key, value in net_env.items():
            if key not in spec.env and key not in os.environ:
                env[key] = value
        args = render_template(spec.entrypoint.args, template_values(spec, topo, node_rank))
        worker = worker_command(spec, args)
        common: dict[str, Any] = dict(
            node_rank=node_rank,
            host=hosts[node_rank],
            agent_argv=agent_argv(spec.python, paths, topo.attempt, node_rank),
            env=env,
            cwd=spec.workdir,
        )
        if spec.uses_torchrun:
            nodes.append(
                NodePlan(**common, torchrun_argv=torchrun_argv(spec, topo, node_rank, local_addrs[node_rank]), worker_argv=worker)
            )
        else:
            procs = tuple(
                ProcessPlan(
                    local_rank=local,
                    rank=node_rank * spec.procs_per_node_started + local,
                    argv=(spec.python, "-u", "-m", BOOTSTRAP_MODULE, *worker),
                    env=process_env(spec, topo, node_rank, local),
                )
                for local in range(spec.procs_per_node_started)
            )
            nodes.append(NodePlan(**common, processes=procs))
    return tuple(nodes)


class LocalBackend(Backend):
    name = "local"

    def _plan(
        self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, ports: PortSource
    ) -> Plan:
        submitted = spec  # what the user's files say (the snapshot may not exist yet)
        if spec.snapshot:
            spec = in_snapshot(spec, str(paths.code_dir))
        nnodes = spec.resources.nnodes
        nworkers = nnodes * spec.procs_per_node_started
        topo = Topology(
            job_id=job_id,
            attempt=attempt,
            node_addrs=(LOOPBACK,) * nnodes,
            master_port=ports(),
            worker_ports=tuple(ports() for _ in range(nworkers)) if spec.framework is Framework.TF else (),
            state_dir=str(home.state_dir(spec.name)),
            output_dir=str(paths.output_dir),
            job_dir=str(paths.root),
            num_gpus=local_gpu_count(),
            channels=tuple((c.name, str(home.channel_path(c))) for c in spec.channels),
        )
        net_env = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", **RESTART_SAFE_ENV}
        hosts = tuple(f"localhost-{i}" if nnodes > 1 else "localhost" for i in range(nnodes))
        nodes = build_nodes(spec, topo, paths, hosts, (LOOPBACK,) * nnodes, net_env)
        plan = Plan(job_id=job_id, attempt=attempt, backend=self.name, nodes=nodes, grace=spec.grace)
        if spec.warm:  # started from this machine's warm interpreter pool (launch/warm.py)
            from ..launch import warm

            plan = warm.apply(plan, submitted, warm.facts())  # facts: a host look-up, as local_gpu_count
        return plan

    def _start_node(self, node: NodePlan, paths: JobPaths, attempt: int) -> NodeHandle:
        log = paths.agent_log(attempt, node.node_rank)
        if node.torchrun_argv is None and len(node.processes) == 1:
            # A lone process needs no agent in between: one interpreter less, so
            # `phalanx run train.py` costs about what `python train.py` does.
            proc = node.processes[0]
            popen = commands.spawn(proc.argv, {**node.env, **proc.env}, log, cwd=node.cwd)
            return SingleProcessNode(node, proc.rank, popen, paths.node_result(attempt, node.node_rank))
        # The agent applies node.env to itself anyway; starting it with it lets a warm agent share
        # its workers' pool (one pool per environment).
        return LocalNode(node.node_rank, commands.spawn(node.agent_argv, node.env, log, cwd=node.cwd))


class SingleProcessNode(NodeHandle):
    """The node's only process, started by the supervisor itself; writes the node's result.json."""

    kill_margin = 0.0  # no agent in between that has its own grace period
    samples_itself = False

    def __init__(self, node: NodePlan, rank: int, proc: subprocess.Popen[bytes], result: Path) -> None:
        self.node_rank = node.node_rank
        self.host = node.host
        self.rank = rank
        self.proc = proc
        self.result = result
        self.started = time.time()
        self._signalled: int | None = None

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and not self.result.exists():
            self._write_result(code)
        return None if code is None else exit_code(code)

    def _write_result(self, code: int) -> None:
        status = {"pid": self.proc.pid, "exitcode": exit_code(code)}
        failed = code != 0 and self._signalled is None
        failure = {**status, "rank": self.rank, "signal": signal_name(code), "timestamp": time.time()}
        result = {
            "node_rank": self.node_rank, "host": self.host, "exitcode": exit_code(code),
            "failures": [failure] if failed else [], "ranks": {str(self.rank): status},
            "started": self.started, "finished": time.time(),
        }
        if self._signalled is not None:
            result["stopped_by"] = signal.Signals(self._signalled).name
        write_json(self.result, result)

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self._signalled = signum
            signal_group(self.proc.pid, signum)

    def kill(self) -> None:
        self._signalled = self._signalled or signal.SIGKILL
        signal_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.poll()


class LocalNode(NodeHandle):
    def __init__(self, node_rank: int, proc: subprocess.Popen[bytes]) -> None:
        self.node_rank = node_rank
        self.proc = proc

    def poll(self) -> int | None:
        code = self.proc.poll()
        return None if code is None else exit_code(code)

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        # The agent leads its own session; its workers lead theirs and die with it
        # (PR_SET_PDEATHSIG in the bootstrap), so killing the agent's group suffices.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
