"""``status``, ``logs``, ``metrics`` and ``wait`` given a sweep instead of a job: the sweep as a
whole (its progress, its trials' logs with a ``[trial N]`` prefix, its trials' final metrics,
waiting for it to end). The job commands call ``sweep_named`` first and hand a sweep here.
"""

from __future__ import annotations

import sys
from typing import Any

import typer



def sweep_named(ref: str) -> Any:
    """The sweep ``ref`` names (id, unique id prefix or name), or None when it names a job.
    A name both a sweep and a job carry means the newer of the two."""
    from ..query import find_sweep, open_store
    from ..errors import JobNotFound

    store = open_store()
    sweep = store.sweeps.find(ref)
    if sweep is None:
        return None
    try:
        job = store.find(ref)
    except JobNotFound:
        job = None
    if job is not None and job.sweep_id != sweep.id:
        by_id = sweep.id.startswith(ref) or sweep.id.startswith(ref.lower())
        if by_id and (job.id.startswith(ref) or job.id.startswith(ref.lower())):
            raise JobNotFound(f"'{ref}' is the start of both job {job.id} and sweep {sweep.id}",
                              "type more characters of the id")
        if not by_id and job.name == ref and job.created_at > sweep.created_at:
            return None
    return find_sweep(sweep.id, store)


def status(sweep: Any, as_json: bool) -> None:
    from ..query import open_store
    from ..lists import sweep_row
    from ..sweepview import trial_table
    from .listing import show_sweep
    from .render import dump_json

    store = open_store()
    if as_json:
        dump_json({**sweep_row(store, sweep), "table": trial_table(store, sweep)}, sys.stdout)
        return
    show_sweep(sweep.id, False, False)
    row = sweep_row(store, sweep)
    from ..monitor.accounting import hours, money

    out = sys.stdout
    out.write(f"\nusage     {hours(row['gpu_hours'])} GPU-hours, {hours(row['cpu_hours'])} CPU-hours"
              + (f", cost {money(row['cost'])}" if row["cost"] is not None else "") + f" over {row['jobs']} trial(s)\n")
    if sweep.supervisor_pid and not _ended(sweep):
        out.write(f"runner    pid {sweep.supervisor_pid}; follow it: phalanx logs {sweep.id} -f\n")
    from ..query import sweep_tracker

    parent = sweep_tracker(sweep)
    if parent:
        out.write(f"mlflow    {parent}  (the sweep's run; each trial's is nested under it)\n")


def _ended(sweep: Any) -> bool:
    from ..core.state import is_terminal

    return is_terminal(sweep.state)


def logs(sweep: Any, follow: bool, rank: int | None, trial: int | None, tail: int | None) -> None:
    from ..query import find_sweep, open_store
    from ..sweepview import follow_sweep_logs

    store = open_store()

    def emit(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    follow_sweep_logs(store, sweep.id, emit, follow, rank=0 if rank is None else rank, trial=trial, tail=tail,
                      refresh=lambda sweep_id: find_sweep(sweep_id, store))


def metrics(sweep: Any, as_json: bool) -> None:
    """Every trial's final value of every metric, best first."""
    from ..query import open_store
    from ..sweepview import trial_table
    from .listing import _fit, _num
    from .render import dump_json

    table = trial_table(open_store(), sweep)
    if as_json:
        dump_json(table, sys.stdout)
        return
    names = ([table["objective"]] if table["objective"] else []) + table["metrics"]
    rows = [[str(r["trial"]), r["id"], r["state"],
             *(_num(r["objective"] if n == table["objective"] else r["metrics"].get(n)) for n in names)]
            for r in table["rows"]]
    if not rows:
        typer.echo(f"sweep {sweep.id} has no trials yet")
        return
    _fit(rows, ["TRIAL", "JOB", "STATE", *names], sys.stdout)


def wait(sweep: Any, timeout: float | None) -> None:
    from ..jobs import wait_sweep
    from ..sweepview import sweep_exit_code

    done = wait_sweep(sweep.id, timeout)
    code = sweep_exit_code(done)
    typer.echo(f"{done.id} {done.state.value}: {done.progress} trials ({done.failed} failed, {done.pruned} pruned)"
               + (f", best {done.objective}={done.best_value:.6g}" if done.best_value is not None else ""), err=True)
    raise typer.Exit(code)
