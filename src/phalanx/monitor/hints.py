"""Plain-language hints from resource samples and metrics: say it when the data says so.

``hints(resources, metrics)`` looks at the recent window of the latest attempt and returns
short sentences, most important first. Each rule has its thresholds as named constants with
the reason for their value. The rules stay quiet when the data is too thin to judge.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

# Judge the recent past, not the whole run: start-up (imports, data download, compile) looks
# like an idle GPU and busy CPUs, and would otherwise trigger hints for the rest of the job.
WINDOW_S = 120.0
# At least this many samples in the window: one or two can be a checkpoint save or an
# evaluation pass.
MIN_SAMPLES = 3

# Data-loading bottleneck: GPUs waiting (mean util below 50 %) while the CPUs are saturated
# (above 90 % of all cores). Either alone is normal: small models leave GPUs idle, and
# CPU-heavy augmentation with a fed GPU is fine.
GPU_STARVED_UTIL = 50.0
CPU_SATURATED = 90.0

# GPU memory above 95 % of the device: the caching allocator already holds what it can, so
# the next larger batch or longer sequence is an out-of-memory error.
GPU_MEM_FULL = 0.95

# An idle GPU (util at most 2 %, counting NVML's noise) for three minutes while the job runs:
# usually a rank on the wrong device (all ranks on cuda:0) or a GPU the job never uses.
GPU_IDLE_UTIL = 2.0
GPU_IDLE_S = 180.0

# A slow rank is the health package's to name (health/straggler.py): status says it on its own line.


def hints(resources: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> list[str]:
    """Hints for the latest attempt in ``resources`` (samples) and ``metrics`` (records)."""
    out: list[str] = []
    samples = _latest_attempt(resources)
    by_node: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        by_node[int(s.get("node_rank", 0))].append(s)
    for node, node_samples in sorted(by_node.items()):
        node_samples.sort(key=lambda s: s.get("time", 0.0))
        out.extend(_data_loading(node, node_samples))
        out.extend(_gpu_memory(node, node_samples))
        out.extend(_idle_gpus(node, node_samples))
    return out


def _latest_attempt(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not items:
        return []
    latest = max(int(i.get("attempt", 0)) for i in items)
    return [i for i in items if int(i.get("attempt", 0)) == latest]


def _window(samples: list[dict[str, Any]], seconds: float = WINDOW_S) -> list[dict[str, Any]]:
    end = samples[-1].get("time", 0.0)
    return [s for s in samples if s.get("time", 0.0) >= end - seconds]


def _data_loading(node: int, samples: list[dict[str, Any]]) -> list[str]:
    recent = [s for s in _window(samples) if s.get("gpus")]
    if len(recent) < MIN_SAMPLES:
        return []
    utils = [g["util"] for s in recent for g in s["gpus"] if "util" in g]
    cpus = [s["cpu_percent"] for s in recent if "cpu_percent" in s]
    if not utils or not cpus:
        return []
    gpu, cpu = sum(utils) / len(utils), sum(cpus) / len(cpus)
    if gpu < GPU_STARVED_UTIL and cpu > CPU_SATURATED:
        return [f"node {node}: GPUs average {gpu:.0f}% busy while the CPUs are {cpu:.0f}% busy: "
                "data loading may be the bottleneck: more DataLoader workers (num_workers), "
                "pin_memory=True, or lighter CPU-side augmentation?"]
    return []


def _gpu_memory(node: int, samples: list[dict[str, Any]]) -> list[str]:
    out = []
    for g in samples[-1].get("gpus", []):
        used, total = g.get("mem_used"), g.get("mem_total")
        if used is not None and total and used / total > GPU_MEM_FULL:
            out.append(f"node {node}: GPU {g.get('index')} memory is {100 * used / total:.0f}% full "
                       f"({used / 2**30:.1f} of {total / 2**30:.1f} GiB): close to out-of-memory; a smaller "
                       "batch, mixed precision or activation checkpointing would give headroom")
    return out


def _idle_gpus(node: int, samples: list[dict[str, Any]]) -> list[str]:
    """GPUs whose utilisation stayed idle for the last GPU_IDLE_S seconds of samples."""
    if not samples or not samples[-1].get("gpus"):
        return []
    end = samples[-1].get("time", 0.0)
    idle_since: dict[int, float] = {}
    busy: set[int] = set()
    for s in reversed(samples):  # walk back from now until each GPU was last busy
        for g in s.get("gpus", []):
            index = g.get("index")
            if index in busy or "util" not in g:
                continue
            if g["util"] <= GPU_IDLE_UTIL:
                idle_since[index] = s.get("time", end)
            else:
                busy.add(index)
    out = []
    for index, since in sorted(idle_since.items()):
        idle = end - since
        if idle >= GPU_IDLE_S:
            out.append(f"node {node}: GPU {index} has been idle for {idle / 60:.0f} min: is every rank on its "
                       "own device (torch.cuda.set_device(LOCAL_RANK)), and does the job use this GPU at all?")
    return out
