"""``status`` and ``metrics`` given a sweep instead of a job: the sweep as a whole (its progress
and trial table, its usage; its trials' final metrics), rendered from what the face returns."""

from __future__ import annotations

import sys
from typing import Any

import typer


def render_sweep_status(view: dict[str, Any], as_json: bool) -> None:
    from ..monitor.accounting import hours, money
    from .listing import render_sweep
    from .render import dump_json

    if as_json:
        dump_json({k: v for k, v in view.items() if k not in ("kind", "trials", "param_order")}, sys.stdout)
        return
    render_sweep(view, sys.stdout)
    out = sys.stdout
    out.write(f"\nusage     {hours(view['gpu_hours'], 'GPU')}, {hours(view['cpu_hours'], 'CPU')}"
              + (f", cost {money(view['cost'])}" if view["cost"] is not None else "") + f" over {view['jobs']} trial(s)\n")
    if view["supervisor_pid"] and view["state"] not in _ENDED:
        out.write(f"runner    pid {view['supervisor_pid']}; follow it: phalanx logs {view['id']} -f\n")
    if view.get("tracker"):
        out.write(f"mlflow    {view['tracker']}  (the sweep's run; each trial's is nested under it)\n")


def _ended() -> frozenset[str]:
    from ..core.state import TERMINAL

    return frozenset(s.value for s in TERMINAL)


_ENDED = _ended()


def render_metrics(table: dict[str, Any], as_json: bool) -> None:
    """Every trial's final value of every metric, best first."""
    from .listing import _fit, _num
    from .render import dump_json

    if as_json:
        dump_json({k: v for k, v in table.items() if k not in ("kind", "id")}, sys.stdout)
        return
    names = ([table["objective"]] if table["objective"] else []) + table["metrics"]
    rows = [[str(r["trial"]), r["id"], r["state"],
             *(_num(r["objective"] if n == table["objective"] else r["metrics"].get(n)) for n in names)]
            for r in table["rows"]]
    if not rows:
        typer.echo(f"sweep {table['id']} has no trials yet")
        return
    _fit(rows, ["TRIAL", "JOB", "STATE", *names], sys.stdout)
