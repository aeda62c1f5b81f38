"""Backend name -> its class, found through the ``phalanx.backends`` entry-point group.

Built-in backends are registered the same way (``pyproject.toml``), so a third-party package
adds one with one line in its own packaging::

    [project.entry-points."phalanx.backends"]
    mycluster = "my_package.backend:MyClusterBackend"

Entry points name a module and a class; the module is imported only when that backend is
asked for, so ``phalanx ps`` never imports a backend's SDK. ``BUILTIN`` is the fallback for
a checkout that runs without being installed (no package metadata).
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    from .base import Backend

GROUP = "phalanx.backends"
BUILTIN: dict[str, str] = {
    "local": "phalanx.backends.local:LocalBackend",
    "ssh": "phalanx.backends.ssh:SshBackend",
    "slurm": "phalanx.backends.slurm:SlurmBackend",
    "sagemaker": "phalanx.backends.sagemaker.backend:SageMakerBackend",
    "skypilot": "phalanx.backends.skypilot.backend:SkyPilotBackend",
    "ray": "phalanx.backends.ray.backend:RayBackend",
    "k8s": "phalanx.backends.kubernetes.backend:KubernetesBackend",
}


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def known() -> dict[str, str]:
    """Every backend name -> ``module:Class``. A built-in name cannot be taken over."""
    return {**_entry_points(), **BUILTIN}


def get_backend(name: str) -> "Backend":
    """A new instance of the backend registered as ``name``. Raises UsageError listing the
    known names when there is none, and when the registered class cannot be loaded."""
    from .base import Backend

    targets = BUILTIN if name in BUILTIN else known()
    if name not in targets:
        raise UsageError(f"unknown backend '{name}'", f"known backends: {', '.join(sorted(known()))}")
    module_name, _, attr = targets[name].partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"the {name} backend ({targets[name]}) cannot be loaded: {exc}",
                         "install the package that provides it, or pick another --backend") from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise UsageError(f"the {name} backend ({targets[name]}) is not a phalanx Backend", "fix its entry point")
    return cls()
