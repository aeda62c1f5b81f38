"""``jax.distributed.initialize`` called by phalanx, before the script, in each process of a
``--framework jax`` job with a topology (``core/env.initializes_jax``; never under ``--spawn
self``, whose program connects its processes itself).

JAX allows one call per process ("distributed.initialize should only be called once"), and JAX
programs call it themselves: in the script, with or without arguments, or deep in a library
(JAX's own multi-process test harness calls ``jax._src.distributed.initialize`` from its flag
handling). So after phalanx's call a later one, by whatever name it was reached, must behave as
the program expects: JAX's one state (``jax._src.distributed.global_state``) gets an
``initialize`` that

- returns at once when the call asks for the processes phalanx connected (the same
  ``num_processes`` and ``process_id``, and ``local_device_ids`` where both give them; what it
  leaves out is JAX's to fill in, and phalanx filled it in). The coordinator address is a
  meeting point, not part of the answer: every process already met at phalanx's;
- otherwise goes on to JAX's own ``initialize``, which raises JAX's own error, with a note
  saying what phalanx initialized;
- after ``jax.distributed.shutdown()`` is JAX's own again.

Phalanx's values come from the variables it sets (``core/env.process_env``):
``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``; with several processes
per node one local device each (``LOCAL_RANK``), as JAX does under SLURM; no cluster detection
(a scheduler's variables, seen by the node agent's processes, would otherwise pin each process
to one device).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping

ARGUMENTS = ("coordinator_address", "num_processes", "process_id", "local_device_ids")


def phalanx_values(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The arguments phalanx calls ``initialize`` with, from the process's variables."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {
        "coordinator_address": env["JAX_COORDINATOR_ADDRESS"],
        "num_processes": int(env["JAX_NUM_PROCESSES"]),
        "process_id": int(env["JAX_PROCESS_ID"]),
        "cluster_detection_method": "deactivate",
    }
    if int(env.get("PHALANX_NPROC_PER_NODE", "1")) > 1:
        values["local_device_ids"] = [int(env.get("LOCAL_RANK", "0"))]
    return values


def differences(used: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """What a later call (``State.initialize``'s arguments) asks for that phalanx's call did not
    give: ``name=value`` each; empty when it asks for the same processes."""
    asked = dict(zip(ARGUMENTS, args))
    asked.update({k: v for k, v in kwargs.items() if k in ARGUMENTS})
    out = []
    for name in ("num_processes", "process_id", "local_device_ids"):
        value = asked.get(name)
        if isinstance(value, int) and name == "local_device_ids":
            value = [value]
        mine = used.get(name)
        if value is not None and mine is not None and list_or(value) != list_or(mine):
            out.append(f"{name}={value!r}")
    return out


def list_or(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def guard(state: Any, used: dict[str, Any]) -> Callable[..., Any]:
    """``state.initialize`` (bound, JAX's own) behind the rule above; installed on ``state``."""
    original = state.initialize

    def initialize(*args: Any, **kwargs: Any) -> Any:
        if state.client is None:  # never initialized, or shut down: JAX's own call
            return original(*args, **kwargs)
        other = differences(used, args, kwargs)
        if not other:
            return None
        try:
            return original(*args, **kwargs)
        except RuntimeError as exc:
            exc.add_note(f"phalanx initialized jax.distributed before the script (--framework jax) as process "
                         f"{used['process_id']} of {used['num_processes']} at {used['coordinator_address']}; "
                         f"this call asks for {', '.join(other)}")
            raise

    initialize.__wrapped__ = original  # type: ignore[attr-defined]
    return initialize


def initialize() -> None:
    """Phalanx's call, and the guard for every later one."""
    from jax._src import distributed

    state = distributed.global_state
    used = phalanx_values()
    distributed.initialize(**used)
    state.initialize = guard(state, used)  # type: ignore[method-assign]
    sys.stdout.flush()
