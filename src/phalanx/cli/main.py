"""``phalanx``: run a training script distributed, and watch, stop and inspect its jobs."""

from __future__ import annotations

import os
import sys
from typing import List, Optional

import click
import typer

from ..errors import PhalanxError

app = typer.Typer(
    name="phalanx",
    help="Run an existing training script distributed — many processes, GPUs and nodes — with one command.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

_DEBUG = False


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    global _DEBUG
    _DEBUG = _DEBUG or debug
    if version:
        from importlib.metadata import version as v

        typer.echo(f"phalanx {v('phalanx')}")
        raise typer.Exit(0)


RUN_HELP = """Run SCRIPT (or -m MODULE, or any COMMAND) like `python SCRIPT ARGS`, distributed.

\b
  phalanx run train.py --lr 0.01          one process, like python train.py
  phalanx run -n 4 train.py               1 node x 4 processes (torchrun)
  phalanx run -n 2x2 train.py             2 nodes x 2 processes
  phalanx run -m my_pkg.train --epochs 3  a module
  phalanx run -- bash -c 'echo $RANK'     any command
  phalanx run -f job.yaml --lr 0.1        a job file; CLI arguments override it

Everything after the script is passed to it unchanged."""


def _help(backend: str, name: str) -> str:
    """A SageMaker or SkyPilot flag's help, from its one declaration (a light module: no SDK import)."""
    if backend == "sagemaker":
        from ..backends.sagemaker.options import OPTIONS
    else:
        from ..backends.skypilot.options import OPTIONS
    return f"{backend} backend: " + next(o.help for o in OPTIONS if o.name == name)


def _slurm_help(name: str) -> str:
    """A SLURM flag's help, from its one declaration (``backends/sbatch.py``)."""
    from ..backends.sbatch import OPTIONS

    return "slurm backend: " + next(o.help for o in OPTIONS if o.name == name)


def _ray_help(name: str) -> str:
    """A Ray flag's help, from its one declaration (``backends/ray/options.py``, no Ray import)."""
    from ..backends.ray.options import OPTIONS

    return "ray backend: " + next(o.help for o in OPTIONS if o.name == name)


@app.command(
    "run",
    help=RUN_HELP,
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
def run_cmd(
    words: Optional[List[str]] = typer.Argument(None, metavar="[SCRIPT|COMMAND] [ARGS]..."),
    n: Optional[str] = typer.Option(None, "-n", "--n", help="Topology: NPROC or NNODESxNPROC (e.g. 4, 2x4)."),
    nnodes: Optional[int] = typer.Option(None, "--nnodes", help="Number of nodes (torchrun spelling)."),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", "--nproc_per_node", help="Processes per node."),
    module: Optional[str] = typer.Option(None, "-m", "--module", help="Run a Python module, like python -m."),
    job_file: Optional[str] = typer.Option(None, "-f", "--file", help="A YAML job file; CLI options override it."),
    name: Optional[str] = typer.Option(None, "--name", help="Job name (default: the script's name)."),
    framework: Optional[str] = typer.Option(None, "--framework", help="torch (default), tf or jax."),
    spawn: Optional[str] = typer.Option(None, "--spawn", help="auto (default) or self: one process per node; the script spawns its workers."),
    env: List[str] = typer.Option([], "-e", "--env", help="Extra environment variable KEY=VALUE (repeatable)."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="Directory to run in (default: current)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Where to run (default: local)."),
    max_restarts: Optional[int] = typer.Option(None, "--max-restarts", help="torchrun in-place worker restarts (default 0)."),
    grace: Optional[float] = typer.Option(None, "--grace", help="Seconds between SIGTERM and SIGKILL when stopping (default 30)."),
    max_retries: Optional[int] = typer.Option(None, "--max-retries", help="Rerun the whole job up to N times after a failure (default 0)."),
    no_retry_on: List[str] = typer.Option([], "--no-retry-on", help="A failure whose output matches this regex is final (repeatable; replaces the defaults)."),
    retry_on_exit_codes: Optional[str] = typer.Option(None, "--retry-on-exit-codes", help="Only retry these exit codes, e.g. 1,137."),
    stall_timeout: Optional[float] = typer.Option(None, "--stall-timeout", help="Fail (and dump stacks) when no rank prints for this many seconds."),
    state: Optional[str] = typer.Option(None, "--state", help="Sync the state directory with this URI (s3://, gs://, file://, path)."),
    clean_state: bool = typer.Option(False, "--clean-state", help="Start from an empty state directory (the old one is moved aside)."),
    metric: List[str] = typer.Option([], "--metric", help="A metric NAME=REGEX over each rank's output (repeatable)."),
    no_auto_metrics: bool = typer.Option(False, "--no-auto-metrics", help="Do not pick up name=value numbers automatically."),
    sample_interval: Optional[float] = typer.Option(None, "--sample-interval", help="Seconds between resource samples (default 5)."),
    inputs: List[str] = typer.Option([], "--input", help="Input channel NAME=URI: a path, s3://, gs://, http(s)://, job:NAME[/state]; URI#extract unpacks an archive (repeatable)."),
    output: Optional[str] = typer.Option(None, "--output", help="Upload PHALANX_OUTPUT_DIR and the logs to this URI at the end."),
    skip_if_done: bool = typer.Option(False, "--skip-if-done", help="Do nothing if the last successful run of this name had the same code, command and inputs."),
    no_snapshot: bool = typer.Option(False, "--no-snapshot", help="Run from the working directory itself, not from a copy taken at submit time."),
    cold: bool = typer.Option(False, "--cold", "--no-warm", help="Start every process cold, not from the warm interpreter pool (see: phalanx pool --help)."),
    strategy: Optional[str] = typer.Option(None, "--strategy", help="Sweep: grid (default for finite spaces), random or tpe."),
    trials: Optional[int] = typer.Option(None, "--trials", help="Sweep: number of trials (random, tpe; caps a grid)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sweep: seed of random and tpe."),
    objective: Optional[str] = typer.Option(None, "--objective", help="Sweep: METRIC:min or METRIC:max."),
    early_stop: Optional[str] = typer.Option(None, "--early-stop", help="Sweep: prune hopeless trials: median or halving."),
    parallel: Optional[int] = typer.Option(None, "--parallel", help="Sweep: at most this many trials at once (default: as many as fit)."),
    fail_fast: bool = typer.Option(False, "--fail-fast", help="Sweep: stop at the first failed trial."),
    hosts: Optional[str] = typer.Option(None, "--hosts", help="ssh backend: hosts in node-rank order, e.g. gpu1,gpu2."),
    hostfile: Optional[str] = typer.Option(None, "--hostfile", help="ssh backend: a file with one host per line."),
    shared_fs: bool = typer.Option(False, "--shared-fs", help="ssh backend: hosts share this filesystem (no code shipping)."),
    remote_python: Optional[str] = typer.Option(None, "--remote-python", help="ssh backend: the Python to run on the hosts."),
    ssh_config: Optional[str] = typer.Option(None, "--ssh-config", help="ssh backend: an ssh config file (default ~/.ssh/config)."),
    remote_home: Optional[str] = typer.Option(None, "--remote-home", help="ssh backend: where jobs live on the hosts (default ~/.phalanx/remote)."),
    partition: Optional[str] = typer.Option(None, "--partition", help=_slurm_help("partition")),
    account: Optional[str] = typer.Option(None, "--account", help=_slurm_help("account")),
    time_limit: Optional[str] = typer.Option(None, "--time", help=_slurm_help("time")),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help=_slurm_help("gpus_per_node")),
    signal_lead: Optional[int] = typer.Option(None, "--signal-lead", help=_slurm_help("signal_lead")),
    sbatch_lines: List[str] = typer.Option([], "--sbatch", help=_slurm_help("sbatch")),
    instance_type: Optional[str] = typer.Option(None, "--instance-type", help=_help("sagemaker", "instance_type") + " Also skypilot."),
    role: Optional[str] = typer.Option(None, "--role", help=_help("sagemaker", "role")),
    region: Optional[str] = typer.Option(None, "--region", help=_help("sagemaker", "region")),
    profile: Optional[str] = typer.Option(None, "--profile", help=_help("sagemaker", "profile")),
    s3_prefix: Optional[str] = typer.Option(None, "--s3-prefix", help=_help("sagemaker", "s3_prefix")),
    image: Optional[str] = typer.Option(None, "--image", help=_help("sagemaker", "image") + " Also skypilot."),
    framework_version: Optional[str] = typer.Option(None, "--framework-version", help=_help("sagemaker", "framework_version")),
    spot: bool = typer.Option(False, "--spot", help=_help("sagemaker", "spot") + " Also skypilot."),
    max_run: Optional[int] = typer.Option(None, "--max-run", help=_help("sagemaker", "max_run")),
    max_wait: Optional[int] = typer.Option(None, "--max-wait", help=_help("sagemaker", "max_wait")),
    volume_size: Optional[int] = typer.Option(None, "--volume-size", help=_help("sagemaker", "volume_size")),
    subnets: Optional[str] = typer.Option(None, "--subnets", help=_help("sagemaker", "subnets")),
    security_groups: Optional[str] = typer.Option(None, "--security-groups", help=_help("sagemaker", "security_groups")),
    tags: List[str] = typer.Option([], "--tag", help=_help("sagemaker", "tag")),
    volume_kms_key: Optional[str] = typer.Option(None, "--volume-kms-key", help=_help("sagemaker", "volume_kms_key")),
    output_kms_key: Optional[str] = typer.Option(None, "--output-kms-key", help=_help("sagemaker", "output_kms_key")),
    gpus: Optional[str] = typer.Option(None, "--gpus", help=_help("skypilot", "gpus")),
    infra: Optional[str] = typer.Option(None, "--infra", help=_help("skypilot", "infra")),
    disk_size: Optional[int] = typer.Option(None, "--disk-size", help=_help("skypilot", "disk_size")),
    cpus: Optional[str] = typer.Option(None, "--cpus", help=_help("skypilot", "cpus")),
    memory: Optional[str] = typer.Option(None, "--memory", help=_help("skypilot", "memory")),
    cluster: Optional[str] = typer.Option(None, "--cluster", help=_help("skypilot", "cluster")),
    managed: bool = typer.Option(False, "--managed", help=_help("skypilot", "managed")),
    setup: Optional[str] = typer.Option(None, "--setup", help=_help("skypilot", "setup")),
    address: Optional[str] = typer.Option(None, "--address", help=_ray_help("address")),
    token_file: Optional[str] = typer.Option(None, "--token-file", help=_ray_help("token_file")),
    pending_timeout: Optional[float] = typer.Option(None, "--pending-timeout", help=_ray_help("pending_timeout")),
    cpus_per_node: Optional[float] = typer.Option(None, "--cpus-per-node", help=_ray_help("cpus_per_node")),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="Only show the output of these ranks, e.g. 0 or 0,3."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (per-node argv and env) and exit."),
    detach: bool = typer.Option(False, "-d", "--detach", help="Run in the background; print the job id."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    from .. import jobs
    from ..errors import UsageError
    from ..jobfile import RunOptions, build_spec, build_sweep
    from .control import event, parse_ranks, report_end
    from .render import dump_json

    words = list(words or [])
    if words and words[0].startswith("-") and words[0] != "-" and not (module or job_file):
        raise UsageError(f"no such option: {words[0]}", "see: phalanx run --help (script arguments go after the script)")
    options = (
        RunOptions(
            words=words, module=module, job_file=job_file, n=n, nnodes=nnodes, nproc_per_node=nproc_per_node,
            name=name, framework=framework, spawn=spawn, env=env, workdir=workdir, backend=backend,
            max_restarts=max_restarts, grace=grace, max_retries=max_retries, no_retry_on=no_retry_on,
            retry_on_exit_codes=retry_on_exit_codes, stall_timeout=stall_timeout, state=state, metrics=metric,
            auto_metrics=False if no_auto_metrics else None, sample_interval=sample_interval,
            inputs=inputs, output=output, skip_if_done=skip_if_done or None, snapshot=False if no_snapshot else None,
            warm=False if cold else None,
            strategy=strategy, trials=trials, seed=seed, objective=objective, early_stop=early_stop,
            parallel=parallel, fail_fast=fail_fast or None,
            backend_options={"hosts": hosts, "hostfile": hostfile, "shared_fs": shared_fs, "remote_python": remote_python,
                             "ssh_config": ssh_config, "remote_home": remote_home,
                             "partition": partition, "account": account, "time": time_limit, "gpus_per_node": gpus_per_node,
                             "signal_lead": signal_lead, "sbatch": sbatch_lines,
                             "instance_type": instance_type, "role": role, "region": region, "profile": profile,
                             "s3_prefix": s3_prefix, "image": image, "framework_version": framework_version, "spot": spot,
                             "max_run": max_run, "max_wait": max_wait, "volume_size": volume_size, "subnets": subnets,
                             "security_groups": security_groups, "tag": tags, "volume_kms_key": volume_kms_key,
                             "output_kms_key": output_kms_key, "gpus": gpus, "infra": infra, "disk_size": disk_size,
                             "cpus": cpus, "memory": memory, "cluster": cluster, "managed": managed, "setup": setup,
                             "address": address, "token_file": token_file, "pending_timeout": pending_timeout, "cpus_per_node": cpus_per_node},
        )
    )
    spec, sweep = build_sweep(options, build_spec(options))
    rank_filter = parse_ranks(ranks)
    if sweep is not None:
        from .sweep import run_sweep_cli

        run_sweep_cli(spec, sweep, dry_run=dry_run, detach=detach, as_json=as_json, clean=clean_state)
        return
    if dry_run:
        plan = jobs.plan_job(spec)
        if as_json:
            dump_json(plan.to_dict(), sys.stdout)
        else:
            sys.stdout.write(plan.render())
        return
    if clean_state:
        moved = jobs.clean_state(spec)
        if moved:
            typer.echo(f"phalanx: previous state of '{spec.name}' moved to {moved}", err=True)
    if detach:
        record = jobs.submit_detached(spec, events=event)
        if as_json:
            dump_json({"id": record.id, "name": record.name, "job_dir": record.job_dir}, sys.stdout)
        else:
            typer.echo(record.id)
        return
    record, code = jobs.run(spec, out=sys.stdout, ranks=rank_filter, events=event)
    report_end(record, shown=rank_filter)
    if as_json:
        dump_json(record.to_dict(), sys.stdout)
    raise typer.Exit(code)


def _register_subcommands() -> None:
    """Commands that live in their own modules (each imports its heavy parts lazily)."""
    from .control import register as register_control
    from .data import register as register_data
    from .observe import register as register_observe
    from .pool import pool_app
    from .sweep import sweep_app

    register_control(app)
    app.add_typer(sweep_app, name="sweep")
    register_observe(app)
    register_data(app)
    app.add_typer(pool_app, name="pool")


_register_subcommands()


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one error boundary for the whole CLI."""
    global _DEBUG
    args = sys.argv[1:] if argv is None else argv
    _DEBUG = os.environ.get("PHALANX_DEBUG") == "1" or "--debug" in _leading_options(args)
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="phalanx", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except PhalanxError as exc:
        if _DEBUG:
            raise
        sys.stderr.write(f"phalanx: error: {exc}\n")
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.stderr.write("phalanx: aborted\n")
        sys.exit(130)
    except KeyboardInterrupt:
        sys.stderr.write("phalanx: interrupted\n")
        sys.exit(130)
    except click.exceptions.ClickException as exc:  # usage errors: one line, exit 2
        if _DEBUG:
            raise
        message = exc.format_message().rstrip(".")
        ctx = getattr(exc, "ctx", None)
        where = f"{ctx.command_path} --help" if ctx is not None else "phalanx --help"
        sys.stderr.write(f"phalanx: error: {message[0].lower() + message[1:] if message else 'bad usage'}; see: {where}\n")
        sys.exit(getattr(exc, "exit_code", 2))


def _leading_options(args: list[str]) -> list[str]:
    """Options before the run target (``--debug`` after the script belongs to the script)."""
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    lead = []
    for word in args:
        if not word.startswith("-") and word not in commands:
            break
        lead.append(word)
    return lead
