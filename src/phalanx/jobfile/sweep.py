"""A search space in the script's arguments + the sweep options -> sweep settings, checked
before any trial starts (an objective nothing prints would waste every trial)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..core.options import SWEEP_OPTIONS
from ..core.spec import EntrypointKind, JobSpec
from ..errors import UsageError
from .values import RunOptions, Values, resolve

_SOURCE_FILES = 2000  # .py files read to find an objective's name: a project, not a site-packages
_SOURCE_BYTES = 20 << 20


def build_sweep(opts: RunOptions, spec: JobSpec, values: Values | None = None) -> tuple[JobSpec, Any]:
    """Find a search space in the script args. Returns the spec (literal escapes applied) and
    the sweep settings, or None when the job is not a sweep. Validates before anything starts."""
    from ..sweeps.space import parse_space

    v = values or resolve(opts)
    space = parse_space(spec.entrypoint.args)
    spec = spec.with_(entrypoint=replace(spec.entrypoint, args=space.args))
    given = [k for k in SWEEP_OPTIONS if v.given(k)]
    if not space.is_sweep:
        if given:
            raise UsageError(f"{v.where(given[0])} needs a search space in the script arguments",
                             'e.g. --lr "[0.001, 0.01]" or --lr "loguniform(1e-5, 1e-1)"')
        return spec, None
    from ..sweeps.settings import SweepSettings, check, parse_objective

    objective, direction = parse_objective(v["objective"])
    settings = SweepSettings(
        strategy=str(v["strategy"] or ("grid" if space.all_discrete else "random")), trials=v["trials"],
        seed=v["seed"] if v.given("seed") else None, objective=objective, direction=direction,
        early_stop=v["early_stop"], parallel=v["parallel"], fail_fast=bool(v["fail_fast"]),
    )
    check(spec, space, settings)
    if objective:
        check_objective(spec, objective)
    return spec, settings


def check_objective(spec: JobSpec, name: str) -> None:
    """The objective must be a --metric, or a name the script's source mentions (what it prints
    as ``name=value``); otherwise no trial would ever report it."""
    if any(m.name == name for m in spec.metrics):
        return
    if not spec.auto_metrics:
        raise UsageError(f"--objective '{name}' is not a metric phalanx reads",
                         f"add --metric {name}=REGEX, or allow automatic metrics")
    files = _source_files(spec)
    if not files:
        return  # a command phalanx cannot read: trust the user
    for path in files:
        try:
            if name in path.read_text(errors="replace"):
                return
        except OSError:
            continue
    shown = files[0].name + (f" or the {len(files) - 1} other .py file(s) beside it" if len(files) > 1 else "")
    raise UsageError(f"--objective '{name}': no --metric defines it and nothing in {shown} mentions it, so no trial "
                     "would report it", f"check the name, or add --metric {name}=REGEX for what the script prints")


def _source_files(spec: JobSpec) -> list[Path]:
    """The entrypoint's source first, then the project's .py files (the script may print from a module)."""
    entry, workdir = spec.entrypoint, Path(spec.workdir)
    first: Path | None = None
    if entry.kind is EntrypointKind.SCRIPT:
        first = Path(entry.target)
    elif entry.kind is EntrypointKind.MODULE:
        first = _module_file(entry.target, workdir)
    elif Path(entry.target).is_file() or (workdir / entry.target).is_file():
        first = Path(entry.target) if Path(entry.target).is_file() else workdir / entry.target
    if first is None or not _is_text(first):
        return []
    files, size = [first], 0
    for root in dict.fromkeys([first.parent, workdir]):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in ("__pycache__", "node_modules", "venv")]
            for name in filenames:
                path = Path(dirpath) / name
                if name.endswith(".py") and path not in files:
                    files.append(path)
                    size += _size(path)
                if len(files) >= _SOURCE_FILES or size > _SOURCE_BYTES:
                    return files
    return files


def _module_file(module: str, workdir: Path) -> Path | None:
    """Where ``python -m module`` would find it, without importing anything."""
    import sys

    rel = Path(*module.split("."))
    for base in [workdir, *map(Path, sys.path[1:])]:
        for candidate in (base / rel.with_suffix(".py"), base / rel / "__main__.py"):
            if candidate.is_file():
                return candidate
    return None


def _is_text(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return b"\x00" not in f.read(4096)
    except OSError:
        return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
