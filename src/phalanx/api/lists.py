"""Jobs and sweeps as lists a person filters, sorts and pages: what ``phalanx ps`` and the
dashboard's lists show. Read-only; the SQL is ``store/listing.py``'s.

Input from the command line or a URL is checked here, once, for both: an unknown state, sort
or column, a metric name no job has, a tag or time that does not parse are a ``UsageError``
naming what is valid (exit 2 on the CLI, HTTP 400 in the dashboard).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ..core.state import JobState, is_terminal
from ..errors import UsageError
from ..store import JobRecord, Store
from ..store.sweeps import SweepRecord
from ..store.listing import AGGS, SORTS, SWEEP_SORTS, Filter, Sort

STATES = tuple(s.value for s in JobState)


@dataclass(frozen=True)
class Column:
    """A metric column: ``loss`` (its last value), ``loss:min``, ``acc:max``."""

    metric: str
    agg: str = "last"

    @property
    def label(self) -> str:
        return self.metric if self.agg == "last" else f"{self.metric}:{self.agg}"


@dataclass(frozen=True)
class Query:
    filter: Filter = field(default_factory=Filter)
    sort: Sort = field(default_factory=Sort)
    columns: tuple[Column, ...] = ()


def parse_states(texts: Iterable[str] | None) -> tuple[str, ...]:
    """``running``, ``failed,lost`` (any case); ``active`` = not ended, ``ended`` = ended."""
    out: list[str] = []
    for text in texts or ():
        for word in str(text).split(","):
            word = word.strip().upper()
            if not word:
                continue
            if word == "ACTIVE":
                out.extend(s.value for s in JobState if not is_terminal(s))
            elif word in ("ENDED", "DONE", "FINISHED"):
                out.extend(s.value for s in JobState if is_terminal(s))
            elif word in STATES:
                out.append(word)
            else:
                raise UsageError(f"unknown state '{word.lower()}'",
                                 f"use one of: {', '.join(s.lower() for s in STATES)}, active, ended")
    return tuple(dict.fromkeys(out))


def parse_tags(texts: Iterable[str] | None) -> tuple[tuple[str, str | None], ...]:
    """``team=vision`` (that value) or ``team`` (any value)."""
    from ..core.spec import parse_tag

    out: list[tuple[str, str | None]] = []
    for text in texts or ():
        text = str(text).strip()
        if not text:
            continue
        if "=" in text:
            out.append(parse_tag(text))
        else:
            parse_tag(text + "=x")  # the key's spelling
            out.append((text, None))
    return tuple(out)


def parse_sort(text: str | None, columns: Sequence[Column] = (), sweeps: bool = False) -> Sort:
    """``created`` (newest first, the default), ``name``, ``-name`` (descending), ``state``,
    ``backend``, ``gpu_hours``, ``cost``; or a metric: ``loss`` / ``loss:min`` / ``-acc:max``."""
    if not text:
        return Sort()
    descending = text.startswith("-")
    key = text.lstrip("-+").strip()
    valid = SWEEP_SORTS if sweeps else SORTS
    if key in valid:
        # Newest first is what "created" means; "-created" reverses it. Other keys go up unless "-".
        return Sort(key, not descending if key == "created" else descending)
    if not sweeps:
        column = parse_column(key)
        return Sort("metric", descending, column.metric, column.agg)
    raise UsageError(f"unknown sort '{text}'", f"sort by one of: {', '.join(valid)} (prefix - for descending)")


def parse_column(text: str) -> Column:
    name, _, agg = text.strip().partition(":")
    agg = agg or "last"
    if not name or agg not in AGGS:
        raise UsageError(f"invalid column '{text}'", f"use METRIC or METRIC:AGG with AGG one of {', '.join(AGGS)}, e.g. loss:min")
    return Column(name, agg)


def parse_columns(texts: Iterable[str] | None) -> tuple[Column, ...]:
    out: list[Column] = []
    for text in texts or ():
        for piece in str(text).split(","):
            if piece.strip():
                out.append(parse_column(piece))
    return tuple(dict.fromkeys(out))


def check_metrics(store: Store, columns: Iterable[Column], sort: Sort | None = None) -> None:
    """A column or sort naming a metric that no job has is a typo: say which names exist. One that
    only sweeps' trials have is listed with the trials: say so, and how."""
    from ..store.listing import has_metric, metric_names, metric_only_on_trials

    wanted = [c.metric for c in columns] + ([sort.metric] if sort is not None and sort.metric else [])
    for name in dict.fromkeys(wanted):
        if not has_metric(store, name):
            known = metric_names(store, 30)
            raise UsageError(f"no job has a metric '{name}'",
                             f"metrics jobs have: {', '.join(known)}" if known else "no finished job has recorded metrics yet")
        sweeps = metric_only_on_trials(store, name)
        if sweeps:
            how = f"--sort {name}" if sort is not None and sort.metric == name else f"-c {name}"
            raise UsageError(f"only sweep trials have a metric '{name}' (sweep {', '.join(sweeps)})",
                             f"list them: phalanx ps --trials {sweeps[0]} {how}")


def build_query(states: Iterable[str] | None = None, name: str | None = None, backend: str | None = None,
                tags: Iterable[str] | None = None, since: str | None = None, search: str | None = None,
                sort: str | None = None, columns: Iterable[str] | None = None, sweep: str | None = None,
                sweeps: bool = False, user: str | None = None, projects: tuple[str, ...] | None = None) -> Query:
    """Everything a listing was asked for, checked (UsageError on anything that does not parse).
    ``projects``: the projects whose rows it may show (None: all; the asker's, ``Principal.visible``)."""
    from ..monitor.logindex import parse_since

    cols = parse_columns(columns)
    if backend is not None and backend.strip():
        from ..backends.registry import known as known_backends

        known = sorted(known_backends())
        if backend not in known:
            raise UsageError(f"unknown backend '{backend}'", f"backends: {', '.join(known)}")
    flt = Filter(states=parse_states(states), name=(name or None), backend=(backend or None), tags=parse_tags(tags),
                 since=parse_since(since, "--since") if since else None, search=(search or None), sweep=sweep,
                 user=(user or None), projects=projects)
    return Query(flt, parse_sort(sort, cols, sweeps), cols)


# -- rows --------------------------------------------------------------------------------------


def short_command(command: str, width: int | None = None) -> str:
    """A command as a list shows it: paths by their file name (``/home/me/proj/train.py`` ->
    ``train.py``), cut to ``width`` with an ellipsis."""
    from ..core.rawtext import shell_join, shell_split

    try:
        words = shell_split(command)
    except ValueError:
        words = command.split()
    shown = shell_join([os.path.basename(w) if w.startswith("/") and len(w) > 1 else w for w in words])
    if width is not None and len(shown) > width:
        shown = shown[: max(1, width - 1)] + "…"
    return shown


def job_row(record: JobRecord, metrics: dict[str, dict[str, Any]] | None = None, tags: dict[str, str] | None = None,
            columns: Sequence[Column] = (), live_usage: bool = True) -> dict[str, Any]:
    """A job as a list row: its record, world size, duration, short command, tags, metric
    columns and usage (recorded at its end; counted up to now while it runs)."""
    row = record.to_dict()
    row["world_size"] = record.nnodes * record.nproc_per_node
    row["duration"] = record.duration
    row["command_short"] = short_command(record.command)
    row["tags"] = tags or {}
    summary = metrics or {}
    row["columns"] = {c.label: (summary.get(c.metric) or {}).get(c.agg) for c in columns}
    # Counted up to now while it runs; a job that ended has it recorded (one recorded before
    # accounting existed shows none in lists: ``status`` still counts it).
    if live_usage and not is_terminal(record.state):
        from ..monitor.accounting import job_usage

        used = job_usage(record)
        row.update(gpu_hours=used.gpu_hours, cpu_hours=used.cpu_hours, cost=used.cost)
    row.update(job_health(record))
    return row


def job_health(record: JobRecord) -> dict[str, Any]:
    """A list row's progress (``47% ETA 12m``) and health note (the straggler while it runs, or
    what stopped it), from the job's ``health.json``."""
    from ..health.progress_file import shown

    seen = shown(record.paths.health, not is_terminal(record.state))
    progress = seen["progress"]
    note = (seen["straggler"] or {}).get("short") or ((seen["anomaly"] or {}).get("message") if is_terminal(record.state)
                                                       else None)
    return {"progress": progress["short"] if progress else None, "fraction": progress["fraction"] if progress else None,
            "eta": progress["eta_now"] if progress else None, "health": note}


def job_rows(store: Store, records: Sequence[JobRecord], columns: Sequence[Column] = ()) -> list[dict[str, Any]]:
    """Rows of a page of jobs: metric columns from the recorded summaries (jobs still running,
    or recorded before summaries existed, are read from their files)."""
    from ..supervise.endings import metric_summary
    from ..store.listing import metrics_of, tags_of

    ids = [r.id for r in records]
    tags = tags_of(store, ids)
    names = [c.metric for c in columns]
    recorded = metrics_of(store, ids, names) if columns else {}
    rows = []
    for record in records:
        metrics = recorded.get(record.id)
        if columns and metrics is None and (not is_terminal(record.state) or record.gpu_hours is None):
            metrics = metric_summary(record)
        rows.append(job_row(record, metrics, tags.get(record.id), columns))
    return rows


def page(store: Store, query: Query, limit: int = 50, after: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """A page of job rows and the cursor of the next one (None: the last page). Jobs whose
    supervisor vanished show LOST (``liveness.effective``: computed, never written)."""
    from ..store.listing import page_jobs
    from ..supervise.liveness import effective

    listing = page_jobs(store, query.filter, query.sort, max(1, min(limit, 1000)), after)
    records = [effective(r) for r in listing.rows]
    if query.filter.states:  # a job the store says runs but that is LOST now is no longer RUNNING
        records = [r for r in records if r.state.value in query.filter.states]
    return job_rows(store, records, query.columns), listing.next


# -- sweeps ------------------------------------------------------------------------------------


def sweep_progress(store: Store, sweep: SweepRecord) -> dict[str, Any]:
    """``12/32 done, 2 running, best loss=0.231 (trial 7)`` and its parts."""
    from ..store.listing import trial_states

    states = trial_states(store, sweep.id)
    running = sum(n for s, n in states.items() if s in ("RUNNING", "STOPPING", "PENDING"))
    queued = states.get("QUEUED", 0)
    best_trial = None
    if sweep.best_job:
        try:
            best_trial = store.get(sweep.best_job).trial
        except UsageError:
            best_trial = None
    total = sweep.total if sweep.total is not None else "?"
    eta = sweep_eta(store, sweep) if not is_terminal(sweep.state) else None
    text = f"{sweep.finished}/{total} done"
    if running and not is_terminal(sweep.state):
        text += f", {running} running"
    if queued and not is_terminal(sweep.state):
        text += f", {queued} queued"
    if sweep.failed:
        text += f", {sweep.failed} failed"
    if sweep.pruned:
        text += f", {sweep.pruned} pruned"
    if sweep.best_value is not None:
        text += f", best {sweep.objective}={sweep.best_value:.4g}" + (f" (trial {best_trial})" if best_trial is not None else "")
    if eta is not None:
        text += f", ETA {_human(eta)}"
    reason = sweep_reason(sweep)
    if reason:
        text += f"; {reason}"
    return {"text": text, "running": running, "states": states, "best_trial": best_trial, "eta": eta, "reason": reason}


def sweep_eta(store: Store, sweep: SweepRecord) -> float | None:
    """Seconds until the sweep is done, at the pace so far: trials finished plus the share each
    running trial has done (its progress), over the time since the sweep started."""
    import time

    from ..health.progress_file import shown

    if not sweep.total or sweep.started_at is None:
        return None
    done = float(sweep.finished)
    for trial in store.trials(sweep.id):
        if not is_terminal(trial.state):
            fraction = (shown(trial.paths.health, True)["progress"] or {}).get("fraction")
            done += float(fraction or 0.0)
    elapsed = time.time() - float(sweep.started_at)
    if done <= 0 or elapsed <= 0:
        return None
    return max(0.0, (sweep.total - done) * elapsed / done)


def _human(seconds: float) -> str:
    from ..health.progress import human

    return human(seconds)


def sweep_reason(sweep: SweepRecord) -> str | None:
    """Why a sweep that ran every trial failed (the runner's ``outcome.json``), or None."""
    if sweep.state is not JobState.FAILED:
        return None
    from ..core.paths import read_json
    from .query import home

    found = read_json(home().sweep_outcome(sweep.id))
    return str(found["reason"]) if isinstance(found, dict) and found.get("reason") else None


def sweep_row(store: Store, sweep: SweepRecord) -> dict[str, Any]:
    from ..store.listing import tags_of, usage_sum

    row = sweep.to_dict()
    row["kind"] = "sweep"
    progress = sweep_progress(store, sweep)
    row["progress_text"] = progress["text"]
    row["running"] = progress["running"]
    row["best_trial"] = progress["best_trial"]
    row["reason"] = progress["reason"]
    row["command_short"] = short_command(sweep.command)
    row["duration"] = sweep.duration
    row["tags"] = tags_of(store, [sweep.id]).get(sweep.id, {})
    row.update(usage_sum(store, sweep_id=sweep.id))
    return row

