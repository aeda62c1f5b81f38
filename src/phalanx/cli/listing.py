"""``phalanx ps`` (jobs and sweeps, filtered, in columns that fit the terminal) and
``phalanx sweep show`` (a sweep's trial table). Thin: parse, call ``lists``/``sweepview``, render.

Imports stay light (no torch, no web stack): ``ps`` is typed often.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
from typing import Any, Iterator, List, Optional, Sequence, TextIO

import typer

from .render import ago, duration

PS_HEADERS = ("ID", "NAME", "STATE", "TOPOLOGY", "CREATED", "DURATION", "COMMAND")
WIDE = ("BACKEND", "GPU-H", "CPU-H", "COST", "TAGS")


def ps_cmd(
    all_jobs: bool = typer.Option(False, "-a", "--all", help="Show finished jobs too."),
    state: List[str] = typer.Option([], "--state", help="Only these states (running, failed, ...; active, ended), comma-separated or repeated."),
    name: Optional[str] = typer.Option(None, "--name", help="Only this name, or a glob: 'resnet*'."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Only jobs of this backend."),
    tag: List[str] = typer.Option([], "--tag", help="Only jobs with this tag, KEY=VALUE or KEY (repeatable: all must hold)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only jobs created since: 2h, 3d, 2025-03-01."),
    search: Optional[str] = typer.Option(None, "--search", "-s", help="Only jobs whose id, name or command contains this."),
    user: Optional[str] = typer.Option(None, "--user", help="Only jobs and sweeps this user submitted."),
    mine: bool = typer.Option(False, "--mine", help="Only jobs and sweeps you submitted (--user YOU)."),
    sort: Optional[str] = typer.Option(None, "--sort", help="created (default), name, state, backend, gpu_hours, cost or a metric (loss, acc:max); '-' descends."),
    columns: List[str] = typer.Option([], "--columns", "-c", help="Metric columns: loss, loss:min, acc:max (comma-separated or repeated)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many rows (default 50 with --all or a filter)."),
    wide: bool = typer.Option(False, "--wide", "-w", help="Also backend, GPU-hours, CPU-hours, cost and tags."),
    trials: Optional[str] = typer.Option(None, "--trials", help="The trials of this sweep instead."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Only the ids (e.g. for phalanx rm)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List jobs and sweeps: running ones, or all with --all or any filter (newest first). A
    sweep is one row with its progress; --trials SWEEP lists its trials."""
    from .. import config
    from ..query import open_store
    from ..errors import UsageError
    from ..lists import build_query, check_metrics

    if limit is not None and limit < 1:
        raise UsageError(f"invalid --limit {limit}", "give a number of rows of at least 1, e.g. --limit 20")
    store = open_store()
    if trials is not None:
        _trials(store, trials, as_json, quiet)
        return
    from ..query import refresh_hosted

    refresh_hosted(store, backend)  # jobs supervised in a cluster (k8s --in-cluster), from any machine
    if mine:
        if user is not None and user != config.user():
            raise UsageError(f"--mine (you are {config.user()}) and --user {user} contradict", "give one of them")
        user = config.user()
    query = build_query(states=state, name=name, backend=backend, tags=tag, since=since, search=search, sort=sort,
                        columns=columns, user=user)
    check_metrics(store, query.columns, query.sort)
    filtered = bool(state or name or backend or tag or since or search or sort or columns or user)
    everything = all_jobs or filtered
    if limit is None and everything:
        limit = int(config.get("ps_limit"))
    if not state and not everything:
        query = build_query(states=["active"], columns=columns)
    records = _jobs(store, query, limit)
    sweeps = [] if (backend or query.sort.key != "created") else _sweeps(store, query, limit, everything)
    if as_json and not query.columns and not wide:
        from .render import dump_json_stream

        rows = _chain((r.to_dict() for r in records), ({**s.to_dict(), "kind": "sweep"} for s in sweeps))
        dump_json_stream(rows, sys.stdout)
        return
    shown = list(_merge(records, sweeps, limit, query.sort.key == "created"))
    if quiet:
        sys.stdout.writelines(r.id + "\n" for r in shown)
        return
    _render(store, shown, query.columns, wide, as_json, everything)


def _jobs(store: Any, query: Any, limit: int | None) -> Iterator[Any]:
    """The matching jobs, a page at a time (memory stays flat for any --limit)."""
    from ..supervise.liveness import effective
    from ..core.state import is_terminal
    from ..store.listing import page_jobs

    after, left = None, limit
    while left is None or left > 0:
        page = page_jobs(store, query.filter, query.sort, 500 if left is None else min(500, left), after)
        for record in page.rows:
            if not is_terminal(record.state):
                record = effective(record)
                if query.filter.states and record.state.value not in query.filter.states:
                    continue
            yield record
        if page.next is None:
            return
        after = page.next
        if left is not None:
            left -= len(page.rows)


def _sweeps(store: Any, query: Any, limit: int | None, everything: bool) -> list[Any]:
    from ..core.state import is_terminal
    from ..store.listing import page_sweeps
    from ..supervise.liveness import effective

    out = []
    for sweep in page_sweeps(store, query.filter, limit=limit or 1000).rows:
        if not is_terminal(sweep.state):
            sweep = effective(sweep)  # its runner gone: LOST (computed, not written)
            if not everything and is_terminal(sweep.state):
                continue
        out.append(sweep)
    return out


def _chain(*parts: Any) -> Iterator[Any]:
    for part in parts:
        yield from part


def _merge(records: Iterator[Any], sweeps: list[Any], limit: int | None, by_time: bool) -> Iterator[Any]:
    import heapq
    import itertools

    rows = heapq.merge(records, sweeps, key=lambda r: r.created_at, reverse=True) if by_time else _chain(records, sweeps)
    return itertools.islice(rows, limit)


def _render(store: Any, shown: Sequence[Any], columns: Sequence[Any], wide: bool, as_json: bool, everything: bool) -> None:
    from ..lists import job_rows, short_command, sweep_progress
    from ..store import JobRecord
    from .render import dump_json, job_rows as state_rows

    jobs_shown = [r for r in shown if isinstance(r, JobRecord)]
    rows = {r["id"]: r for r in job_rows(store, jobs_shown, columns)} if (columns or wide or as_json) else {}
    if as_json:
        out = [rows[r.id] if isinstance(r, JobRecord) else {**r.to_dict(), "kind": "sweep"} for r in shown]
        dump_json(out, sys.stdout)
        return
    if not shown:
        typer.echo("no jobs yet" if everything else "no running jobs (phalanx ps --all shows finished ones)")
        return
    headers = [*PS_HEADERS[:-1], *(c.label.upper() for c in columns), *(WIDE if wide else ()), "COMMAND"]
    table: list[list[str]] = []
    for record in shown:
        if isinstance(record, JobRecord):
            base = list(state_rows([record])[0][:-1])
            row = rows.get(record.id, {})
            extra = [_num((row.get("columns") or {}).get(c.label)) for c in columns]
            if wide:
                extra += [record.backend, _hours(row.get("gpu_hours")), _hours(row.get("cpu_hours")), _money(row.get("cost")),
                          ",".join(f"{k}={v}" for k, v in (row.get("tags") or {}).items()) or "-"]
            command = short_command(record.command)
        else:
            progress = sweep_progress(store, record)["text"]
            base = [record.id, record.name, record.state.value, record.topology, ago(record.created_at), duration(record.duration)]
            extra = ["-" for _ in columns]
            if wide:
                from ..store.listing import usage_sum

                used = usage_sum(store, sweep_id=record.id)
                extra += ["-", _hours(used["gpu_hours"]), _hours(used["cpu_hours"]), _money(used["cost"]), "-"]
            command = f"[sweep {progress}] {short_command(record.command)}"
        table.append([*base, *extra, command])
    _fit(table, headers, sys.stdout)


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


def _hours(value: Any) -> str:
    from ..monitor.accounting import hours

    return hours(value)


def _money(value: Any) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _trials(store: Any, ref: str, as_json: bool, quiet: bool) -> None:
    from ..errors import JobNotFound
    from ..query import find_sweep, trials

    sweep = find_sweep(ref, store)
    if sweep is None:
        raise JobNotFound(f"no sweep with id or name '{ref}'", "list sweeps with: phalanx ps --all")
    records = trials(sweep, store)
    if quiet:
        sys.stdout.writelines(r.id + "\n" for r in records)
        return
    if as_json:
        from .render import dump_json

        dump_json([r.to_dict() for r in records], sys.stdout)
        return
    from ..sweepview import param_order

    objective = (sweep.objective or "objective").upper()
    order = param_order(sweep)
    rows = [[str(r.trial), r.id, _state(r), "-" if r.objective is None else f"{r.objective:.6g}",
             ago(r.created_at), duration(r.duration), _params(r.params_json, order)] for r in records]
    if not rows:
        typer.echo(f"sweep {sweep.id} has no trials yet")
        return
    _fit(rows, ("TRIAL", "ID", "STATE", objective, "CREATED", "DURATION", "PARAMS"), sys.stdout)


def _state(record: Any) -> str:
    from ..sweepview import pruned_info

    pruned = pruned_info(record)
    if pruned is not None and pruned.get("step") is not None:
        return f"PRUNED@{pruned['step']}"
    return record.state.value if record.exit_code in (None, 0) else f"{record.state.value}({record.exit_code})"


def _params(params_json: str | None, order: Sequence[str] = ()) -> str:
    values = json.loads(params_json or "{}")
    names = [n for n in order if n in values] + [n for n in values if n not in order]
    return " ".join(f"{k}={_value(values[k])}" for k in names)


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# -- sweep show -------------------------------------------------------------------------------


def show_sweep(ref: str, as_json: bool, as_csv: bool) -> None:
    """``phalanx sweep show``: one row per trial, best first: parameters, state, objective,
    the other metrics' final values, duration; pruned trials with the step and the reason."""
    from ..errors import JobNotFound, UsageError
    from ..query import find_sweep, open_store, trials as trials_of
    from ..lists import sweep_progress
    from ..sweepview import trial_table
    from .render import dump_json

    if as_json and as_csv:
        raise UsageError("--json and --csv both given", "pick one")
    store = open_store()
    record = find_sweep(ref, store)
    if record is None:
        raise JobNotFound(f"no sweep with id or name '{ref}'", "list sweeps with: phalanx ps --all")
    table = trial_table(store, record)
    trials = {t.id: t for t in trials_of(record, store)}
    if as_json:
        dump_json({**record.to_dict(), "progress_text": sweep_progress(store, record)["text"], "table": table,
                   "trials": [trials[r["id"]].to_dict() for r in table["rows"]]}, sys.stdout)
        return
    headers = ["TRIAL", "JOB", "STATE", *( [table["objective"]] if table["objective"] else []), *table["params"],
               *table["metrics"], "DURATION"]
    rows = []
    for r in table["rows"]:
        state = r["state"] + (f"@{r['pruned']['step']}" if r["pruned"] and r["pruned"].get("step") is not None else "")
        objective = [] if not table["objective"] else [
            "-" if r["objective"] is None else f"{r['objective']:.6g}" + ("" if r["final"] else " (running)") + (" *" if r["best"] else "")]
        rows.append([str(r["trial"]), r["id"], state, *objective, *(_value(r["params"].get(p, "")) for p in table["params"]),
                     *(_num(r["metrics"].get(m)) for m in table["metrics"]), duration(r["duration"])])
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
    out = sys.stdout
    progress = sweep_progress(store, record)["text"]
    out.write(f"sweep     {record.id}  {record.name}   {record.state.value}   {progress}\n")
    out.write(f"strategy  {record.strategy}" + (f"   objective {record.objective}:{record.direction}" if record.objective else "") + "\n")
    out.write(f"command   {record.command}\n")
    out.write(f"created   {ago(record.created_at)}   duration {duration(record.duration)}\n")
    if record.best_value is not None:
        out.write(f"best      {record.objective}={record.best_value:.6g}  job {record.best_job}  {_params(record.best_params, table['params'])}\n")
    if rows:
        out.write("\n")
        _fit(rows, [h.upper() if h in ("TRIAL", "JOB", "STATE", "DURATION") else h for h in headers], out)
    pruned = [r for r in table["rows"] if r["pruned"]]
    if pruned:
        out.write("\n")
        for r in pruned:
            out.write(f"trial {r['trial']} {r['pruned']['reason']}\n")
