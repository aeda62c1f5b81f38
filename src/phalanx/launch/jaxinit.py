"""JAX's multi-process start for ``--framework jax``, whether or not the script calls
``jax.distributed.initialize()`` itself.

Every JAX multi-process example calls it, with no arguments or with arguments of its own taken
from the environment. JAX reads only ``JAX_COORDINATOR_ADDRESS`` from the environment and
refuses a second call ("should only be called once"). So, in each worker of a multi-process
JAX job (``JAX_PROCESS_ID`` set by phalanx, see ``core/env.py``), ``prepare`` wraps
``jax.distributed.initialize`` so that:

- arguments the call leaves out come from phalanx's ``JAX_COORDINATOR_ADDRESS``,
  ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (and, with several processes per node, one
  local device each, as JAX does under SLURM); the script's own arguments win;
- a call once the system is up (the script's second, or its first after phalanx's) returns at
  once when it asks for the same processes, and fails saying why when it does not;

and, when the script's source has no such call (``launch/imports.py``), makes it before the
script runs.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable


def _defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    env = os.environ
    asked = dict(kwargs)
    given = [k for k in ("coordinator_address", "num_processes", "process_id") if asked.get(k) is not None]
    asked.setdefault("coordinator_address", None)
    asked["coordinator_address"] = asked["coordinator_address"] or env["JAX_COORDINATOR_ADDRESS"]
    if asked.get("num_processes") is None:
        asked["num_processes"] = int(env["JAX_NUM_PROCESSES"])
    if asked.get("process_id") is None:
        asked["process_id"] = int(env["JAX_PROCESS_ID"])
    if not given and asked.get("local_device_ids") is None and asked.get("cluster_detection_method") is None:
        per_node = int(env.get("PHALANX_NPROC_PER_NODE", "1"))
        if per_node > 1:
            asked["local_device_ids"] = [int(env.get("LOCAL_RANK", "0"))]
        # Nothing left to detect: a scheduler's variables (SLURM's, seen by the node agent's
        # processes) would otherwise pin each process to one device.
        asked["cluster_detection_method"] = "deactivate"
    return asked


def wrap(initialize: Callable[..., Any], is_initialized: Callable[[], bool], state: Any) -> Callable[..., Any]:
    """``initialize`` that fills in phalanx's values and tolerates a consistent second call."""

    def phalanx_initialize(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, **kwargs: Any) -> None:
        asked = _defaults({"coordinator_address": coordinator_address, "num_processes": num_processes,
                           "process_id": process_id, **kwargs})
        if is_initialized():
            have = (getattr(state, "num_processes", None), getattr(state, "process_id", None))
            if have != (asked["num_processes"], asked["process_id"]):
                raise RuntimeError(
                    f"jax.distributed is already initialized as process {have[1]} of {have[0]} "
                    f"(phalanx's JAX_PROCESS_ID/JAX_NUM_PROCESSES); this call asks for process "
                    f"{asked['process_id']} of {asked['num_processes']}")
            return None
        return initialize(**asked)

    phalanx_initialize.__doc__ = initialize.__doc__
    phalanx_initialize.__wrapped__ = initialize  # type: ignore[attr-defined]
    return phalanx_initialize


def prepare(script: str | None) -> None:
    """Wrap ``jax.distributed.initialize``; initialize now unless ``script`` calls it itself."""
    import jax
    import jax.distributed
    from jax._src import distributed as impl

    wrapped = wrap(jax.distributed.initialize, jax.distributed.is_initialized, impl.global_state)
    jax.distributed.initialize = wrapped  # type: ignore[assignment]
    calls = False
    if script is not None:
        from .imports import read_imports

        found = read_imports(script)
        calls = bool(found and found.calls_jax_initialize)
    if not calls:
        wrapped()
    sys.stdout.flush()
