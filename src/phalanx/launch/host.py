"""HostFacts: what a plan may know about the machine a job is submitted from.

Read once per plan by ``Backend.facts`` (the one impure step before planning) and passed in, so
plans are pure functions of their arguments: tests build ``HostFacts`` by hand, and a plan made
twice from the same facts is the same plan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping


def gpu_count(env: Mapping[str, str]) -> int:
    """GPUs a job started here may use: ``CUDA_VISIBLE_DEVICES`` when set, else the driver's list."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    gpus = Path("/proc/driver/nvidia/gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else 0


@dataclass(frozen=True)
class HostFacts:
    gpus: int = 0
    cpus: int = 1
    # The submitting environment: a variable the user set here (GLOO_SOCKET_IFNAME,
    # OMP_NUM_THREADS) is left alone rather than given phalanx's default.
    env: Mapping[str, str] = field(default_factory=dict)
    # The phalanx home here ($PHALANX_HOME): where a backend's facts may find its caches (the
    # SageMaker backend's input digests). None when the facts were made by hand.
    home: Path | None = None

    @classmethod
    def read(cls) -> "HostFacts":
        from .. import config

        env = dict(os.environ)
        return cls(gpus=gpu_count(env), cpus=os.cpu_count() or 1, env=env, home=config.home())
