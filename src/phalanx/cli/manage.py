"""``phalanx rm | prune | usage``: remove what ended, say what it freed; add up what jobs used.
Also the helpers ``status`` and ``logs`` share: the usage line and the offsets of
``logs --tail/--since``. Thin: parse, one call on the face (``cli/face.py``), render.
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional

import typer

from .args import PROJECT_HELP, project_scope


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


def _report(removed: dict[str, Any], as_json: bool) -> None:
    from .render import dump_json

    if as_json:
        dump_json(removed, sys.stdout)
        return
    dry_run = removed["dry_run"]
    what = []
    if removed["jobs"]:
        what.append(f"{removed['jobs']} job(s)")
    if removed["sweeps"]:
        what.append(f"{removed['sweeps']} sweep(s)")
    verb = "would remove" if dry_run else "removed"
    dirs = removed["state_dirs"]
    extra = f", {len(dirs)} state director{'y' if len(dirs) == 1 else 'ies'}" if dirs else ""
    objects = f", {removed['objects']} code file(s) no job uses any more" if removed["objects"] else ""
    typer.echo(f"{verb} {' and '.join(what) or 'nothing'}{extra}{objects}: {_size(removed['bytes'])} "
               f"{'would be ' if dry_run else ''}freed")
    for kept in removed["kept_state"]:
        typer.echo(f"kept {kept}: another job still names it", err=True)


def rm_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
    refs: List[str] = typer.Argument(..., metavar="JOB_OR_SWEEP...", help="Job or sweep ids, id prefixes or names."),
    all_named: bool = typer.Option(False, "--all-named", help="A name several jobs or sweeps carry: remove every one of them."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go, remove nothing."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Delete jobs or sweeps that ended, with their files: logs, metrics, outputs, code
    snapshot, and their state directory unless another job names it. Never a running job. A
    name several jobs or sweeps carry: asked which at a terminal, else refused (--all-named: all of them)."""
    from ..errors import Ambiguous
    from .face import face

    try:
        removed = face().rm(refs, dry_run, all_named)
    except Ambiguous as exc:
        if as_json or not (sys.stdin.isatty() and sys.stderr.isatty()):
            raise  # a script is shown the list and --all-named
        name, ids = str(exc.choices[0]["name"]), _choose(exc)
        removed = face().rm([i for ref in refs for i in (ids if ref == name else [ref])], dry_run)
    _report(removed, as_json)


def _choose(exc: Any) -> List[str]:
    """Ask the person at the terminal which of the jobs and sweeps of one name go: numbers, or all."""
    from ..errors import PhalanxError
    from .render import ago

    err = sys.stderr
    err.write(f"phalanx: {exc.message}:\n")
    for i, job in enumerate(exc.choices, 1):
        err.write(f"  {i:>2}  {job['id']}  {job['state']:<10} {ago(job['created_at']):>8}  {job['command']}\n")
    err.write("remove which? numbers (1 3), 'all', or nothing to cancel: ")
    err.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer == "all":
        return [str(j["id"]) for j in exc.choices]
    try:
        numbers = [int(word) for word in answer.replace(",", " ").split()]
        picked = [exc.choices[n - 1] for n in numbers if n >= 1]
    except (ValueError, IndexError):
        raise PhalanxError(f"'{answer}' is not among 1-{len(exc.choices)} or all", "nothing was removed") from None
    if not picked or len(picked) != len(numbers):
        raise PhalanxError("nothing removed", f"answer with numbers from 1 to {len(exc.choices)}, or all")
    return list(dict.fromkeys(str(j["id"]) for j in picked))


def prune_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
    older_than: str = typer.Option(..., "--older-than", help="Remove what was created longer ago than this: 30d, 12h, 2w."),
    state: List[str] = typer.Option([], "--state", help="Only these end states (failed, cancelled, lost, ...); default: every ended one."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go, remove nothing."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Delete every job and sweep that ended and is older than --older-than, with its files."""
    from .face import face

    _report(face().prune(older_than, state, dry_run), as_json)


def usage_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
    by: str = typer.Option("name", "--by", help="Group by name (a sweep's trials under its name), sweep, backend, state, "
                           "day, user or project (with each project's quota and budget beside)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only jobs created since: 7d, 2025-03-01."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """GPU-hours, CPU-hours and estimated cost of the jobs that ended, added up by name (or
    sweep, backend, state, day, user, project). Prices come from the prices setting."""
    from ..monitor.accounting import hours, money
    from .face import face
    from .listing import _fit
    from .render import dump_json

    rows = face().usage(by, since, project)
    if as_json:
        dump_json(rows, sys.stdout)
        return
    if project and by != "project":
        typer.echo(_project_line(project))
    if not rows:
        typer.echo("no jobs yet")
        return
    table = [[str(r["group"]), str(r["jobs"]), hours(r["gpu_hours"], "GPU"), hours(r["cpu_hours"], "CPU"), money(r["cost"]),
              *(_limits(r) if by == "project" else [])] for r in rows]
    total = [sum(r[k] or 0.0 for r in rows) for k in ("gpu_hours", "cpu_hours")]
    costs = [r["cost"] for r in rows if r["cost"] is not None]
    table.append(["total", str(sum(r["jobs"] for r in rows)), hours(total[0], "GPU"), hours(total[1], "CPU"),
                  money(sum(costs)) if costs else "-", *(["", "", ""] if by == "project" else [])])
    extra = ("QUOTA", "IN USE", "BUDGET THIS MONTH") if by == "project" else ()
    _fit(table, (by.upper(), "JOBS", "GPU", "CPU", "COST", *extra), sys.stdout)


def _limits(row: dict[str, Any]) -> list[str]:
    """A project's quota, what it holds now, and its budget with this month's spending."""
    quota, use, budget = row.get("quota") or {}, row.get("in_use") or {}, row.get("budget")
    parts = [f"{quota[k]} {k.upper() if k != 'jobs' else 'jobs'}" for k in ("gpus", "cpus", "jobs") if quota.get(k) is not None]
    held = f"{use.get('gpus', 0)} GPUs, {use.get('jobs', 0)} jobs" if use else "-"
    spent = f"{budget['used']:,.2f} of {budget['amount']:g} {budget['unit']}" if budget else "-"
    return [", ".join(parts) or "-", held, spent]


def _project_line(name: str) -> str:
    from .face import face

    found = next((p for p in face().projects() if p["name"] == name), None)
    if found is None:
        return f"project {name}"
    row = {"quota": {"gpus": found["max_gpus"], "cpus": found["max_cpus"], "jobs": found["max_jobs"]},
           "in_use": found["in_use"], "budget": None if found["budget"] is None else {
               "amount": found["budget"], "unit": found["budget_unit"],
               "used": found["spent"]["gpu_hours"] if found["budget_unit"] == "gpu-h" else (found["spent"]["cost"] or 0.0)}}
    quota, held, spent = _limits(row)
    return f"project {name}: quota {quota} ({held} in use); budget {spent}"


# -- shared with status and logs -------------------------------------------------------------


def usage_text(used: dict[str, Any]) -> str:
    """``usage     0.52 GPU-h (2 GPUs/node, A100), 4.1 CPU-h, cost 1.30 (A100)``; the
    attempts add up (a retry's time counts). ``used``: ``monitor.accounting.Usage`` as data."""
    from ..monitor.accounting import hours, money

    per_node = used["gpus_per_node"]
    gpus = f" ({per_node} GPU{'s' if per_node != 1 else ''}/node{', ' + used['gpu_model'] if used['gpu_model'] else ''})" \
        if per_node else ""
    cost = f", cost {money(used['cost'])} ({used['priced_by']})" if used["cost"] is not None else ""
    billed = " (billed time)" if used["billed"] else ""
    attempts = f" over {len(used['attempts'])} attempts" if len(used["attempts"]) > 1 else ""
    return f"usage     {hours(used['gpu_hours'], 'GPU')}{gpus}, {hours(used['cpu_hours'], 'CPU')}{cost}{billed}{attempts}\n"
