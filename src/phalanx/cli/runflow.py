"""What ``phalanx run`` does with its parsed options: build the spec (one library call), then
dry-run, detach, sweep or run in the foreground, and tell the person at the terminal what
happened: one line when the job starts, one when it ends (``-q`` silences both)."""

from __future__ import annotations

import sys
from typing import Any

import typer


def run_from_cli(words: list[str], given: dict[str, Any]) -> None:
    from ..jobfile import RunOptions, build_spec, build_sweep, resolve
    from .control import event, report_end
    from .render import dump_json, warn

    backend_names = {o.name for o in _backend_options()}
    opts = RunOptions(
        words=words,
        backend_options={k: v for k, v in given.items() if k in backend_names},
        **{k: v for k, v in given.items() if k not in backend_names},
    )
    values = resolve(opts)
    from .face import is_remote

    spec, sweep = build_sweep(opts, build_spec(opts, values, resolve_jobs=not is_remote()), values)
    as_json, quiet = bool(values["as_json"]), bool(values["quiet"])
    if spec.backend_options.get("in_cluster") and sweep is not None:
        from ..errors import UsageError

        raise UsageError("--in-cluster does not apply to sweeps yet (their trials are supervised by the sweep runner)",
                         "drop --in-cluster, or run the sweep's trials as separate jobs")
    if spec.backend_options.get("in_cluster") and not values["detach"] and not values["dry_run"]:
        from ..errors import UsageError

        raise UsageError("--in-cluster runs the job's supervisor in the cluster, so the job runs detached",
                         "add -d; follow it with: phalanx logs -f JOB")
    say = (lambda text: None) if quiet else event
    if sweep is not None:
        from .sweep import run_sweep_cli

        run_sweep_cli(spec, sweep, dry_run=bool(values["dry_run"]), detach=bool(values["detach"]), as_json=as_json,
                      clean=bool(values["clean_state"]), warnings=values.warnings, notes=values.notes)
        return
    from .face import face

    if values["dry_run"]:
        planned = face().dry_run(spec)
        warn(values.warnings, values.notes)
        if as_json:
            dump_json(planned["plan"], sys.stdout)
        else:
            sys.stdout.write(planned["text"])
        return
    warn(values.warnings, values.notes)
    if values["clean_state"]:
        moved = face().clean_state(spec)
        if moved:
            say(f"previous state of '{spec.name}' moved to {moved}")
    if values["detach"]:
        record = face().submit(spec, events=say)
        if as_json:
            dump_json({"id": record["id"], "name": record["name"], "job_dir": record["job_dir"]}, sys.stdout)
        else:
            typer.echo(record["id"])
        return
    shown = terminal_ranks(values, spec)
    out = sys.stderr if as_json else sys.stdout  # --json: stdout holds only the JSON
    record, code = face().run(spec, out=out, ranks=shown, events=say, started=None if quiet else announce)
    if not quiet:
        report_end(record, shown=shown)
    if as_json:
        dump_json({k: v for k, v in record.items() if k != "duration"}, sys.stdout)
    raise typer.Exit(code)


def _backend_options() -> tuple[Any, ...]:
    from ..backends.options import backend_options

    return backend_options()


def announce(record: dict[str, Any]) -> None:
    """The start line: which job, and where its logs are."""
    from .control import event

    event(f"job {record['id']} ({record['name']}) started: {record['topology']} on {record['backend']}; "
          f"logs: phalanx logs {record['id']} (in {record['job_dir']})")


def terminal_ranks(values: Any, spec: Any) -> set[int] | None:
    """Which ranks' output the terminal shows: --ranks, torchrun's --local-ranks-filter (local
    ranks of every node) and --redirects (a rank whose output torchrun would redirect to a file
    is not shown; phalanx logs every rank anyway). None: all."""
    nproc, nnodes = spec.procs_per_node_started, spec.resources.nnodes
    world = range(nproc * nnodes)
    shown: set[int] | None = set(values["ranks"]) if values["ranks"] is not None else None
    if values["local_ranks_filter"] is not None:
        local = {n * nproc + r for n in range(nnodes) for r in values["local_ranks_filter"] if r < nproc}
        shown = local if shown is None else shown & local
    redirects = values["redirects"]
    if redirects and redirects != "0":
        hidden = set(world) if ":" not in redirects else {
            int(rank) for rank, _, how in (p.partition(":") for p in redirects.split(",")) if how != "0"}
        shown = (set(world) if shown is None else shown) - hidden
    return shown
