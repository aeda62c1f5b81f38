"""Which nodes an attempt's end points at: the ones a retry should leave out. Pure.

A node is pointed at when

- it failed its check before the attempt (``--health-check``: its ``result.json`` carries
  ``health.ok: false``);
- the root cause is on it and names the machine rather than the script: a rank killed by
  SIGBUS (memory that went bad under it, or a full ``/dev/shm``), an ECC or Xid message of the
  GPU driver, a NIC error (InfiniBand verbs, NCCL's network transport, a link gone down);
- the root cause is that the node was lost: the connection to its host ended without its exit
  (ssh), or its scheduler says the node failed (SLURM's NODE_FAIL).

A script's own error (an exception, exit 1, a CUDA out of memory) points at no node: another
machine would not fix it. A NIC error names the node whose rank saw it; the fault may sit at the
other end of the link, which the doctor's link matrix (``phalanx doctor``) tells apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

# (pattern over the root cause's message, traceback and log tail; what it means)
MACHINE_FAULTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bXid\b[^\n]{0,80}", re.I), "an Xid error (the GPU driver's fault report)"),
    (re.compile(r"(uncorrectable|uncorrected|double[- ]bit)[^\n]{0,20}ECC|ECC error", re.I), "an ECC error"),
    (re.compile(r"GPU has fallen off the bus", re.I), "the GPU fell off the bus"),
    (re.compile(r"NCCL WARN NET/IB|ibv_\w+ failed|IBV_WC_\w+ERR|transport retry counter exceeded|"
                r"\bmlx5\w*: .*(error|fatal)|NIC Link is Down|Link is Down", re.I), "a NIC error"),
)


@dataclass(frozen=True)
class Pointed:
    node_rank: int
    why: str


def pointed(cause: Mapping[str, Any] | None, results: Sequence[Any]) -> list[Pointed]:
    """The nodes (by node rank) that the attempt's end points at, each with the reason in words.
    ``results``: the attempt's ``NodeResult``s in node order; ``cause``: its root cause."""
    out: dict[int, str] = {}
    for node_rank, result in enumerate(results):
        health = (getattr(result, "details", None) or {}).get("health")
        if isinstance(health, Mapping) and health.get("ok") is False:
            out[node_rank] = f"failed its health check: {health.get('reason') or 'exit ' + str(health.get('exitcode'))}"
    where = cause.get("node_rank") if cause else None
    if cause and isinstance(where, int):
        why = machine_fault(cause, results[where] if where < len(results) else None)
        if why is not None:
            out.setdefault(where, why)
    return [Pointed(n, why) for n, why in sorted(out.items())]


def machine_fault(cause: Mapping[str, Any], result: Any = None) -> str | None:
    """What in the root cause blames the machine, in words; None when it is the script's."""
    if cause.get("signal") == "SIGBUS":
        return "a rank died of SIGBUS (bad memory, or /dev/shm full)"
    text = "\n".join(str(cause.get(key) or "") for key in ("message", "traceback", "log_tail"))
    for pattern, what in MACHINE_FAULTS:
        match = pattern.search(text)
        if match:
            return f"{what}: {match.group(0).strip()[:120]}"
    if result is not None and getattr(result, "synthesized", False):
        error = str(getattr(result, "error", "") or "")
        details = getattr(result, "details", None) or {}
        if getattr(result, "exitcode", None) == 255 and "connection to" in error:
            return "its host could not be reached (the connection ended without the node's exit)"
        if details.get("slurm_state") == "NODE_FAIL":
            return "SLURM reports the node failed (NODE_FAIL)"
    return None
