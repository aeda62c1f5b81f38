"""Sweep commands: running a sweep from `phalanx run`, and `phalanx sweep show`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional

import typer

from .args import PROJECT_HELP, job_ref, project_scope

if TYPE_CHECKING:
    from ..core.spec import JobSpec
    from ..sweeps.settings import SweepSettings
from .render import dump_json, warn

sweep_app = typer.Typer(help="Inspect sweeps (a sweep is started by `phalanx run` with a search space).",
                        no_args_is_help=True, add_completion=False, rich_markup_mode=None)


def run_sweep_cli(spec: JobSpec, settings: SweepSettings, dry_run: bool, detach: bool, as_json: bool, clean: bool,
                  warnings: list[str] | None = None, notes: list[str] | None = None, quiet: bool = False) -> None:
    from ..sweeps.settings import check, slot_plan
    from ..sweeps.space import parse_space
    from .control import event

    space = parse_space(spec.entrypoint.args)
    strategy = check(spec, space, settings)
    if clean:
        raise typer.BadParameter("--clean-state does not apply to sweeps: each trial has its own state directory")
    if dry_run:
        from ..api import jobs

        jobs.check_storage(spec)  # what a real sweep checks first
        slots = slot_plan(spec, settings.parallel)
        warn(warnings or [], notes)
        out: dict[str, Any] = {
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
    from .face import face

    record, code = face().run_sweep(spec, settings, detach=detach, events=event)
    if detach:
        from .control import started_in_background

        if as_json:
            dump_json({"id": record["id"], "sweep": True, "name": record["name"]}, sys.stdout)
        else:
            typer.echo(record["id"])
        if not quiet:
            started_in_background(record["id"], sweep=True)
        return
    best = f"; best {record['objective']}={record['best_value']:g} (job {record['best_job']})" \
        if record["best_value"] is not None else ""
    reason = f"; {record['reason']}" if record.get("reason") else ""
    typer.echo(f"phalanx: sweep {record['id']} {record['state'].lower()}: {record['finished']}/{record['total']} trials "
               f"({record['failed']} failed, {record['pruned']} pruned){best}{reason}", err=True)
    if as_json:
        dump_json(record, sys.stdout)
    raise typer.Exit(code or 0)


@sweep_app.command("show")
def show_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
    sweep: str = typer.Argument(..., callback=job_ref, help="Sweep id, id prefix or name."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    as_csv: bool = typer.Option(False, "--csv", help="The trial table as CSV."),
) -> None:
    """A sweep's trials, best first: parameters, state, objective, the other metrics' final
    values; pruned trials with the step and the reason."""
    from ..errors import UsageError
    from .face import face
    from .listing import show_sweep

    if as_json and as_csv:
        raise UsageError("--json and --csv both given", "pick one")
    show_sweep(face().sweep(sweep), as_json, as_csv)
