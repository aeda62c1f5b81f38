"""The SkyPilot backend's options, declared once as data (standard library only: no ``sky`` import)."""

from __future__ import annotations

import re

from ...core.optiontypes import BadValue, Custom, Int
from ..options import BackendOption


def _amount(text: str) -> str:
    """SkyPilot's resource amounts: ``8`` (exactly) or ``8+`` (at least), as its task YAML writes them."""
    if not re.fullmatch(r"\d+(\.\d+)?\+?", text.strip()) or float(text.strip().rstrip("+")) <= 0:
        raise BadValue("a positive number, or a number followed by + (at least)", "e.g. 8 or 8+")
    return text.strip()


OPTIONS: tuple[BackendOption, ...] = (
    BackendOption("gpus", str, None, "Accelerators per node, as SkyPilot writes them: H100:8, A100-80GB:4, {L4:1, A10G:1}."),
    BackendOption("infra", str, None, "Where to run: aws, gcp/us-central1, k8s/CONTEXT... (default: wherever SkyPilot finds it cheapest)."),
    BackendOption("instance_type", str, None, "Cloud instance type of every node (default: SkyPilot picks one that fits)."),
    BackendOption("spot", bool, False, "Spot (preemptible) instances."),
    BackendOption("image", str, None, "Image of the nodes: a cloud image id, or docker:IMAGE."),
    BackendOption("disk_size", int, None, "Disk per node in GB.", kind=Int(low=1, expected="a size in GB"), metavar="GB"),
    BackendOption("cpus", str, None, "vCPUs per node, e.g. 8 or 8+.", kind=Custom(expected="a CPU count", parser=_amount)),
    BackendOption("memory", str, None, "Memory per node in GB, e.g. 32+.", kind=Custom(expected="a memory size", parser=_amount)),
    BackendOption("cluster", str, None,
                  "Run on this SkyPilot cluster (sky.launch reuses it if it exists) and keep it afterwards; default: a new "
                  "cluster phx-JOB-aN per attempt, torn down after it. Ignored with --managed."),
    BackendOption("managed", bool, False,
                  "A SkyPilot managed job (sky.jobs.launch): SkyPilot recovers preemptions itself and phalanx's --max-retries must be 0."),
    BackendOption("setup", str, None, "Shell commands SkyPilot runs on every node before the job (e.g. pip install -r requirements.txt)."),
)
