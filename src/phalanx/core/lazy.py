"""Packages whose names are imported on first use: reading one light module of a package (its
option table, say) must not import the heavy rest."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``package.<where[name]>`` when
    ``name`` is first read."""

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
