"""Sweep commands: running a sweep from `phalanx run`, and `phalanx sweep show`."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from .args import job_ref
from .render import ago, dump_json, duration, table, warn

sweep_app = typer.Typer(help="Inspect sweeps (a sweep is started by `phalanx run` with a search space).",
                        no_args_is_help=True, add_completion=False, rich_markup_mode=None)


def run_sweep_cli(spec: Any, settings: Any, dry_run: bool, detach: bool, as_json: bool, clean: bool,
                  warnings: list[str] | None = None, notes: list[str] | None = None) -> None:
    from .. import jobs
    from ..sweeps.settings import check, slot_plan
    from ..sweeps.space import parse_space
    from .control import event

    space = parse_space(spec.entrypoint.args)
    strategy = check(spec, space, settings)
    if clean:
        raise typer.BadParameter("--clean-state does not apply to sweeps: each trial has its own state directory")
    if dry_run:
        jobs.check_storage(spec)  # what a real sweep checks first
        slots = slot_plan(spec, settings.parallel)
        warn(warnings or [], notes)
        out = {
            "strategy": settings.strategy, "trials": strategy.total, "concurrent": len(slots),
            "params": [p.name for p in space.params],
            "first": [space.apply(strategy.params_for(n)) for n in range(min(3, strategy.total))]
            if settings.strategy != "tpe" else [],
        }
        if as_json:
            dump_json(out, sys.stdout)
        else:
            typer.echo(f"sweep: {settings.strategy}, {strategy.total} trials, {len(slots)} at a time, "
                       f"over {', '.join(out['params'])}")
            for args in out["first"]:
                typer.echo(f"  {spec.entrypoint.target} {' '.join(args)}")
        return
    warn(warnings or [], notes)
    record, code = jobs.run_sweep(spec, settings, detach=detach, events=event)
    if detach:
        if as_json:
            dump_json({"id": record.id, "sweep": True, "name": record.name}, sys.stdout)
        else:
            typer.echo(record.id)
        return
    best = f"; best {record.objective}={record.best_value:g} (job {record.best_job})" if record.best_value is not None else ""
    typer.echo(f"phalanx: sweep {record.id} {record.state.value.lower()}: {record.finished}/{record.total} trials "
               f"({record.failed} failed, {record.pruned} pruned){best}", err=True)
    if as_json:
        dump_json(record.to_dict(), sys.stdout)
    raise typer.Exit(code or 0)


@sweep_app.command("show")
def show_cmd(
    sweep: str = typer.Argument(..., callback=job_ref, help="Sweep id, id prefix or name."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """A sweep's trials, best first: parameters, state and objective."""
    from .. import query
    from ..errors import JobNotFound

    store = query.open_store()
    record = query.find_sweep(sweep, store)
    if record is None:
        raise JobNotFound(f"no sweep with id or name '{sweep}'", "list sweeps with: phalanx ps --all")
    trials = sorted(query.trials(record, store), key=_order(record.direction))
    if as_json:
        dump_json({**record.to_dict(), "trials": [t.to_dict() for t in trials]}, sys.stdout)
        return
    out = sys.stdout
    out.write(f"sweep     {record.id}  {record.name}\n")
    out.write(f"state     {record.state.value}   {record.progress} trials ({record.failed} failed, {record.pruned} pruned)\n")
    out.write(f"strategy  {record.strategy}" + (f"   objective {record.objective}:{record.direction}" if record.objective else "") + "\n")
    out.write(f"command   {record.command}\n")
    out.write(f"created   {ago(record.created_at)}   duration {duration(record.duration)}\n")
    if record.best_value is not None:
        out.write(f"best      {record.objective}={record.best_value:g}  job {record.best_job}  {record.best_params}\n")
    if trials:
        out.write("\n")
        rows = [
            (str(t.trial), t.id, t.state.value, "-" if t.objective is None else f"{t.objective:.6g}",
             " ".join(f"{k}={_fmt(v)}" for k, v in json.loads(t.params_json or "{}").items()))
            for t in trials
        ]
        table(rows, ("TRIAL", "JOB", "STATE", (record.objective or "OBJECTIVE").upper(), "PARAMS"), out)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _order(direction: str | None) -> Any:
    sign = -1 if direction == "max" else 1

    def key(t: Any) -> tuple[int, float, int]:
        return (t.objective is None, sign * (t.objective or 0.0), t.trial or 0)

    return key
