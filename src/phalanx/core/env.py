"""The environment contract: what every training process sees (docs/environment.md).

Pure functions of (spec, topology, node, process). torchrun adds its own RANK/LOCAL_RANK/...
for the workers it starts; for processes phalanx starts directly, ``process_env`` sets the
same variables so scripts cannot tell the difference. A job given no topology runs as python
would run it, with none of them (``runs_as_python``), except what its ``--framework`` asks for
(``--framework tf``: a one-worker ``TF_CONFIG``, as SageMaker gives a one-instance
MultiWorkerMirroredStrategy job). Which jobs get their ``{node_rank}``-style arguments filled in
(``fills_templates``) and which get ``jax.distributed.initialize`` called for them
(``initializes_jax``) is decided here too, once.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Mapping

from .spec import Framework, JobSpec, Spawn, channel_env_name


@dataclass(frozen=True)
class Topology:
    """Where a job's nodes are, decided by the backend at plan time."""

    job_id: str
    attempt: int
    node_addrs: tuple[str, ...]  # rank order; node 0 hosts the rendezvous
    master_port: int  # torchrun's c10d store / MASTER_PORT / JAX coordinator
    worker_ports: tuple[int, ...]  # one per process, for TF_CONFIG
    state_dir: str
    output_dir: str
    job_dir: str
    num_gpus: int = 0  # per node
    channels: tuple[tuple[str, str], ...] = ()  # (name, local path) of each input channel
    # The submitting machine's CPU count and the variables set there (``launch/host.py``);
    # None: read them here (plans pass them in, so they stay pure).
    num_cpus: int | None = None
    preset_env: frozenset[str] | None = None

    @property
    def master_addr(self) -> str:
        return self.node_addrs[0]

    def host_names(self) -> list[str]:
        """Distinct names for SM_HOSTS: the addresses if distinct, else node-<i>."""
        if len(set(self.node_addrs)) == len(self.node_addrs):
            return list(self.node_addrs)
        return [f"node-{i}" for i in range(len(self.node_addrs))]


def template_values(spec: JobSpec, topo: Topology, node_rank: int) -> dict[str, object]:
    return {
        "node_rank": node_rank,
        "num_nodes": spec.resources.nnodes,
        "nproc_per_node": spec.resources.nproc_per_node,
        "master_addr": topo.master_addr,
        "master_port": topo.master_port,
        "job_id": topo.job_id,
        "state_dir": topo.state_dir,
        "output_dir": topo.output_dir,
    }


def node_env(spec: JobSpec, topo: Topology, node_rank: int) -> dict[str, str]:
    """Variables shared by every process of one node (user env last: it wins)."""
    hosts = topo.host_names()
    env = {
        "PHALANX_JOB_ID": topo.job_id,
        "PHALANX_JOB_NAME": spec.name,
        "PHALANX_ATTEMPT": str(topo.attempt),
        "PHALANX_NUM_NODES": str(spec.resources.nnodes),
        "PHALANX_NODE_RANK": str(node_rank),
        "PHALANX_NODE_ADDRS": ",".join(topo.node_addrs),
        "PHALANX_NPROC_PER_NODE": str(spec.resources.nproc_per_node),
        "PHALANX_STATE_DIR": topo.state_dir,
        "PHALANX_OUTPUT_DIR": topo.output_dir,
        "PHALANX_JOB_DIR": topo.job_dir,
        # SageMaker-compatible aliases, so SageMaker-style scripts run unchanged.
        "SM_HOSTS": json.dumps(hosts),
        "SM_CURRENT_HOST": hosts[node_rank],
        "SM_NUM_GPUS": str(topo.num_gpus),
        "SM_NUM_CPUS": str(topo.num_cpus if topo.num_cpus is not None else os.cpu_count() or 1),
        "SM_MODEL_DIR": topo.output_dir,
        "SM_OUTPUT_DATA_DIR": topo.output_dir,
        "SM_CHANNELS": json.dumps(sorted(name for name, _ in topo.channels)),
        # Output must reach the per-rank log files as it is printed, not at exit.
        "PYTHONUNBUFFERED": "1",
    }
    for name, path in topo.channels:
        env[f"PHALANX_CHANNEL_{channel_env_name(name)}"] = path
        env[f"SM_CHANNEL_{channel_env_name(name)}"] = path
    preset = topo.preset_env if topo.preset_env is not None else os.environ
    if spec.resources.nproc_per_node > 1 and "OMP_NUM_THREADS" not in preset:
        # torchrun's own default; set explicitly so direct launches behave the same.
        env["OMP_NUM_THREADS"] = "1"
    env.update(spec.env)
    return env


def wandb_run_id(job_id: str) -> str:
    """The W&B run id of a job: fixed by the job id, so every attempt, a ``resume`` and the script's
    own ``wandb.init()`` (handed ``WANDB_RUN_ID``) are the same run."""
    return f"phalanx-{job_id}"


# The places a tracker's client reads from its environment (``--track`` records them at submit).
TRACKER_PLACES = {
    "mlflow": ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"),
    "wandb": ("WANDB_PROJECT", "WANDB_ENTITY", "WANDB_MODE", "WANDB_BASE_URL"),
}


def tracker_env(kinds: tuple[str, ...], config: Mapping[str, str], job_id: str, group: str,
                mlflow_run: str | None) -> dict[str, str]:
    """With ``--track``: what a script's own tracker code reads to continue the job's run, on every
    process of every attempt: the places the job tracks to; ``MLFLOW_RUN_ID`` once the run exists;
    the W&B run (``WANDB_RUN_ID``, resumed: ``WANDB_RESUME=allow``) in the job's group
    (``WANDB_RUN_GROUP``: the job id, a sweep's id for its trials), which is also how scripts that
    log from every rank keep their runs together."""
    env: dict[str, str] = {}
    for kind in ("mlflow", "wandb"):
        if kind in kinds:
            env.update({name: config[name] for name in TRACKER_PLACES[kind] if config.get(name)})
    if "mlflow" in kinds and mlflow_run:
        env["MLFLOW_RUN_ID"] = mlflow_run
    if "wandb" in kinds:
        env.update({"WANDB_RUN_ID": wandb_run_id(job_id), "WANDB_RESUME": "allow", "WANDB_RUN_GROUP": group})
    return env


# What torchrun's agent sets for every worker it starts (torch/distributed/elastic/agent/
# server/local_elastic_agent.py, _start_workers; launcher/api.py, TORCHELASTIC_SIGNALS_TO_HANDLE;
# torch 2.13), besides TORCHELASTIC_ERROR_FILE (the bootstrap sets that one, launch/bootstrap.py):
# libraries read any of them as "an outside launcher started me".
TORCHRUN_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE",
)


# The signals torchrun forwards to its workers (--signals-to-handle), SLURM's SIGUSR1/SIGUSR2
# preemption warnings included; workers see the list in TORCHELASTIC_SIGNALS_TO_HANDLE.
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"


def runs_as_python(spec: JobSpec) -> bool:
    """No topology given: one process, started as ``python`` starts it, with no launcher
    variables at all. Lightning, Accelerate and DeepSpeed read LOCAL_RANK/RANK/WORLD_SIZE as
    "a launcher already started my workers"; a Trainer(devices=2) would then wait for a
    second rank that never comes. An explicit ``-n 1`` is torchrun's ``--nproc-per-node 1``."""
    return not spec.resources.explicit and spec.resources.world_size == 1


def fills_templates(spec: JobSpec) -> bool:
    """Whether ``{node_rank}``-style placeholders in the script's arguments are filled in: wherever
    phalanx starts each node's processes for a topology (``--spawn self``, ``-n``/``--nnodes``,
    TF and JAX with one), not for one plain process, which gets its arguments as python would."""
    return spec.spawn is Spawn.SELF or not runs_as_python(spec)


def initializes_jax(spec: JobSpec) -> bool:
    """Whether phalanx calls ``jax.distributed.initialize`` in each process before the script
    (``launch/jaxinit.py``): ``--framework jax`` with a topology, unless the program starts and
    connects its processes itself (``--spawn self``)."""
    return spec.framework is Framework.JAX and spec.spawn is Spawn.AUTO and not runs_as_python(spec)


def tf_config(spec: JobSpec, topo: Topology, rank: int) -> str:
    """``TF_CONFIG`` for worker ``rank``: every process a worker, worker 0 the chief, and
    ``"environment": "cloud"`` as SageMaker (sagemaker-tensorflow-training-toolkit,
    ``training._build_tf_config_for_mwms``) and Kubeflow's TFJob set it."""
    nlocal = spec.procs_per_node_started
    workers = [
        f"{topo.node_addrs[n]}:{topo.worker_ports[n * nlocal + i]}"
        for n in range(spec.resources.nnodes)
        for i in range(nlocal)
    ]
    return json.dumps({"cluster": {"worker": workers}, "environment": "cloud", "task": {"type": "worker", "index": rank}})


def process_env(spec: JobSpec, topo: Topology, node_rank: int, local_rank: int) -> dict[str, str]:
    """Per-process variables for processes phalanx starts itself (no torchrun in between):
    torchrun's own set, so a worker cannot tell who started it (``--spawn self``: as
    ``torchrun --nproc-per-node 1`` gives them, RANK the node's rank, WORLD_SIZE the number of
    nodes, which scripts like the ImageNet example scale by their own workers); none for a
    job that runs as python, but ``--framework tf``'s one-worker ``TF_CONFIG``."""
    if runs_as_python(spec):
        return {"TF_CONFIG": tf_config(spec, topo, 0)} if spec.framework is Framework.TF else {}
    nlocal = spec.procs_per_node_started
    world = spec.resources.nnodes * nlocal
    rank = node_rank * nlocal + local_rank
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(nlocal),
        "GROUP_RANK": str(node_rank),
        "GROUP_WORLD_SIZE": str(spec.resources.nnodes),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": topo.master_addr,
        "MASTER_PORT": str(topo.master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
        "TORCHELASTIC_RUN_ID": topo.job_id,
        # No agent store here: rank 0's init_process_group hosts the TCPStore at MASTER_PORT.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "TORCHELASTIC_SIGNALS_TO_HANDLE": SIGNALS_TO_HANDLE,
    }
    if spec.framework is Framework.JAX:
        env["JAX_COORDINATOR_ADDRESS"] = f"{topo.master_addr}:{topo.master_port}"
        env["JAX_NUM_PROCESSES"] = str(world)
        env["JAX_PROCESS_ID"] = str(rank)
    elif spec.framework is Framework.TF:
        env["TF_CONFIG"] = tf_config(spec, topo, rank)
    return env


def python_as_typed() -> str:
    """The interpreter for the job's processes: this one, named as ``python`` on the user's PATH
    names it when that is the same interpreter (``sys.executable`` of ``python train.py`` in an
    activated venv is ``.venv/bin/python``, while phalanx's own entry point says ``python3``)."""
    import shutil
    import sys

    typed = shutil.which("python")
    try:
        if typed and os.path.samefile(typed, sys.executable):
            return os.path.abspath(typed)
    except OSError:
        pass
    return sys.executable


def merged(*layers: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for layer in layers:
        out.update(layer)
    return out
