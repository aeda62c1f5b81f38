"""What a job used: GPU-hours and CPU-hours (devices x wall time, per attempt), and with the
``prices`` setting its estimated cost.

- **Wall time** per attempt comes from ``attempts.jsonl`` (start and end of every finished
  attempt); the attempt still running counts up to now. On SageMaker it is the billable
  seconds SageMaker reports per attempt (``scheduler.json``), what AWS charges.
- **GPUs per node**: SageMaker's instance type, SkyPilot's ``--gpus``, SLURM's
  ``--gpus-per-node``; elsewhere what the resource samples saw the job's ranks use (one GPU
  per process, as phalanx packs them, at most as many as the node has).
- **CPU-hours**: one core per process (how phalanx packs CPU jobs) x wall time.
- **Cost** (``prices``: a mapping of instance type, GPU model or ``cpu`` to a price per hour):
  the instance type's price x nodes x hours when listed, else the GPU model's x GPU-hours
  (a key matches a GPU whose name contains it: ``H100`` matches ``NVIDIA H100 80GB HBM3``),
  else ``cpu`` x CPU-hours. None when no price applies.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.paths import JobPaths, read_json
from ..core.state import TERMINAL, JobState

# GPUs per SageMaker instance (AWS's instance type tables for ml.p3/p4/p5 and ml.g4dn/g5/g6/g6e).
_SAGEMAKER_GPUS = {
    "ml.p3.2xlarge": 1, "ml.p3.8xlarge": 4, "ml.p3.16xlarge": 8, "ml.p3dn.24xlarge": 8,
    "ml.p4d.24xlarge": 8, "ml.p4de.24xlarge": 8, "ml.p5.48xlarge": 8, "ml.p5e.48xlarge": 8, "ml.p5en.48xlarge": 8,
    "ml.g4dn.12xlarge": 4, "ml.g5.12xlarge": 4, "ml.g5.24xlarge": 4, "ml.g5.48xlarge": 8,
    "ml.g6.12xlarge": 4, "ml.g6.24xlarge": 4, "ml.g6.48xlarge": 8,
    "ml.g6e.12xlarge": 4, "ml.g6e.24xlarge": 4, "ml.g6e.48xlarge": 8,
}
_SAGEMAKER_MODELS = {"ml.p3": "V100", "ml.p4d": "A100", "ml.p4de": "A100", "ml.p5": "H100", "ml.p5e": "H200",
                     "ml.p5en": "H200", "ml.g4dn": "T4", "ml.g5": "A10G", "ml.g6": "L4", "ml.g6e": "L40S"}


@dataclass
class Usage:
    gpu_hours: float = 0.0
    cpu_hours: float = 0.0
    cost: float | None = None
    wall_hours: float = 0.0
    gpus_per_node: int = 0
    gpu_model: str | None = None
    instance_type: str | None = None
    billed: bool = False  # wall time from the platform's bill (SageMaker)
    priced_by: str | None = None  # the price key that gave the cost
    attempts: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _attempt_spans(record: Any, paths: JobPaths, now: float) -> list[tuple[int, float, float]]:
    """(attempt, start, end) of every attempt that ran; the running one ends now."""
    spans: dict[int, tuple[float, float]] = {}
    try:
        lines = paths.attempts_log.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            entry = json.loads(line)
            attempt, start, end = int(entry["attempt"]), float(entry["started"]), float(entry["ended"])
        except (ValueError, KeyError, TypeError):
            continue
        if attempt not in spans:  # a leftover stopped later logs the same attempt again
            spans[attempt] = (start, end)
    current = int(record.attempt)
    if current not in spans and record.started_at is not None:
        start = float(record.started_at)
        if spans:  # a retry: this attempt began when the previous one ended
            start = max(start, max(e for _, e in spans.values()))
        ended = record.ended_at if record.state in TERMINAL else None
        if record.state is JobState.RUNNING or record.state is JobState.STOPPING or ended is not None:
            spans[current] = (start, float(ended) if ended is not None else now)
    return [(a, s, max(s, e)) for a, (s, e) in sorted(spans.items())]


def _spec_options(record: Any) -> tuple[dict[str, Any], int]:
    try:
        spec = json.loads(record.spec_json)
    except (TypeError, ValueError):
        return {}, int(record.nnodes) * int(record.nproc_per_node)
    resources = spec.get("resources") or {}
    procs = int(resources.get("nnodes", record.nnodes)) * int(resources.get("nproc_per_node", record.nproc_per_node))
    return dict(spec.get("backend_options") or {}), procs


def declared_gpus(backend: str, options: dict[str, Any]) -> tuple[int | None, str | None]:
    """GPUs per node and their model as the job asked for them, or (None, None)."""
    if backend == "sagemaker":
        itype = str(options.get("instance_type") or "ml.m5.xlarge")
        family = itype.rsplit(".", 1)[0]
        gpus = _SAGEMAKER_GPUS.get(itype, 1 if family in _SAGEMAKER_MODELS else 0)
        return gpus, _SAGEMAKER_MODELS.get(family)
    if backend == "skypilot" and options.get("gpus"):
        text = str(options["gpus"]).strip("{} ").split(",")[0]
        model, _, count = text.partition(":")
        try:
            return max(1, int(float(count or 1) + 0.999)), model.strip() or None
        except ValueError:
            return 1, model.strip() or None
    if backend == "slurm" and options.get("gpus_per_node"):
        return int(options["gpus_per_node"]), None
    return None, None


def _sampled_gpus(paths: JobPaths, attempt: int, nproc_per_node: int) -> tuple[int, str | None]:
    """GPUs the ranks of an attempt used, per node, as its latest resource samples show."""
    from .resources import latest_samples

    used, model = 0, None
    for sample in latest_samples(paths, attempt).values():
        gpus = sample.get("gpus") or []
        if not gpus:
            continue
        model = model or gpus[0].get("name")
        ranks = sample.get("ranks") or {}
        on_gpu = sum(1 for r in ranks.values() if (r.get("gpu_mem") or 0) > 0)
        used = max(used, min(len(gpus), max(on_gpu, nproc_per_node if on_gpu else 0)))
    return used, model


def job_usage(record: Any, now: float | None = None, prices: dict[str, float] | None = None) -> Usage:
    """The usage of a job, from its directory and record (reads a few small files)."""
    now = time.time() if now is None else now
    paths = record.paths
    options, procs = _spec_options(record)
    nnodes = int(record.nnodes)
    declared, model = declared_gpus(record.backend, options)
    usage = Usage(instance_type=options.get("instance_type") if record.backend in ("sagemaker", "skypilot") else None)
    billed = _sagemaker_billed(paths) if record.backend == "sagemaker" else {}
    for attempt, start, end in _attempt_spans(record, paths, now):
        seconds = end - start
        if attempt in billed:
            seconds, usage.billed = billed[attempt], True
        if declared is not None:
            gpus = declared
        else:
            gpus, sampled_model = _sampled_gpus(paths, attempt, int(record.nproc_per_node))
            model = model or sampled_model
        hours = seconds / 3600.0
        entry = {"attempt": attempt, "started": start, "ended": end, "seconds": seconds,
                 "gpu_hours": gpus * nnodes * hours, "cpu_hours": procs * hours}
        usage.attempts.append(entry)
        usage.wall_hours += hours
        usage.gpu_hours += entry["gpu_hours"]
        usage.cpu_hours += entry["cpu_hours"]
        usage.gpus_per_node = max(usage.gpus_per_node, gpus)
    usage.gpu_model = model
    usage.cost, usage.priced_by = price(usage, nnodes, _prices() if prices is None else prices)
    return usage


def _sagemaker_billed(paths: JobPaths) -> dict[int, float]:
    out = {}
    for attempt in paths.attempts():
        described = read_json(paths.scheduler_job(attempt)) or {}
        if described.get("scheduler") == "sagemaker" and described.get("billable_seconds"):
            out[attempt] = float(described["billable_seconds"])
    return out


def price(usage: Usage, nnodes: int, prices: dict[str, float]) -> tuple[float | None, str | None]:
    """The estimated cost of ``usage`` and the price key used (see the module docstring)."""
    if not prices:
        return None, None
    if usage.instance_type and usage.instance_type in prices:
        return prices[usage.instance_type] * nnodes * usage.wall_hours, usage.instance_type
    if usage.gpu_hours and usage.gpu_model:
        name = usage.gpu_model.lower()
        matches = [k for k in prices if k.lower() != "cpu" and k.lower() in name]
        if matches:
            key = max(matches, key=len)  # "A100-80GB" before "A100"
            return prices[key] * usage.gpu_hours, key
    if not usage.gpu_hours and "cpu" in prices:
        return prices["cpu"] * usage.cpu_hours, "cpu"
    return None, None


def _prices() -> dict[str, float]:
    from .. import config

    return dict(config.get("prices") or {})


def hours(value: float | None, device: str = "") -> str:
    """Device time for people, in a unit that fits it: ``0.02 CPU-h``, ``3.6 CPU-s`` (under 36 s),
    ``1,234.5 GPU-h``; ``0`` for none used; ``-`` for unknown. Without ``device``, the number of
    hours alone (``0.012``)."""
    if value is None:
        return "-"
    if not device:
        return f"{value:.3g}" if value < 10 else f"{value:,.1f}"
    if value <= 0:
        return f"0 {device}-h"
    if value < 0.01:
        return f"{value * 3600:.2g} {device}-s"
    return f"{value:.2g} {device}-h" if value < 10 else f"{value:,.1f} {device}-h"


def money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"
