"""A sweep's settings and its checks, and how many trials fit at once (slots)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backends.registry import get_backend
from ..core.spec import JobSpec
from ..errors import UsageError
from ..launch.host import HostFacts
from .space import Space
from .strategies import Strategy


@dataclass(frozen=True)
class SweepSettings:
    strategy: str = "grid"
    trials: int | None = None
    seed: int | None = None
    objective: str | None = None  # metric name
    direction: str = "min"
    early_stop: str | None = None
    parallel: int | None = None
    fail_fast: bool = False  # stop the sweep at the first failed trial

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SweepSettings":
        return cls(**data)


def parse_objective(text: str | None) -> tuple[str | None, str]:
    if not text:
        return None, "min"
    name, _, direction = text.partition(":")
    direction = direction or "min"
    if not name or direction not in ("min", "max"):
        raise UsageError(f"invalid --objective '{text}'", "use NAME:min or NAME:max, e.g. --objective val_loss:min")
    return name, direction


def check(spec: JobSpec, space: Space, settings: SweepSettings, state: Path | None = None) -> Strategy:
    """Validate a sweep before anything starts; returns its strategy (its sampler's state kept
    in ``state``)."""
    if settings.early_stop and not settings.objective:
        raise UsageError("--early-stop needs --objective", "e.g. --objective val_loss:min")
    if settings.strategy == "tpe" and not settings.objective:
        raise UsageError("--strategy tpe needs --objective", "e.g. --objective val_loss:min")
    if settings.parallel is not None and settings.parallel < 1:
        raise UsageError("--parallel must be at least 1", "e.g. --parallel 2")
    return Strategy(space, settings.strategy, settings.trials, settings.seed, settings.direction, settings.early_stop, state)


SCHEDULED_PARALLEL = 16  # trials at once on a scheduler, unless --parallel says otherwise


def slot_plan(spec: JobSpec, parallel: int | None) -> list[str | None]:
    """One entry per concurrent trial: its CUDA_VISIBLE_DEVICES, or None on CPU-only machines.

    A trial needs one device per process (GPU), or one core per process (CPU). On a backend
    whose scheduler places the trials (SLURM), only ``parallel`` (default SCHEDULED_PARALLEL) limits.
    """
    if not get_backend(spec.backend).local_slots:
        return [None] * (parallel or SCHEDULED_PARALLEL)
    host = HostFacts.read()
    per_trial = spec.resources.world_size if spec.spawn.value == "auto" else spec.resources.nnodes
    gpus = host.gpus
    if gpus:
        fit = max(1, gpus // per_trial)
        count = min(fit, parallel) if parallel else fit
        return [",".join(str(g) for g in range(i * per_trial, (i + 1) * per_trial)) for i in range(count)]
    fit = max(1, host.cpus // per_trial)
    return [None] * (min(fit, parallel) if parallel else fit)
