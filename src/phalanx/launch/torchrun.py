"""JobSpec + topology -> the torchrun argv of one node, and the worker command.

Every launch setting is written out explicitly: ``elastic_launch``'s API defaults differ
from the torchrun CLI's, and an explicit argv is what ``--dry-run`` shows and what a user
could paste into a shell.
"""

from __future__ import annotations

from ..core.env import SIGNALS_TO_HANDLE, Topology
from ..core.spec import EntrypointKind, JobSpec, code_root

BOOTSTRAP_MODULE = "phalanx.launch.bootstrap"
# The bootstrap's first option for a process phalanx calls jax.distributed.initialize in
# (core/env.initializes_jax; launch/jaxinit.py).
JAX_INIT = "--jax-init"


def worker_command(spec: JobSpec, args: tuple[str, ...]) -> tuple[str, ...]:
    """What each worker process runs: the bootstrap shim, then the user's entrypoint.

    A script goes as the user typed it (relative to the working directory, which is theirs):
    the bootstrap derives ``sys.argv[0]``, ``__file__`` and ``sys.path[0]`` from it as python
    does. With frozen code (``spec.code_dir``), ``--frozen CODE_DIR ROOT`` tells the bootstrap
    to read Python files under ROOT from their copies under CODE_DIR (``launch/frozen.py``).
    A command runs as given: nothing in it is frozen."""
    entry = spec.entrypoint
    if entry.kind is EntrypointKind.COMMAND:
        return ("--exec", entry.target, *args)
    frozen = ("--frozen", spec.code_dir, code_root(spec)) if spec.code_dir else ()
    if entry.kind is EntrypointKind.MODULE:
        return (*frozen, "--module", entry.target, *args)
    return (*frozen, "--script", entry.typed or entry.target, *args)


def torchrun_argv(spec: JobSpec, topo: Topology, node_rank: int, local_addr: str) -> tuple[str, ...]:
    """Arguments for ``torch.distributed.run`` on node ``node_rank`` (without the program name)."""
    res = spec.resources
    is_host = "true" if node_rank == 0 else "false"
    if spec.rendezvous is not None:
        # One node of a job started by hand on each machine: torchrun gets the rendezvous as typed.
        nnodes = f"{res.min_nodes}:{res.nnodes}" if res.elastic else str(res.nnodes)
        rendezvous: tuple[str, ...] = (f"--nnodes={nnodes}", f"--nproc-per-node={res.nproc_per_node}",
                                       *spec.rendezvous.torchrun_args())
    else:
        rendezvous = (
            f"--nnodes={res.nnodes}",
            f"--nproc-per-node={res.nproc_per_node}",
            f"--node-rank={node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={topo.master_addr}:{topo.master_port}",
            f"--rdzv-id={topo.job_id}",
            # Several agents may share one machine: say who hosts the store instead of guessing.
            f"--rdzv-conf=is_host={is_host},join_timeout=600",
        )
    return (
        *rendezvous,
        f"--max-restarts={spec.max_restarts}",
        f"--monitor-interval={spec.monitor_interval:g}",
        "--start-method=spawn",
        "--role=default",
        *((f"--local-addr={local_addr}",) if spec.rendezvous is None else ()),
        "--redirects=0",
        "--tee=0",
        f"--signals-to-handle={SIGNALS_TO_HANDLE}",
        f"--shutdown-timeout={max(1, int(spec.grace))}",
        "--module",
        BOOTSTRAP_MODULE,
    )
