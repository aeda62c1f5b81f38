"""``phalanx ps`` (jobs and sweeps, filtered, in columns that fit the terminal) and
``phalanx sweep show`` (a sweep's trial table). Thin: parse, one call on the face (``cli/face.py``), render.

Imports stay light (no torch, no web stack): ``ps`` is typed often.
"""

from __future__ import annotations

import csv
import shutil
import sys
from typing import Any, List, Optional, Sequence, TextIO

import typer

from .args import PROJECT_HELP, project_scope

from .render import ago, duration

PS_HEADERS = ("ID", "NAME", "STATE", "TOPOLOGY", "CREATED", "DURATION", "PROGRESS", "COMMAND")
WIDE = ("BACKEND", "GPU", "CPU", "COST", "TAGS", "HEALTH")  # device time in a unit that fits: 0.02 GPU-h, 3.6 CPU-s


def ps_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
    all_jobs: bool = typer.Option(False, "-a", "--all", help="Show finished jobs too."),
    state: List[str] = typer.Option([], "--state", help="Only these states (running, failed, ...; active, ended), comma-separated or repeated."),
    name: Optional[str] = typer.Option(None, "--name", help="Only this name, or a glob: 'resnet*'."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Only jobs of this backend."),
    tag: List[str] = typer.Option([], "--tag", help="Only jobs with this tag, KEY=VALUE or KEY (repeatable: all must hold)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only jobs created since: 2h, 3d, 2025-03-01."),
    search: Optional[str] = typer.Option(None, "--search", "-s", help="Only jobs whose id, name or command contains this."),
    user: Optional[str] = typer.Option(None, "--user", help="Only jobs and sweeps this user submitted."),
    mine: bool = typer.Option(False, "--mine", help="Only jobs and sweeps you submitted (--user YOU)."),
    sort: Optional[str] = typer.Option(None, "--sort", help="[default: created; --trials: trial order] name, state, backend, gpu_hours, cost or a metric (loss, acc:max); '-' descends."),
    columns: List[str] = typer.Option([], "--columns", "-c", help="Metric columns: loss, loss:min, acc:max (comma-separated or repeated)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many rows (default 50 with --all or a filter)."),
    wide: bool = typer.Option(False, "--wide", "-w", help="Also backend, GPU-hours, CPU-hours, cost, tags and health "
                              "(the slow rank of a running job, what stopped an ended one)."),
    trials: Optional[str] = typer.Option(None, "--trials", help="The trials of this sweep instead (with --sort and -c on their metrics)."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Only the ids (e.g. for phalanx rm)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List jobs and sweeps: running ones, or all with --all or any filter (newest first). A
    sweep is one row with its progress; --trials SWEEP lists its trials."""
    from ..api.ps import PsRequest
    from .face import face

    if trials is not None:
        _trials(face().trials(trials, sort, tuple(columns)), as_json, quiet)
        return
    request = PsRequest(all=all_jobs, states=tuple(state), name=name, backend=backend, tags=tuple(tag), since=since,
                        search=search, sort=sort, columns=tuple(columns), limit=limit, wide=wide,
                        people=not (as_json or quiet), user=user, mine=mine, project=project)
    listing = face().ps(request)
    if as_json:
        from ..api.face import rows_json
        from .render import dump_json_stream

        dump_json_stream(rows_json(listing.rows), sys.stdout)
        return
    if quiet:
        sys.stdout.writelines(r["id"] + "\n" for r in listing.rows)
        return
    _render(list(listing.rows), listing.columns, wide, listing.everything)


def _render(shown: Sequence[dict[str, Any]], columns: Sequence[str], wide: bool, everything: bool) -> None:
    from ..api.lists import short_command

    if not shown:
        typer.echo("no jobs yet" if everything else "no running jobs (phalanx ps --all shows finished ones)")
        return
    headers = [*PS_HEADERS[:-1], *(c.upper() for c in columns), *(WIDE if wide else ()), "COMMAND"]
    table: list[list[str]] = []
    for row in shown:
        base = [row["id"], row["name"], _shown_state(row), row["topology"], ago(row["created_at"]), duration(row["_duration"]),
                row.get("_progress") or "-"]
        if row.get("kind") != "sweep":
            extra = [_num((row.get("columns") or {}).get(c)) for c in columns]
            if wide:
                extra += [row["backend"], _hours(row.get("gpu_hours"), "GPU"), _hours(row.get("cpu_hours"), "CPU"),
                          _money(row.get("cost")),
                          ",".join(f"{k}={v}" for k, v in (row.get("tags") or {}).items()) or "-", row.get("_health") or "-"]
            command = short_command(row["command"])
        else:
            extra = ["-" for _ in columns]
            if wide:
                used = row["_usage"]
                extra += ["-", _hours(used["gpu_hours"], "GPU"), _hours(used["cpu_hours"], "CPU"), _money(used["cost"]), "-", "-"]
            command = f"[sweep {row['_sweep']}] {short_command(row['command'])}"
        table.append([*base, *extra, command])
    _fit(table, headers, sys.stdout)


def _shown_state(row: dict[str, Any]) -> str:
    """``FAILED(1)``, ``RUNNING (Training)``: the state, the exit code that is not 0, the platform's word."""
    state = row["state"] if row.get("exit_code") in (None, 0) or row.get("kind") == "sweep" \
        else f"{row['state']}({row['exit_code']})"
    if row.get("queue_place"):  # its place in its project's queue
        state = f"{state} #{row['queue_place']}"
    return state + (f" ({row['_platform']})" if row.get("_platform") else "")


def _fit(rows: list[list[str]], headers: Sequence[str], out: TextIO) -> None:
    """An aligned table whose last column (the command) is cut to what the terminal has left;
    piped into a file or another program, nothing is cut."""
    width = shutil.get_terminal_size((120, 24)).columns if out.isatty() else None
    cols = len(headers)
    widths = [max(len(headers[i]), *(len(r[i]) for r in rows)) for i in range(cols - 1)]
    if width is not None:
        name = headers.index("NAME") if "NAME" in headers else -1
        room = width - sum(widths) - 2 * (cols - 1)
        if room < 24 and name >= 0 and widths[name] > 12:  # a long name gives way first
            widths[name] = max(12, widths[name] - (24 - room))
            room = width - sum(widths) - 2 * (cols - 1)
        room = max(room, 16)
    for row in [list(headers), *rows]:
        cells = [_cut(row[i], widths[i]).ljust(widths[i]) for i in range(cols - 1)]
        last = row[-1] if width is None else _cut(row[-1], room)
        out.write("  ".join([*cells, last]).rstrip() + "\n")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.6g}"


def _hours(value: Any, device: str) -> str:
    from ..monitor.accounting import hours

    return hours(value, device)


def _money(value: Any) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _trials(found: dict[str, Any], as_json: bool, quiet: bool) -> None:
    records = found["rows"]
    if quiet:
        sys.stdout.writelines(r["id"] + "\n" for r in records)
        return
    if as_json:
        from ..api.face import rows_json
        from .render import dump_json

        dump_json(list(rows_json(iter(records))), sys.stdout)
        return
    sweep = found["sweep"]
    objective = (sweep["objective"] or "objective").upper()
    order = found["param_order"]
    columns = found.get("columns") or []
    rows = [[str(r["trial"]), r["id"], r["_state"], "-" if r["objective"] is None else f"{r['objective']:.6g}",
             *(_num(r["columns"].get(c)) for c in columns), ago(r["created_at"]), duration(r["_duration"]),
             _params(r["params"], order)] for r in records]
    if not rows:
        typer.echo(f"sweep {sweep['id']} has no trials yet")
        return
    _fit(rows, ("TRIAL", "ID", "STATE", objective, *(c.upper() for c in columns), "CREATED", "DURATION", "PARAMS"),
         sys.stdout)


def _params(values: dict[str, Any] | None, order: Sequence[str] = ()) -> str:
    values = values or {}
    names = [n for n in order if n in values] + [n for n in values if n not in order]
    return " ".join(f"{k}={_value(values[k])}" for k in names)


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# -- sweep show -------------------------------------------------------------------------------


def show_sweep(view: dict[str, Any], as_json: bool, as_csv: bool) -> None:
    """``phalanx sweep show``: one row per trial, best first: parameters, state, objective,
    the other metrics' final values, duration; pruned trials with the step and the reason."""
    from ..errors import UsageError
    from .render import dump_json

    if as_json and as_csv:
        raise UsageError("--json and --csv both given", "pick one")
    table = view["table"]
    if as_json:
        keep = {k: v for k, v in view.items() if k not in ("kind", "param_order")}
        dump_json(keep, sys.stdout)
        return
    if as_csv:  # raw values, one column per fact: for spreadsheets and pandas
        writer = csv.writer(sys.stdout)
        writer.writerow(["trial", "job", "state", *([table["objective"]] if table["objective"] else []), *table["params"],
                         *table["metrics"], "duration_s", "best", "pruned_step", "pruned_reason"])
        for r in table["rows"]:
            pruned = r["pruned"] or {}
            writer.writerow([r["trial"], r["id"], r["state"], *([r["objective"]] if table["objective"] else []),
                             *(r["params"].get(p, "") for p in table["params"]), *(r["metrics"].get(m) for m in table["metrics"]),
                             r["duration"], r["best"], pruned.get("step"), pruned.get("reason")])
        return
    render_sweep(view, sys.stdout)


def render_sweep(view: dict[str, Any], out: TextIO) -> None:
    table = view["table"]
    headers = ["TRIAL", "JOB", "STATE", *( [table["objective"]] if table["objective"] else []), *table["params"],
               *table["metrics"], "DURATION"]
    rows = []
    for r in table["rows"]:
        state = r["state"] + (f"@{r['pruned']['step']}" if r["pruned"] and r["pruned"].get("step") is not None else "")
        objective = [] if not table["objective"] else [
            "-" if r["objective"] is None else f"{r['objective']:.6g}" + ("" if r["final"] else " (running)") + (" *" if r["best"] else "")]
        rows.append([str(r["trial"]), r["id"], state, *objective, *(_value(r["params"].get(p, "")) for p in table["params"]),
                     *(_num(r["metrics"].get(m)) for m in table["metrics"]), duration(r["duration"])])
    out.write(f"sweep     {view['id']}  {view['name']}   {view['state']}   {view['progress_text']}\n")
    out.write(f"strategy  {view['strategy']}" + (f"   objective {view['objective']}:{view['direction']}" if view["objective"] else "") + "\n")
    out.write(f"command   {view['command']}\n")
    out.write(f"created   {ago(view['created_at'])}   duration {duration(view['duration'])}\n")
    if view["best_value"] is not None:
        out.write(f"best      {view['objective']}={view['best_value']:.6g}  job {view['best_job']}  "
                  f"{_params(view['best_params'], table['params'])}\n")
    if rows:
        out.write("\n")
        _fit(rows, [h.upper() if h in ("TRIAL", "JOB", "STATE", "DURATION") else h for h in headers], out)
    pruned = [r for r in table["rows"] if r["pruned"]]
    if pruned:
        out.write("\n")
        for r in pruned:
            out.write(f"trial {r['trial']} {r['pruned']['reason']}\n")
