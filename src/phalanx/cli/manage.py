"""``phalanx rm | prune | usage``: remove what ended, say what it freed; add up what jobs used.
Also the helpers ``status`` and ``logs`` share: the usage line and the offsets of
``logs --tail/--since``. Thin: parse, call ``cleanup``/``store.listing``, render.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, List, Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("rm")(rm_cmd)
    app.command("prune")(prune_cmd)
    app.command("usage")(usage_cmd)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def _report(removed: Any, dry_run: bool, as_json: bool) -> None:
    from .render import dump_json

    if as_json:
        dump_json({**removed.to_dict(), "dry_run": dry_run}, sys.stdout)
        return
    what = []
    if removed.jobs:
        what.append(f"{removed.jobs} job(s)")
    if removed.sweeps:
        what.append(f"{removed.sweeps} sweep(s)")
    verb = "would remove" if dry_run else "removed"
    extra = f", {len(removed.state_dirs)} state director{'y' if len(removed.state_dirs) == 1 else 'ies'}" if removed.state_dirs else ""
    objects = f", {removed.objects} code file(s) no job uses any more" if removed.objects else ""
    typer.echo(f"{verb} {' and '.join(what) or 'nothing'}{extra}{objects}: {_size(removed.bytes)} "
               f"{'would be ' if dry_run else ''}freed")
    for kept in removed.kept_state:
        typer.echo(f"kept {kept}: another job still names it", err=True)


def rm_cmd(
    refs: List[str] = typer.Argument(..., metavar="JOB_OR_SWEEP...", help="Job or sweep ids, id prefixes or names."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go, remove nothing."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Delete jobs or sweeps that ended, with their files: logs, metrics, outputs, code
    snapshot, and their state directory unless another job names it. Never a running job."""
    from ..query import home, open_store
    from ..cleanup import remove, resolve

    store = open_store()
    targets = resolve(store, refs)  # every one checked before anything goes
    _report(remove(store, home(), targets, dry_run), dry_run, as_json)


def prune_cmd(
    older_than: str = typer.Option(..., "--older-than", help="Remove what was created longer ago than this: 30d, 12h, 2w."),
    state: List[str] = typer.Option([], "--state", help="Only these end states (failed, cancelled, lost, ...); default: every ended one."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go, remove nothing."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Delete every job and sweep that ended and is older than --older-than, with its files."""
    from ..query import home, open_store
    from ..cleanup import prune_targets, remove
    from ..core.state import TERMINAL
    from ..errors import UsageError
    from ..lists import parse_states
    from ..monitor.logindex import parse_duration

    age = parse_duration(older_than, "--older-than")
    states = parse_states(state)
    ended = {s.value for s in TERMINAL}
    running = [s for s in states if s not in ended]
    if running:
        raise UsageError(f"--state {running[0].lower()} is not an end state: prune removes only what ended",
                         f"use one of: {', '.join(sorted(s.lower() for s in ended))}")
    store = open_store()
    targets = prune_targets(store, age, states, time.time())
    _report(remove(store, home(), targets, dry_run), dry_run, as_json)


def usage_cmd(
    by: str = typer.Option("name", "--by", help="Group by name (a sweep's trials under its name), sweep, backend, state, day or user."),
    since: Optional[str] = typer.Option(None, "--since", help="Only jobs created since: 7d, 2025-03-01."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """GPU-hours, CPU-hours and estimated cost of the jobs that ended, added up by name (or
    sweep, backend, state, day). Prices come from the prices setting."""
    from ..query import open_store
    from ..errors import UsageError
    from ..monitor.accounting import hours, money
    from ..monitor.logindex import parse_since
    from ..store.listing import GROUPS, usage_totals
    from .listing import _fit
    from .render import dump_json

    if by not in GROUPS:
        raise UsageError(f"unknown --by '{by}'", f"group by one of: {', '.join(GROUPS)}")
    rows = usage_totals(open_store(), by, parse_since(since) if since else None)
    if as_json:
        dump_json(rows, sys.stdout)
        return
    if not rows:
        typer.echo("no jobs yet")
        return
    table = [[str(r["group"]), str(r["jobs"]), hours(r["gpu_hours"]), hours(r["cpu_hours"]), money(r["cost"])] for r in rows]
    total = [sum(r[k] or 0.0 for r in rows) for k in ("gpu_hours", "cpu_hours")]
    costs = [r["cost"] for r in rows if r["cost"] is not None]
    table.append(["total", str(sum(r["jobs"] for r in rows)), hours(total[0]), hours(total[1]), money(sum(costs)) if costs else "-"])
    _fit(table, (by.upper(), "JOBS", "GPU-H", "CPU-H", "COST"), sys.stdout)


# -- shared with status and logs -------------------------------------------------------------


def usage_line(record: Any) -> str:
    """``usage     0.52 GPU-hours (2 GPUs/node, A100), 4.1 CPU-hours, cost 1.30 (A100)``; the
    attempts add up (a retry's time counts)."""
    from ..monitor.accounting import hours, job_usage, money

    used = job_usage(record)
    gpus = f" ({used.gpus_per_node} GPU{'s' if used.gpus_per_node != 1 else ''}/node{', ' + used.gpu_model if used.gpu_model else ''})" \
        if used.gpus_per_node else ""
    cost = f", cost {money(used.cost)} ({used.priced_by})" if used.cost is not None else ""
    billed = " (billed time)" if used.billed else ""
    attempts = f" over {len(used.attempts)} attempts" if len(used.attempts) > 1 else ""
    return f"usage     {hours(used.gpu_hours)} GPU-hours{gpus}, {hours(used.cpu_hours)} CPU-hours{cost}{billed}{attempts}\n"


def log_offsets(record: Any, attempt: int | None, rank: int | None, tail: int | None, since: str | None,
                say: Callable[[str], None]) -> dict[int, int]:
    """Where each rank's log of the attempt is read from for ``--tail N`` / ``--since T``
    (both: the later of the two)."""
    from pathlib import Path

    from ..core.paths import JobPaths
    from ..monitor.logindex import parse_since, since_offset, tail_offset

    paths = JobPaths(Path(record.job_dir))
    attempt = record.attempt if attempt is None else attempt
    when = parse_since(since) if since else None
    out: dict[int, int] = {}
    missing = False
    for r in paths.ranks(attempt):
        if rank is not None and r != rank:
            continue
        offset = 0
        if tail is not None:
            offset = tail_offset(paths.rank_log(attempt, r), tail)
        if when is not None:
            found = since_offset(paths, attempt, r, when)
            missing = missing or found is None
            offset = max(offset, found or 0)
        out[r] = offset
    if missing:
        say(f"job {record.id} was recorded without a log index (older phalanx): --since shows its whole log")
    return out
