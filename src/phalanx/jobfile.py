"""Building a JobSpec from what the user typed and/or a job file. CLI flags beat the file.

A job file is YAML::

    name: resnet
    script: train.py          # or: module: my_pkg.train   or: command: [bash, -c, "echo $RANK"]
    args: [--epochs, "3"]
    n: 2x2                    # or nnodes: 2 / nproc_per_node: 2
    framework: torch          # torch | tf | jax
    spawn: auto               # auto | self
    env: {NCCL_DEBUG: INFO}
    grace: 30
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core.spec import Entrypoint, EntrypointKind, Framework, JobSpec, Resources, Spawn, merge_args, parse_topology
from .errors import UsageError

FILE_KEYS = {
    "name": "job name (default: the script's name)",
    "script": "Python file to run",
    "module": "Python module to run (like python -m)",
    "command": "any command, as a list or a string",
    "args": "arguments for the script, module or command",
    "n": "topology: NPROC or NNODESxNPROC",
    "nnodes": "number of nodes",
    "nproc_per_node": "processes per node",
    "framework": "torch, tf or jax",
    "spawn": "auto or self",
    "env": "environment variables (mapping)",
    "workdir": "directory the job runs in",
    "backend": "where the job runs (default: local)",
    "max_restarts": "torchrun in-place worker restarts",
    "grace": "seconds between SIGTERM and SIGKILL on stop",
}


@dataclass
class RunOptions:
    """What ``phalanx run`` was given; None means 'not given' (the job file or default applies)."""

    words: list[str] = field(default_factory=list)  # entrypoint and its args
    module: str | None = None
    job_file: str | None = None
    n: str | None = None
    nnodes: int | None = None
    nproc_per_node: int | None = None
    name: str | None = None
    framework: str | None = None
    spawn: str | None = None
    env: list[str] = field(default_factory=list)
    workdir: str | None = None
    backend: str | None = None
    max_restarts: int | None = None
    grace: float | None = None


def load_job_file(path: str) -> dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"job file '{path}' not found", "check the path given to -f")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise UsageError(f"job file '{path}' is not valid YAML ({first})", "fix the syntax") from None
    if not isinstance(data, dict):
        raise UsageError(f"job file '{path}' must be a mapping of keys to values", f"valid keys: {', '.join(FILE_KEYS)}")
    unknown = sorted(set(map(str, data)) - set(FILE_KEYS))
    if unknown:
        raise UsageError(f"unknown key(s) {', '.join(unknown)} in job file '{path}'", f"valid keys: {', '.join(FILE_KEYS)}")
    return data


def _enum(kind: type, value: Any, what: str) -> Any:
    try:
        return kind(str(value))
    except ValueError:
        valid = ", ".join(m.value for m in kind)
        raise UsageError(f"invalid {what} '{value}'", f"use one of: {valid}") from None


def _entrypoint(words: list[str], module: str | None, workdir: Path) -> Entrypoint:
    if module:
        return Entrypoint(EntrypointKind.MODULE, module, tuple(words))
    if not words:
        raise UsageError("nothing to run", "give a script, -m MODULE or a command, e.g. phalanx run train.py")
    target, args = words[0], tuple(words[1:])
    path = (workdir / target) if not os.path.isabs(target) else Path(target)
    if target.endswith(".py"):
        if not path.is_file():
            raise UsageError(f"script '{target}' not found in {workdir}", "check the path, or run from the script's directory")
        return Entrypoint(EntrypointKind.SCRIPT, str(path.resolve()), args)
    if path.is_file() and not os.access(path, os.X_OK):
        return Entrypoint(EntrypointKind.SCRIPT, str(path.resolve()), args)
    if path.is_file() or shutil.which(target):
        return Entrypoint(EntrypointKind.COMMAND, target, args)
    raise UsageError(
        f"'{target}' is neither a Python script nor a command on PATH",
        "give a .py file, -m MODULE, or an installed command",
    )


def build_spec(opts: RunOptions) -> JobSpec:
    """Merge options over the job file; validate; resolve paths. Raises UsageError."""
    file: dict[str, Any] = load_job_file(opts.job_file) if opts.job_file else {}
    base_dir = Path(opts.job_file).resolve().parent if opts.job_file else Path.cwd()
    workdir = Path(opts.workdir or file.get("workdir") or (base_dir if opts.job_file else ".")).resolve()
    if not workdir.is_dir():
        raise UsageError(f"working directory '{workdir}' does not exist", "check --workdir")

    words = list(opts.words)
    module = opts.module
    file_target = [k for k in ("script", "module", "command") if k in file]
    if len(file_target) > 1:
        raise UsageError(f"job file sets {' and '.join(file_target)}", "keep one of script, module, command")
    uses_file_entry = file_target and not module and (not words or words[0].startswith("-"))
    if uses_file_entry:
        key = file_target[0]
        file_args = tuple(str(a) for a in file.get("args", []) or [])
        value = file[key]
        if key == "command":
            cmd = value.split() if isinstance(value, str) else [str(v) for v in value]
            words = [*cmd, *merge_args(file_args, tuple(words))]
        elif key == "module":
            module = str(value)
            words = list(merge_args(file_args, tuple(words)))
        else:
            words = [str(value), *merge_args(file_args, tuple(words))]
    entry = _entrypoint(words, module, workdir)

    resources = _resources(opts, file)
    name = opts.name or file.get("name") or _default_name(entry)
    env = {str(k): str(v) for k, v in (file.get("env") or {}).items()}
    for item in opts.env:
        if "=" not in item:
            raise UsageError(f"invalid --env '{item}'", "use --env KEY=VALUE")
        key, value = item.split("=", 1)
        env[key] = value
    spec = JobSpec(
        entrypoint=entry,
        resources=resources,
        name=str(name),
        framework=_enum(Framework, opts.framework or file.get("framework", "torch"), "framework"),
        spawn=_enum(Spawn, opts.spawn or file.get("spawn", "auto"), "--spawn"),
        env=env,
        workdir=str(workdir),
        backend=str(opts.backend or file.get("backend") or _default_backend()),
        python=sys.executable,
        max_restarts=int(opts.max_restarts if opts.max_restarts is not None else file.get("max_restarts", 0)),
        grace=float(opts.grace if opts.grace is not None else file.get("grace", _default_grace())),
    )
    if spec.max_restarts < 0 or spec.grace < 0:
        raise UsageError("--max-restarts and --grace must not be negative", "use 0 or more")
    return spec


def _resources(opts: RunOptions, file: dict[str, Any]) -> Resources:
    given = opts.nnodes is not None or opts.nproc_per_node is not None
    if opts.n and given:
        raise UsageError("-n and --nnodes/--nproc-per-node both given", "use one spelling, e.g. -n 2x4")
    if opts.n:
        return parse_topology(opts.n)
    if given:
        res = Resources(1 if opts.nnodes is None else opts.nnodes, 1 if opts.nproc_per_node is None else opts.nproc_per_node)
    elif "n" in file:
        res = parse_topology(str(file["n"]))
    else:
        res = Resources(int(file.get("nnodes", 1)), int(file.get("nproc_per_node", 1)))
    if res.nnodes < 1 or res.nproc_per_node < 1:
        raise UsageError("--nnodes and --nproc-per-node must be at least 1", "for example --nnodes 2 --nproc-per-node 4")
    return res


def _default_name(entry: Entrypoint) -> str:
    if entry.kind is EntrypointKind.MODULE:
        return entry.target.rsplit(".", 1)[-1]
    return Path(entry.target).stem or "job"


def _default_backend() -> str:
    from . import config

    return str(config.get("backend"))


def _default_grace() -> float:
    from . import config

    return float(config.get("grace"))
