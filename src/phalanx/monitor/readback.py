"""A job's metrics read back: which file holds a rank's metrics (``metrics.bin``, or an older
job's ``metrics.jsonl``), as records, as series, summarised, exported as JSON lines.

Charts and summaries read series (columns, no dict per value: a million points in a few tens
of milliseconds); records (one dict per value, as ``metrics.jsonl`` held them) are for readers
that follow a few values, and for export.
"""

from __future__ import annotations

import itertools
import operator
from pathlib import Path
from typing import Any, Iterable, Sequence, TextIO

from ..core.paths import JobPaths
from .metricfile import NONE, Series, iter_records, read_records, read_series, tail_records, write_jsonl


def metric_file(paths: JobPaths, attempt: int, rank: int) -> Path | None:
    """The file holding a rank's metrics of an attempt, or None while it has none."""
    for path in (paths.rank_metrics(attempt, rank), paths.rank_metrics_jsonl(attempt, rank)):
        if path.exists():
            return path
    return None


def read_metrics(paths: JobPaths, attempt: int | None = None, rank: int | None = None) -> list[dict[str, Any]]:
    """Metric records of one attempt (all attempts, oldest first, if None), optionally one rank."""
    attempts = paths.attempts() if attempt is None else [attempt]
    out: list[dict[str, Any]] = []
    for a in attempts:
        for r in paths.ranks(a) if rank is None else [rank]:
            path = metric_file(paths, a, r)
            if path is not None:
                out.extend(read_records(path, r, a)[0])
    return out


def read_since(paths: JobPaths, attempt: int, rank: int, offset: int = 0,
               names: Iterable[str] | None = None) -> tuple[list[dict[str, Any]], int]:
    """Records a rank added since ``offset`` (0 at first; then what the last call returned),
    only those of ``names`` if given."""
    path = metric_file(paths, attempt, rank)
    if path is None:
        return [], offset
    return read_records(path, rank, attempt, offset, names)


def rank_series(paths: JobPaths, attempt: int, rank: int, names: Iterable[str] | None = None) -> dict[str, Series]:
    """Every metric of one rank and attempt as columns (names in order of first appearance)."""
    path = metric_file(paths, attempt, rank)
    return read_series(path, 0, names)[0] if path is not None else {}


def recent_records(paths: JobPaths, attempt: int, rank: int, max_bytes: int) -> list[dict[str, Any]]:
    """A rank's latest records (the end of its file): enough for rates, cheap."""
    path = metric_file(paths, attempt, rank)
    return tail_records(path, rank, attempt, max_bytes) if path is not None else []


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per metric name: last, min, max, count and the step of the last value (records in order)."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        value = r.get("value")
        if not isinstance(value, (int, float)):
            continue
        s = out.get(r["name"])
        if s is None:
            out[r["name"]] = {"last": value, "min": value, "max": value, "count": 1, "last_step": r.get("step")}
            continue
        s["last"] = value
        s["count"] += 1
        s["last_step"] = r.get("step")
        if value < s["min"]:
            s["min"] = value
        if value > s["max"]:
            s["max"] = value
    return out


def summarize_series(parts: Iterable[dict[str, Series]]) -> dict[str, dict[str, Any]]:
    """``summarize`` of the records of ``parts`` (series of consecutive files, e.g. one rank's
    attempts, oldest first), from the columns."""
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for name, series in part.items():
            values = series.values
            if not values:
                continue
            last_step = series.steps[-1]
            s = out.get(name)
            low, high = min(values), max(values)
            if s is None:
                out[name] = s = {"last": 0.0, "min": low, "max": high, "count": 0, "last_step": None}
            s["last"] = values[-1]
            s["count"] += len(values)
            s["last_step"] = None if last_step == NONE else last_step
            s["min"], s["max"] = min(s["min"], low), max(s["max"], high)
    return out


def by_step_series(parts: Iterable[Series]) -> list[tuple[int | None, float]]:
    """One metric's values as (step, value), ordered by step; a later part's value replaces an
    earlier one's at the same step (a resumed job redoes a few steps). Values without a step
    keep their order after the last stepped one. ``report.by_step`` for columns."""
    stepped: dict[int, float] = {}
    loose: list[tuple[int | None, float]] = []
    for series in parts:
        if NONE in series.steps:
            for step, value in zip(series.steps, series.values):
                if step == NONE:
                    loose.append((None, value))
                else:
                    stepped[step] = value
        else:
            stepped.update(zip(series.steps, series.values))
    return [*sorted(stepped.items()), *loose]


def step_values(parts: Iterable[Series]) -> Sequence[float]:
    """The values of ``by_step_series(parts)``, without building it when there is one part
    whose steps only grow (a job's single attempt: the common case, a million points)."""
    parts = list(parts)
    if len(parts) == 1:
        steps = parts[0].steps
        if NONE not in steps and all(map(operator.lt, steps, itertools.islice(steps, 1, None))):
            return parts[0].values
    return [v for _, v in by_step_series(parts)]


def export_jsonl(paths: JobPaths, out: TextIO, attempt: int | None = None, rank: int | None = None) -> int:
    """Write the records of one attempt (all, oldest first, if None) and rank (all if None) to
    ``out`` as JSON lines, the form ``metrics.jsonl`` had; returns how many."""
    count = 0
    for a in paths.attempts() if attempt is None else [attempt]:
        for r in paths.ranks(a) if rank is None else [rank]:
            path = metric_file(paths, a, r)
            if path is not None:
                count += write_jsonl(iter_records(path, r, a), out)
    return count
