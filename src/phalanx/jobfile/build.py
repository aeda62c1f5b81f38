"""Typed option values -> a ``JobSpec`` (and sweep settings). Checks that need more than one
option, the file system or the backend registry happen here, before anything starts."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, get_type_hints

from ..core.env import python_as_typed
from ..core.options import RENDEZVOUS_OPTIONS, RUN_OPTIONS, SWEEP_OPTIONS, TOPOLOGY_OPTIONS
from ..core.arguments import merge_args
from ..core.spec import (
    Entrypoint,
    EntrypointKind,
    Framework,
    JobSpec,
    MetricDef,
    Rendezvous,
    Resources,
    Spawn,
)
from ..errors import UsageError
from .values import RunOptions, Values, all_options, resolve


def build_spec(opts: RunOptions, values: Values | None = None, resolve_jobs: bool = True) -> JobSpec:
    """Merge options over the job file; validate; resolve paths. Raises UsageError. Warnings go
    to ``values.warnings`` when the caller passes ``values``, else to stderr at the end.
    ``resolve_jobs`` False: ``--input NAME=job:REF`` is left for a team server to resolve (it
    names a job of the server's, not of this machine's store)."""
    v = values or resolve(opts)
    base_dir = v.file.base_dir if v.file else Path.cwd()
    workdir = Path(v["workdir"] or (base_dir if v.file else ".")).resolve()
    if not workdir.is_dir():
        raise UsageError(f"working directory '{workdir}' does not exist", "check --workdir")
    entry = _entrypoint(opts, v, workdir)
    backend = str(v["backend"] or _config("backend"))
    _check_backend(v, backend)
    spec = JobSpec(
        entrypoint=entry,
        resources=_resources(opts, v, backend),
        name=str(v["name"] or _default_name(entry)),
        framework=Framework(v["framework"]),
        spawn=Spawn(v["spawn"]),
        env=dict(v["env"] or {}),
        secrets=_secrets(v),
        workdir=str(workdir),
        backend=backend,
        python=python_as_typed(),
        grace=float(v["grace"] if v["grace"] is not None else _config("grace")),
        warm=bool(v["warm"] if v["warm"] is not None else _config("warm")),
        retry_on_exit_codes=tuple(v["retry_on_exit_codes"] or ()),
        state_uri=_uri(v, "state"),
        health_check_cmd=v["health_check_cmd"],
        metrics=tuple(MetricDef(k, r) for k, r in (v["metrics"] or {}).items()),
        backend_options=_backend_options(v),
        project=str(v["project"] or _config("project") or ""),
        **_labels(v),
        **_tracking(v),
        **_plain_fields(v),
    )
    if v["no_retry_on"]:
        spec = spec.with_(no_retry_on=tuple(v["no_retry_on"]))
    spec = _health(spec, v)
    spec = spec.with_(rendezvous=_rendezvous(v, spec), **_data(v, base_dir, workdir, entry, resolve_jobs))
    spec = _what_the_script_sees(spec, v)
    if v["local_rank_arg"]:
        spec = _with_local_rank_arg(spec, v["local_rank_arg"])
    if spec.backend == "local":
        _warn_oversubscribed(spec, v)
    if values is None:
        for text in v.notes:
            sys.stderr.write(f"phalanx: {text}\n")
        for text in v.warnings:
            sys.stderr.write(f"phalanx: warning: {text}\n")
    return spec


# Variable names that usually hold a credential: their value belongs in a secret, not in --env.
_CREDENTIAL_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def _secrets(v: Values) -> dict[str, str]:
    """``--secret``'s variables (names only), checked against ``--env``; ``--env`` values whose
    name looks like a credential get one warning (they are written into the job's records)."""
    secrets = dict(v["secrets"] or {})
    env = dict(v["env"] or {})
    both = sorted(set(secrets) & set(env))
    if both:
        raise UsageError(f"{', '.join(both)} given both by {v.where('env')} and {v.where('secrets')}",
                         "keep one: a secret's value is kept out of the job's records, an --env value is not")
    looks = sorted(k for k in env if any(word in k.upper() for word in _CREDENTIAL_WORDS))
    if looks:
        first = looks[0]
        v.warnings.append(f"{v.where('env')} {', '.join(looks)}: {'this looks' if len(looks) == 1 else 'these look'} "
                          "like a credential, and an --env value is written into the job's records (spec.json, "
                          f"plan.json, the store) and shown by --dry-run; keep it as a secret instead: phalanx "
                          f"secret set {first}, then --secret {first}")
    return secrets


def _plain_fields(v: Values) -> dict[str, Any]:
    """Options whose value is their ``JobSpec`` field as is (a number, a flag): a new one needs
    only its line in the option table. The others are built above, one by one."""
    hints = get_type_hints(JobSpec)
    plain = (int, float, bool, int | None, float | None)
    built = ("grace", "warm", "snapshot")  # a default from the settings; a check of the directory
    return {o.name: v[o.name] for o in RUN_OPTIONS
            if o.field == o.name and o.name not in built and hints.get(o.name) in plain and v[o.name] is not None}


def _config(key: str) -> Any:
    from .. import config

    return config.get(key)


# -- what runs --------------------------------------------------------------------------------


def _entrypoint(opts: RunOptions, v: Values, workdir: Path) -> Entrypoint:
    words, module = list(opts.words), v["module"] if "module" in v.from_cli else None
    file_targets = [k for k in ("script", "module", "command") if k in v.from_file]
    if len(file_targets) > 1:
        raise UsageError(f"{v.file.path if v.file else 'the job file'} sets {' and '.join(file_targets)}",
                         "keep one of script, module, command")
    if file_targets and not module and (not words or words[0].startswith("-")):
        file_args = tuple(v["args"] or ())
        key = file_targets[0]
        if key == "command":
            words = [*v["command"], *merge_args(file_args, tuple(words))]
        elif key == "module":
            module, words = v["module"], list(merge_args(file_args, tuple(words)))
        else:
            words = [v["script"], *merge_args(file_args, tuple(words))]
    elif "args" in v.from_file and not file_targets:
        raise UsageError(f"{v.where('args')}: args without a script, module or command", "add script: train.py")
    if module:
        if v["no_python"]:
            raise UsageError("--no-python and -m both given", "a module runs with python; drop one")
        return Entrypoint(EntrypointKind.MODULE, module, tuple(words))
    if not words:
        raise UsageError("nothing to run", "give a script, -m MODULE or a command, e.g. phalanx run train.py")
    target, args = words[0], tuple(words[1:])
    path = (workdir / target) if not os.path.isabs(target) else Path(target)
    if v["no_python"]:
        if not (path.is_file() or shutil.which(target)):
            raise UsageError(f"'{target}' is not a file or a command on PATH", "check the name (--no-python runs it as a command)")
        return Entrypoint(EntrypointKind.COMMAND, str(path.resolve()) if path.is_file() else target, args)
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


def _default_name(entry: Entrypoint) -> str:
    if entry.kind is EntrypointKind.MODULE:
        return entry.target.rsplit(".", 1)[-1]
    return Path(entry.target).stem or "job"


def _with_local_rank_arg(spec: JobSpec, flag: str) -> JobSpec:
    """``--local-rank=N`` for each worker, first, as torch.distributed.launch passed it: torchrun
    fills in ``${local_rank}`` per worker (its macro); a lone process is local rank 0."""
    if spec.uses_torchrun:
        value = "${local_rank}"
    elif spec.procs_per_node_started == 1:
        value = "0"
    else:
        raise UsageError("--local-rank-arg needs torchrun to start the workers", "use the torch framework and --spawn auto")
    entry = spec.entrypoint
    return spec.with_(entrypoint=replace(entry, args=(f"{flag}={value}", *entry.args)))


# -- topology -------------------------------------------------------------------------------------


def _resources(opts: RunOptions, v: Values, backend: str) -> Resources:
    source = v.from_cli if any(k in v.from_cli for k in TOPOLOGY_OPTIONS) else v.from_file
    given = [k for k in TOPOLOGY_OPTIONS if k in source]
    if "n" in given and len(given) > 1:
        raise UsageError("-n and --nnodes/--nproc-per-node both given", "use one spelling, e.g. -n 2x4")
    if not given:
        return Resources()
    if "n" in given:
        nnodes, nproc = v["n"]
        return Resources(nnodes, nproc, explicit=True)
    low, high = v["nnodes"] if "nnodes" in given else (1, 1)
    nproc = _procs(v["nproc_per_node"], backend, v) if "nproc_per_node" in given else 1
    return Resources(high, nproc, explicit=True, min_nodes=low if low != high else None)


def _procs(value: int | str, backend: str, v: Values) -> int:
    """torchrun's gpu / cpu / auto, counted on this machine (where a local job runs)."""
    if isinstance(value, int):
        return value
    if backend != "local":
        raise UsageError(f"{v.where('nproc_per_node')} {value} counts this machine's devices, not the {backend} nodes'",
                         "give a number of processes per node")
    from ..launch.host import gpu_count

    gpus = gpu_count(os.environ)
    if value == "gpu" and not gpus:
        raise UsageError(f"{v.where('nproc_per_node')} gpu: this machine has no GPU", "use a number, cpu or auto")
    return gpus if value == "gpu" or (value == "auto" and gpus) else (os.cpu_count() or 1)


def _rendezvous(v: Values, spec: JobSpec) -> Rendezvous | None:
    """torchrun's multi-machine settings: this machine runs one node; the others join it."""
    given = [k for k in RENDEZVOUS_OPTIONS if v.given(k)]
    if v["standalone"]:
        if given:
            v.warnings.append(f"--standalone ignores {', '.join(v.where(k) for k in given)} (as torchrun does)")
        if spec.resources.elastic:
            raise UsageError("--standalone runs one node; an elastic --nnodes range needs other machines", "drop one")
        return None
    if not given:
        if spec.resources.elastic:
            raise UsageError(f"--nnodes {spec.resources.min_nodes}:{spec.resources.nnodes} needs a rendezvous other "
                             "machines can join", "add --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID")
        return None
    if not spec.uses_torchrun and not (spec.framework is Framework.TORCH and spec.spawn is Spawn.AUTO):
        raise UsageError(f"{v.where(given[0])} joins torchrun's rendezvous, but this job does not run torchrun",
                         "use the torch framework with --spawn auto")
    node_rank = v["node_rank"]
    if node_rank is not None and node_rank >= spec.resources.nnodes:
        raise UsageError(f"--node-rank {node_rank} is not a node of {spec.resources.nnodes}",
                         f"use 0 to {spec.resources.nnodes - 1}, or give --nnodes")
    return Rendezvous(node_rank=node_rank, master_addr=v["master_addr"], master_port=v["master_port"],
                      backend=v["rdzv_backend"], endpoint=v["rdzv_endpoint"], id=v["rdzv_id"], conf=v["rdzv_conf"])


def _warn_oversubscribed(spec: JobSpec, v: Values) -> None:
    """More processes than this machine has cores (or GPUs): it runs, slower; say so once."""
    from ..launch.host import gpu_count

    here = spec.procs_per_node_started * (1 if spec.rendezvous else spec.resources.nnodes)
    gpus, cores = gpu_count(os.environ), os.cpu_count() or 1
    if gpus and here > gpus and spec.framework is Framework.TORCH:
        v.warnings.append(f"{here} processes on {gpus} GPU(s) of this machine: ranks share GPUs")
    elif not gpus and here > cores:
        v.warnings.append(f"{here} processes on {cores} CPU core(s) of this machine: they share the cores (slower, not wrong)")


# -- health ---------------------------------------------------------------------------------------


def _health(spec: JobSpec, v: Values) -> JobSpec:
    """--on-nan and friends: ``retry`` keeps states and retries unless told otherwise; the
    arguments a retry recomputes must be the script's own."""
    on_nan, spike = v["on_nan"], v["on_spike"]
    changes: dict[str, Any] = {"on_nan": on_nan, "watch_metrics": tuple(v["watch_metrics"] or ()),
                               "on_nan_args": str(v["on_nan_args"] or ""), "progress": v["progress"]}
    if on_nan == "retry":
        if not v.given("keep_states"):
            changes["keep_states"] = 3
        if not v.given("max_retries"):
            changes["max_retries"] = 3
        if changes.get("keep_states", spec.keep_states) == 0:
            raise UsageError("--on-nan retry rolls back to a kept state, but --keep-states is 0",
                             "keep at least one version (--keep-states 3), or use --on-nan stop")
    if changes["on_nan_args"]:
        if on_nan != "retry":
            raise UsageError("--on-nan-args changes the arguments of a retry after divergence, but --on-nan is not retry",
                             "add --on-nan retry")
        from ..health.anomaly_args import check

        check(changes["on_nan_args"], spec.entrypoint.args)
    if v["watch_metrics"] and on_nan is None and spike is None:
        raise UsageError("--watch-metric names metrics for --on-nan and --on-spike, and neither is given",
                         "add --on-nan stop (or retry), or --on-spike FACTOR")
    return spec.with_(**changes)


# -- backends ---------------------------------------------------------------------------------------


def _backend_options(v: Values) -> dict[str, Any]:
    """Backend options given by name (flags over ``backend_options:``) over those a backend's own
    section (``sagemaker:``) expands to; each already checked by its backend's rules."""
    given = [o for o in all_options() if o.group == "backend" and v.given(o.name)]
    expanded = {k: val for o in given if o.expands for k, val in (v[o.name] or {}).items()}
    return {**expanded, **{o.name: v[o.name] for o in given if not o.expands}}



def _check_backend(v: Values, backend: str) -> None:
    """An option the chosen backend does not honour is an error, not silently dropped."""
    for option in all_options():
        if not v.given(option.name) or not option.backends or backend in option.backends:
            continue
        if option.group == "backend":
            owners = ", ".join(option.backends)
            raise UsageError(f"{v.where(option.name)} is an option of the {owners} backend, not of {backend}",
                             f"add --backend {option.backends[0]}, or drop it")
        raise UsageError(f"{v.where(option.name)} applies only to the {', '.join(option.backends)} backend",
                         f"drop it for the {backend} backend")


# -- labels and notifications ------------------------------------------------------------------------


def _labels(v: Values) -> dict[str, Any]:
    """``--tag``/``tags:`` as given; ``--notify``/``notify:`` (each text may hold several targets),
    else the notify setting's targets."""
    from ..supervise.notify import default_targets

    given = [target for texts in (v["notify"] or ()) for target in texts]
    return {"tags": dict(v["tags"] or {}), "notify": tuple(dict.fromkeys(given)) if given else default_targets()}


# -- experiment trackers ------------------------------------------------------------------------------


def _tracking(v: Values) -> dict[str, Any]:
    """``--track`` (else the track setting), and the trackers' own settings as they are now (the
    job's ``-e`` over this environment), so every attempt and a later resume send to one place."""
    from ..track.conventions import KINDS, capture, missing_package

    given = list(v["track"] or ())
    if not given:
        setting = str(_config("track") or "")
        given = [k.strip() for k in setting.split(",") if k.strip()]
        unknown = [k for k in given if k not in KINDS]
        if unknown:
            raise UsageError(f"setting 'track' names {', '.join(unknown)}", f"use {', '.join(KINDS)} (comma-separated)")
    kinds = tuple(dict.fromkeys(given))
    for name in ("track_ranks", "track_dir", "track_artifacts"):
        if not kinds and v.given(name) and v[name] not in (None, False, "0"):
            v.warnings.append(f"{v.where(name)} has no effect without --track")
    if v["track_dir"] and "tensorboard" not in kinds:
        v.warnings.append(f"{v.where('track_dir')} is where TensorBoard writes; add --track tensorboard")
    config = capture(kinds, {**os.environ, **dict(v["env"] or {})})
    for kind in kinds:
        package = missing_package(kind, config)
        if package:
            from ..errors import MissingDependency

            raise MissingDependency(package, kind)
    track_dir = v["track_dir"]
    if track_dir and "://" in track_dir and not track_dir.startswith("file://"):
        from ..storage.uri import validate_uri

        track_dir = validate_uri(track_dir, what=v.where("track_dir"))
    elif track_dir:
        track_dir = str(Path(track_dir.removeprefix("file://")).expanduser().resolve())
    return {"track": kinds, "track_ranks": str(v["track_ranks"] or "0"), "track_dir": track_dir, "track_config": config}


# -- data ---------------------------------------------------------------------------------------------


def _uri(v: Values, name: str) -> str | None:
    from ..storage.uri import validate_uri

    value = v[name]
    return validate_uri(str(value), what=v.where(name)) if value is not None else None


def _data(v: Values, base_dir: Path, workdir: Path, entry: Entrypoint, resolve_jobs: bool = True) -> dict[str, Any]:
    """Inputs (``job:`` references resolved now, so retries read the same data), output, snapshot."""
    from ..core.spec import channel_env_name, parse_channel

    given_here = v.cli.get("inputs") or {}  # paths relative to the current directory; the file's to the file
    texts = [(f"{k}={u}", Path.cwd() if k in given_here else base_dir) for k, u in (v["inputs"] or {}).items()]
    channels = {}
    for text, base in texts:
        channel = parse_channel(text)
        if channel.uri.startswith("job:"):
            from ..api.query import resolve_job_input

            source = resolve_job_input(channel.uri) if resolve_jobs else ""
        else:
            from ..storage.channels import resolve_source

            source = resolve_source(channel.uri, base, channel.name)
        channels[channel.name] = replace(channel, source=source)
    env_names = [channel_env_name(n) for n in channels]
    if len(set(env_names)) < len(env_names):
        raise UsageError(f"input names {', '.join(channels)} clash as environment variables", "use names that differ in more than case, - and _")
    output = _uri(v, "output")
    log_dir = _uri(v, "log_dir")
    if output and log_dir and output != log_dir:
        raise UsageError("--log-dir and --output name different places", "--output DIR copies the logs there too: give one")
    snapshot = bool(v["snapshot"]) and _snapshot_fits(workdir, entry, v)
    return {"channels": tuple(channels.values()), "output_uri": output or log_dir, "snapshot": snapshot}


def _snapshot_fits(workdir: Path, entry: Entrypoint, v: Values) -> bool:
    """Refuses (UsageError) a snapshot too big to be code; notes what large files it leaves out."""
    from .. import config
    from ..storage.snapshot import preflight

    line = preflight(JobSpec(entry, workdir=str(workdir)), config.home()).skipped_line()
    if line:
        v.notes.append(line)
    return True


def _what_the_script_sees(spec: JobSpec, v: Values) -> JobSpec:
    """The state directory's key (storage/statedir.py) and, for a multi-node job given no
    --framework, the framework its script's imports name (said in one line)."""
    from ..launch.explain import infer
    from ..storage.statedir import state_name

    spec = spec.with_(state_name=state_name(spec.name, v.given("name"), spec.state_uri))
    inferred = None if v.given("framework") else infer(spec)
    if inferred is not None:
        framework, line = inferred
        v.notes.append(line)
        spec = spec.with_(framework=Framework(framework))
    return spec


__all__ = ["build_spec", "SWEEP_OPTIONS"]
