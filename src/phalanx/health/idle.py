"""Is a job doing anything? From its nodes' resource samples: for ``--idle-timeout``.

A job with GPUs is busy while any GPU of its nodes works (NVML utilisation above
``GPU_IDLE_UTIL``, as the idle-GPU hint counts it); a job without GPUs while any rank's process
tree uses more than ``CPU_IDLE`` percent of a core, or prints. A sample with neither GPUs nor
ranks (before the ranks start) says nothing. Pure.
"""

from __future__ import annotations

from typing import Any

GPU_IDLE_UTIL = 2.0  # NVML's utilisation of an idle device hovers at 0-1 %
CPU_IDLE = 5.0  # percent of one core: a process asleep in a loop, a heartbeat thread


def busy(sample: dict[str, Any]) -> bool | None:
    """Was the job busy when ``sample`` was taken? None: the sample cannot say."""
    gpus = [g for g in sample.get("gpus") or () if "util" in g]
    if gpus:
        return any(float(g["util"]) > GPU_IDLE_UTIL for g in gpus)
    ranks = sample.get("ranks") or {}
    if not ranks:
        return None
    return any(float(r.get("cpu_percent", 0.0)) > CPU_IDLE for r in ranks.values())


def has_gpus(sample: dict[str, Any]) -> bool:
    return any("util" in g for g in sample.get("gpus") or ())


def reason(idle_for: float, gpus: bool) -> str:
    """Why an idle job was ended, in words."""
    from .progress import human

    if gpus:
        return f"idle for {human(idle_for)}: no GPU of the job's nodes was busy above {GPU_IDLE_UTIL:g}% (--idle-timeout)"
    return (f"idle for {human(idle_for)}: no rank used more than {CPU_IDLE:g}% of a core and none printed anything "
            "(--idle-timeout)")
