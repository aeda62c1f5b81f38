"""Backend name -> lazily imported class. Third parties register through the
``phalanx.backends`` entry-point group (``name = "module:Class"``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    from .base import Backend

BUILTIN: dict[str, str] = {
    "local": "phalanx.backends.local:LocalBackend",
    "ssh": "phalanx.backends.ssh:SshBackend",
    "slurm": "phalanx.backends.slurm:SlurmBackend",
    "k8s": "phalanx.backends.kubernetes.backend:KubernetesBackend",
}


def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group="phalanx.backends")}


def known() -> dict[str, str]:
    return {**_entry_points(), **BUILTIN}


def get_backend(name: str) -> "Backend":
    targets = BUILTIN if name in BUILTIN else known()
    if name not in targets:
        raise UsageError(f"unknown backend '{name}'", f"known backends: {', '.join(sorted(known()))}")
    module_name, _, attr = targets[name].partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    return cls()
