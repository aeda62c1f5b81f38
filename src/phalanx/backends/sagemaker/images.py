"""AWS's framework training images (Deep Learning Containers), chosen without a network call.

``images.json`` beside this file is a trimmed copy of the SageMaker Python SDK's own table
(``sagemaker-core``, ``image_uri_config/{pytorch,tensorflow}.json``, training images): the
newest versions of each framework with their Python tag, and the ECR account per region. An
image URI is ``<account>.dkr.ecr.<region>.<domain>/<repository>:<version>-<cpu|gpu>-<py>``, as
the SDK forms it (``image_uris._format_tag``). Pure.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...errors import UsageError

_TABLE = Path(__file__).with_name("images.json")
# Instance families with NVIDIA GPUs; everything else gets the CPU image. Trainium (trn) and
# Inferentia need Neuron images, which phalanx does not pick: --image names one.
GPU_FAMILIES = ("ml.p", "ml.g")
NEURON_FAMILIES = ("ml.trn", "ml.inf")


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return dict(json.loads(_TABLE.read_text()))


def processor(instance_type: str) -> str:
    if instance_type.startswith(NEURON_FAMILIES):
        return "neuron"
    return "gpu" if instance_type.startswith(GPU_FAMILIES) else "cpu"


def default_image(framework: str, version: str | None, instance_type: str, region: str) -> str:
    """The training image for ``framework`` (``torch`` or ``tf``) on ``instance_type`` in
    ``region``. Raises UsageError, with the fix, when AWS publishes none that fits."""
    data = table()
    versions = data["frameworks"].get(framework)
    if versions is None:
        raise UsageError(f"AWS publishes no SageMaker training image for --framework {framework}",
                         "give an image that has it installed with --image URI")
    chosen = version or max(versions, key=_version_key)
    if chosen not in versions:
        matches = [v for v in versions if v.startswith(chosen + ".")]
        if not matches:
            raise UsageError(f"phalanx knows no {framework} training image of version {chosen}",
                             f"use one of {', '.join(sorted(versions, key=_version_key))}, or give --image URI")
        chosen = max(matches, key=_version_key)
    entry = versions[chosen]
    proc = processor(instance_type)
    if proc not in entry["processors"]:
        raise UsageError(f"there is no default {framework} image for {instance_type} ({proc})", "give one with --image URI")
    account = data["registries"].get(region)
    if account is None:
        raise UsageError(f"AWS publishes its framework images in no registry phalanx knows for region {region}",
                         "give the image with --image URI")
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{account}.dkr.ecr.{region}.{domain}/{entry['repository']}:{chosen}-{proc}-{entry['py']}"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))
