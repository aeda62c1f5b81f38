"""Spec + topology -> one ``NodePlan`` per node: the part of planning every backend shares.

Pure: what the submitting machine knows arrives in ``Topology`` (its addresses, ports, GPU and
CPU counts, the variables already set there), never from ``os`` here.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..core.env import Topology, fills_templates, initializes_jax, node_env, process_env, runs_as_python, template_values
from ..core.paths import JobPaths
from ..core.plan import NodePlan, ProcessPlan, is_late, quote_user_text
from ..core.spec import JobSpec, render_template
from ..secrets.mask import VARS_ENV
from .torchrun import BOOTSTRAP_MODULE, JAX_INIT, torchrun_argv, worker_command

# torchrun's in-place restarts (--max-restarts) hang or fail most of the time when workers
# share the agent's rendezvous TCPStore (see docs/restarts.md); a store per round is reliable.
RESTART_SAFE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def agent_argv(python: str, paths: JobPaths, attempt: int, node_rank: int | str) -> tuple[str, ...]:
    """The node agent's command line; a str ``node_rank`` leaves a placeholder (``{node_rank}``)."""
    return (python, "-m", "phalanx.launch.agent", "--launch", str(paths.node_launch(attempt, node_rank)))


def health_check(spec: JobSpec) -> tuple[str, ...]:
    """What each node runs before an attempt (``launch/nodecheck.py``): the user's shell line,
    or phalanx's own node checks (``health/doctor_probe.py``, a one-second burn); none."""
    if spec.health_check_cmd:
        return ("/bin/sh", "-c", spec.health_check_cmd)
    if spec.health_check:
        return (spec.python, "-m", "phalanx.health.doctor_probe", "--node-only", "--burn", "1")
    return ()


def build_nodes(
    spec: JobSpec, topo: Topology, paths: JobPaths, hosts: tuple[str, ...], local_addrs: tuple[str, ...],
    net_env: Mapping[str, str],
) -> tuple[NodePlan, ...]:
    """Per-node plans. ``paths`` is the job directory as the nodes see it; ``net_env`` holds
    defaults (``GLOO_SOCKET_IFNAME``, ...) that give way to the spec's env and to variables set
    on the submitting machine (``topo.preset_env``)."""
    preset = topo.preset_env or frozenset()
    nodes = []
    for node_rank in range(spec.resources.nnodes):
        env = node_env(spec, topo, node_rank)
        env["PHALANX_FRAMEWORK"] = spec.framework.value
        env["PHALANX_RANK_DIR"] = paths.rank_dir_template(topo.attempt)
        if spec.secrets:  # which variables the bootstrap masks in the ranks' output (names, never values)
            env[VARS_ENV] = ",".join(sorted(spec.secrets))
        for key, value in ({} if runs_as_python(spec) else net_env).items():  # python sets no network variables
            if key not in spec.env and key not in preset:
                env[key] = value
        late = is_late(hosts[node_rank])
        args = tuple(quote_user_text(a) for a in spec.entrypoint.args) if late else spec.entrypoint.args
        if fills_templates(spec):  # never for one plain process: it gets its arguments as python would
            args = render_template(args, template_values(spec, topo, node_rank))
        if late:
            env.update({k: quote_user_text(v) for k, v in spec.env.items()})
        worker = worker_command(spec, args)
        common: dict[str, Any] = dict(
            node_rank=node_rank,
            host=hosts[node_rank],
            agent_argv=agent_argv(spec.python, paths, topo.attempt, node_rank),
            env=env,
            cwd=spec.workdir,
            secrets=dict(spec.secrets),
            health_check=health_check(spec),
        )
        if spec.uses_torchrun:
            nodes.append(
                NodePlan(**common, torchrun_argv=torchrun_argv(spec, topo, node_rank, local_addrs[node_rank]), worker_argv=worker)
            )
        else:
            bootstrap = (BOOTSTRAP_MODULE, JAX_INIT) if initializes_jax(spec) else (BOOTSTRAP_MODULE,)
            procs = tuple(
                ProcessPlan(
                    local_rank=local,
                    rank=node_rank * spec.procs_per_node_started + local,
                    argv=(spec.python, "-u", "-m", *bootstrap, *worker),
                    env=process_env(spec, topo, node_rank, local),
                )
                for local in range(spec.procs_per_node_started)
            )
            nodes.append(NodePlan(**common, processes=procs))
    return tuple(nodes)
