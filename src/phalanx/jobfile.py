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
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from .core.env import python_as_typed
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
    "max_retries": "job-level retries after a failure",
    "no_retry_on": "log patterns (regex list) that make a failure final",
    "retry_on_exit_codes": "only these exit codes are retried (list)",
    "stall_timeout": "seconds without output before the job counts as stalled",
    "state": "URI the state directory is synced with (s3://, gs://, file://...)",
    "metrics": "mapping of metric name to regex (group 1 is the value)",
    "auto_metrics": "pick up name=value numbers automatically (default true)",
    "sample_interval": "seconds between resource samples",
    "inputs": "input channels: mapping of name to URI (path, s3://, gs://, http(s)://, job:NAME; #extract unpacks)",
    "output": "URI the outputs and logs are uploaded to at the end",
    "skip_if_done": "do nothing if the last successful run of this name had the same inputs",
    "snapshot": "run from a copy of the working directory taken at submit time (default true)",
    "warm": "start from a warm interpreter pool (default: the warm setting, true)",
    "backend_options": "options of the backend (mapping), e.g. {hosts: 'gpu1,gpu2'} for ssh",
    "sagemaker": "SageMaker settings: role, instance_type, vpc, volume_size, tags, kms, max_run, max_wait... (mapping)",
    "sweep": "sweep settings: strategy, trials, seed, objective, early_stop, parallel, fail_fast",
}
SWEEP_KEYS = ("strategy", "trials", "seed", "objective", "early_stop", "parallel", "fail_fast")


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
    max_retries: int | None = None
    no_retry_on: list[str] = field(default_factory=list)
    retry_on_exit_codes: str | None = None
    stall_timeout: float | None = None
    state: str | None = None
    metrics: list[str] = field(default_factory=list)
    auto_metrics: bool | None = None
    sample_interval: float | None = None
    backend_options: dict[str, Any] = field(default_factory=dict)  # given on the CLI (None values dropped)
    inputs: list[str] = field(default_factory=list)  # NAME=URI[#extract]
    output: str | None = None
    skip_if_done: bool | None = None
    snapshot: bool | None = None
    warm: bool | None = None
    strategy: str | None = None
    trials: int | None = None
    seed: int | None = None
    objective: str | None = None
    early_stop: str | None = None
    parallel: int | None = None
    fail_fast: bool | None = None


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


def _enum(kind: type[Enum], value: Any, what: str) -> Any:
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
        return Entrypoint(EntrypointKind.SCRIPT, str(path.resolve()), args, typed=target)
    if path.is_file() and not os.access(path, os.X_OK):
        return Entrypoint(EntrypointKind.SCRIPT, str(path.resolve()), args, typed=target)
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
        env_key, env_value = item.split("=", 1)
        env[env_key] = env_value
    spec = JobSpec(
        entrypoint=entry,
        resources=resources,
        name=str(name),
        framework=_enum(Framework, opts.framework or file.get("framework", "torch"), "framework"),
        spawn=_enum(Spawn, opts.spawn or file.get("spawn", "auto"), "--spawn"),
        env=env,
        workdir=str(workdir),
        backend=str(opts.backend or file.get("backend") or _default_backend()),
        python=python_as_typed(),
        max_restarts=int(opts.max_restarts if opts.max_restarts is not None else file.get("max_restarts", 0)),
        grace=float(opts.grace if opts.grace is not None else file.get("grace", _default_grace())),
    )
    warm = _pick(opts.warm, file, "warm", None)
    spec = spec.with_(**_survival(opts, file), **_monitoring(opts, file), **_data(opts, file, base_dir, workdir, entry),
                      warm=_default_warm() if warm is None else bool(warm))
    spec = _what_the_script_sees(spec, named=bool(opts.name or file.get("name")),
                                 framework_given=bool(opts.framework or file.get("framework")))
    given = {k: v for k, v in opts.backend_options.items() if v is not None and v != [] and v is not False}
    file_opts = file.get("backend_options") or {}
    if not isinstance(file_opts, dict):
        raise UsageError("the job file's 'backend_options' must be a mapping", "e.g. backend_options: {hosts: 'gpu1,gpu2'}")
    if "sagemaker" in file:
        from .backends.sagemaker.options import section_options

        file_opts = {**section_options(file["sagemaker"]), **file_opts}
    spec = spec.with_(backend_options={**file_opts, **given})
    if spec.max_restarts < 0 or spec.grace < 0 or spec.max_retries < 0:
        raise UsageError("--max-restarts, --max-retries and --grace must not be negative", "use 0 or more")
    return spec


def _pick(cli: Any, file: dict[str, Any], key: str, default: Any) -> Any:
    return cli if cli is not None else file.get(key, default)


def _survival(opts: RunOptions, file: dict[str, Any]) -> dict[str, Any]:
    import re

    patterns = list(opts.no_retry_on) or list(file.get("no_retry_on") or [])
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"invalid --no-retry-on pattern '{pattern}': {exc}", "fix the regular expression") from None
    codes_raw = _pick(opts.retry_on_exit_codes, file, "retry_on_exit_codes", [])
    if isinstance(codes_raw, str):
        codes_raw = [c for c in codes_raw.replace(" ", "").split(",") if c]
    try:
        codes = tuple(int(c) for c in codes_raw)
    except (TypeError, ValueError):
        raise UsageError(f"invalid --retry-on-exit-codes '{codes_raw}'", "use numbers separated by commas, e.g. 1,137") from None
    stall = _pick(opts.stall_timeout, file, "stall_timeout", None)
    if stall is not None and float(stall) <= 0:
        raise UsageError("--stall-timeout must be positive", "e.g. --stall-timeout 600")
    state = _pick(opts.state, file, "state", None)
    if state is not None:
        from .storage.uri import validate_uri

        state = validate_uri(str(state), what="--state")
    out: dict[str, Any] = {
        "max_retries": int(_pick(opts.max_retries, file, "max_retries", 0)),
        "retry_on_exit_codes": codes,
        "stall_timeout": float(stall) if stall is not None else None,
        "state_uri": state,
    }
    if patterns:
        out["no_retry_on"] = tuple(patterns)
    return out


def _monitoring(opts: RunOptions, file: dict[str, Any]) -> dict[str, Any]:
    from .core.spec import parse_metric

    texts = [f"{k}={v}" for k, v in (file.get("metrics") or {}).items()] if isinstance(file.get("metrics"), dict) else []
    defs = {d.name: d for d in (parse_metric(t) for t in [*texts, *opts.metrics])}
    interval = float(_pick(opts.sample_interval, file, "sample_interval", 5.0))
    if interval <= 0:
        raise UsageError("--sample-interval must be positive", "e.g. --sample-interval 5")
    return {
        "metrics": tuple(defs.values()),
        "auto_metrics": bool(_pick(opts.auto_metrics, file, "auto_metrics", True)),
        "sample_interval": interval,
    }


def _data(opts: RunOptions, file: dict[str, Any], base_dir: Path, workdir: Path, entry: Entrypoint) -> dict[str, Any]:
    """Inputs (``job:`` references resolved now, so retries read the same data), output, snapshot."""
    from dataclasses import replace

    from .core.spec import channel_env_name, parse_channel
    from .storage.uri import validate_uri

    given = file.get("inputs") or {}
    if not isinstance(given, dict):
        raise UsageError("the job file's 'inputs' must be a mapping of name to URI", "e.g. inputs: {train: s3://bucket/train}")
    texts = [(f"{k}={v}", base_dir) for k, v in given.items()] + [(t, Path.cwd()) for t in opts.inputs]
    channels = {}
    for text, base in texts:
        channel = parse_channel(text)
        if channel.uri.startswith("job:"):
            from .query import resolve_job_input

            source = resolve_job_input(channel.uri)
        else:
            from .storage.channels import resolve_source

            source = resolve_source(channel.uri, base, channel.name)
        channels[channel.name] = replace(channel, source=source)  # the command line beats the file
    env_names = [channel_env_name(n) for n in channels]
    if len(set(env_names)) < len(env_names):
        raise UsageError(f"input names {', '.join(channels)} clash as environment variables", "use names that differ in more than case, - and _")
    output = _pick(opts.output, file, "output", None)
    snapshot = bool(_pick(opts.snapshot, file, "snapshot", True)) and _snapshot_fits(workdir, entry)
    return {
        "channels": tuple(channels.values()),
        "output_uri": validate_uri(str(output), what="--output") if output else None,
        "skip_if_done": bool(_pick(opts.skip_if_done, file, "skip_if_done", False)),
        "snapshot": snapshot,
    }


def _snapshot_fits(workdir: Path, entry: Entrypoint) -> bool:
    """Refuses (UsageError) a snapshot too big to be code; says what large files it leaves out."""
    from . import config
    from .storage.snapshot import preflight

    line = preflight(JobSpec(entry, workdir=str(workdir)), config.home()).skipped_line()
    if line:
        sys.stderr.write(f"phalanx: {line}\n")
    return True


def _what_the_script_sees(spec: JobSpec, named: bool, framework_given: bool) -> JobSpec:
    """The state directory's key (storage/statedir.py) and, for a multi-node job given no
    --framework, the framework its script's imports name (said in one line)."""
    from .launch.explain import infer
    from .storage.statedir import state_name

    spec = spec.with_(state_name=state_name(spec.name, named, spec.state_uri))
    inferred = None if framework_given else infer(spec)
    if inferred is not None:
        framework, line = inferred
        sys.stderr.write(f"phalanx: {line}\n")
        spec = spec.with_(framework=Framework(framework))
    return spec


def _resources(opts: RunOptions, file: dict[str, Any]) -> Resources:
    given = opts.nnodes is not None or opts.nproc_per_node is not None
    if opts.n and given:
        raise UsageError("-n and --nnodes/--nproc-per-node both given", "use one spelling, e.g. -n 2x4")
    if opts.n:
        return parse_topology(opts.n)
    if given:
        res = Resources(1 if opts.nnodes is None else opts.nnodes, 1 if opts.nproc_per_node is None else opts.nproc_per_node,
                        explicit=True)
    elif "n" in file:
        res = parse_topology(str(file["n"]))
    else:
        res = Resources(int(file.get("nnodes", 1)), int(file.get("nproc_per_node", 1)),
                        explicit="nnodes" in file or "nproc_per_node" in file)
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


def _default_warm() -> bool:
    from . import config

    return bool(config.get("warm"))


def _default_grace() -> float:
    from . import config

    return float(config.get("grace"))


def build_sweep(opts: RunOptions, spec: JobSpec) -> tuple[JobSpec, Any]:
    """Find a search space in the script args. Returns the spec (literal escapes applied) and
    the sweep settings, or None when the job is not a sweep. Validates before anything starts."""
    from .sweeps.space import parse_space

    file = load_job_file(opts.job_file) if opts.job_file else {}
    section = file.get("sweep") or {}
    if not isinstance(section, dict) or set(section) - set(SWEEP_KEYS):
        raise UsageError("the job file's 'sweep' section has unknown keys", f"valid keys: {', '.join(SWEEP_KEYS)}")
    space = parse_space(spec.entrypoint.args)
    spec = spec.with_(entrypoint=replace(spec.entrypoint, args=space.args))
    asked = {k: getattr(opts, k) for k in SWEEP_KEYS if getattr(opts, k) is not None}
    merged = {**section, **asked}
    if not space.is_sweep:
        if asked:
            raise UsageError(f"--{next(iter(asked)).replace('_', '-')} needs a search space in the script arguments",
                             'e.g. --lr "[0.001, 0.01]" or --lr "loguniform(1e-5, 1e-1)"')
        return spec, None
    from .sweeps.settings import SweepSettings, check, parse_objective

    objective, direction = parse_objective(merged.get("objective"))
    strategy = merged.get("strategy") or ("grid" if space.all_discrete else "random")
    settings = SweepSettings(
        strategy=str(strategy), trials=_opt_int(merged.get("trials")), seed=_opt_int(merged.get("seed")),
        objective=objective, direction=direction, early_stop=merged.get("early_stop"),
        parallel=_opt_int(merged.get("parallel")), fail_fast=bool(merged.get("fail_fast", False)),
    )
    check(spec, space, settings)
    if objective and not any(m.name == objective for m in spec.metrics) and not spec.auto_metrics:
        raise UsageError(f"--objective '{objective}' is not a metric phalanx reads",
                         f"add --metric {objective}=REGEX, or allow automatic metrics")
    return spec, settings


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
