"""Metrics and resources read back for people: summaries, curves by step, sparklines, ``status``
lines, ``top`` frames."""

from __future__ import annotations

import time
from typing import Any, Iterable, Sequence

from ..core.paths import JobPaths
from .readback import metric_file, rank_series, recent_records, step_values, summarize_series


def by_step(records: Iterable[dict[str, Any]], name: str) -> list[tuple[int | None, float]]:
    """One metric's values as (step, value), ordered by step; a later attempt's value replaces
    an earlier attempt's at the same step (a resumed job redoes a few steps). Records without
    a step keep their order after the last stepped one."""
    stepped: dict[int, tuple[int, float]] = {}
    loose: list[tuple[int | None, float]] = []
    for r in records:
        if r.get("name") != name:
            continue
        step = r.get("step")
        if isinstance(step, int):
            prior = stepped.get(step)
            if prior is None or r.get("attempt", 0) >= prior[0]:
                stepped[step] = (r.get("attempt", 0), r["value"])
        else:
            loose.append((None, r["value"]))
    return [(s, v) for s, (_, v) in sorted(stepped.items())] + loose


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """A unicode sparkline of ``values`` squeezed into ``width`` cells (bucket means)."""
    if not values:
        return ""
    if len(values) > width:
        buckets = []
        for i in range(width):
            first, stop = i * len(values) // width, (i + 1) * len(values) // width
            part = values[first:max(stop, first + 1)]
            buckets.append(sum(part) / len(part))
        values = buckets
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12:
        return SPARKS[3] * len(values)
    scale = (len(SPARKS) - 1) / (hi - lo)
    return "".join(SPARKS[int((v - lo) * scale + 0.5)] for v in values)


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def default_rank(paths: JobPaths, attempts: Sequence[int]) -> int | None:
    """Rank 0 if it has metrics in any of ``attempts``, else the lowest rank that has."""
    found = sorted({r for a in attempts for r in paths.ranks(a) if metric_file(paths, a, r) is not None})
    return 0 if 0 in found or not found else found[0]


def metrics_report(record: Any, attempt: int | None = None, rank: int | None = None) -> dict[str, Any]:
    """What ``phalanx metrics`` shows: per metric last/min/max/count/last step and a sparkline
    by step, for one rank (default 0) of one attempt or of all attempts (default)."""
    from ..errors import UsageError

    paths = record.paths
    known = paths.attempts()
    if attempt is not None and attempt not in known:
        raise UsageError(f"job {record.id} has no attempt {attempt}", f"attempts: {', '.join(map(str, known)) or 'none yet'}")
    attempts = known if attempt is None else [attempt]
    if rank is None:
        rank = default_rank(paths, attempts)
    elif rank < 0 or rank >= record.nnodes * record.nproc_per_node:
        raise UsageError(f"job {record.id} has no rank {rank}", f"ranks: 0..{record.nnodes * record.nproc_per_node - 1}")
    parts = [rank_series(paths, a, rank) for a in attempts] if rank is not None else []
    summary = summarize_series(parts)
    for name, s in summary.items():
        s["sparkline"] = sparkline(step_values(p[name] for p in parts if name in p))
    span = "attempt " + str(attempt) if attempt is not None else (
        f"attempts {known[0]}-{known[-1]}" if len(known) > 1 else f"attempt {known[0] if known else 0}")
    return {"job": record.id, "attempt": attempt, "rank": rank, "where": f"rank {rank}, {span}", "metrics": summary}


def export_metrics(record: Any, out: Any, attempt: int | None = None, rank: int | None = None) -> int:
    """``phalanx metrics JOB --jsonl``: every record of one attempt (default all) and rank
    (default all) as JSON lines, oldest attempt first; returns how many."""
    from ..errors import UsageError
    from .readback import export_jsonl

    paths = record.paths
    known = paths.attempts()
    if attempt is not None and attempt not in known:
        raise UsageError(f"job {record.id} has no attempt {attempt}", f"attempts: {', '.join(map(str, known)) or 'none yet'}")
    if rank is not None and not 0 <= rank < record.nnodes * record.nproc_per_node:
        raise UsageError(f"job {record.id} has no rank {rank}", f"ranks: 0..{record.nnodes * record.nproc_per_node - 1}")
    return export_jsonl(paths, out, attempt, rank)


def status_summary_lines(record: Any) -> list[str]:
    """Lines for ``phalanx status``: rank 0's metrics of the latest attempt, then hints."""
    from .hints import hints
    from .resources import recent_resources

    paths = record.paths
    attempt = record.attempt
    lines: list[str] = []
    rank = default_rank(paths, [attempt])
    summary = summarize_series([rank_series(paths, attempt, rank)]) if rank is not None else {}
    parts = []
    for name, s in summary.items():
        step = "" if s["last_step"] is None else f" (step {s['last_step']})"
        parts.append(f"{name} last={_fmt(s['last'])} min={_fmt(s['min'])} max={_fmt(s['max'])}{step}")
    if parts:
        label = "metrics" if rank == 0 else f"metrics (rank {rank})"
        lines.append(f"{label:<9} " + parts[0])
        lines.extend(" " * 10 + p for p in parts[1:])
    for hint in hints(recent_resources(paths, attempt), recent_metrics(paths, attempt)):
        lines.append(f"hint      {hint}")
    return lines


def recent_metrics(paths: JobPaths, attempt: int, max_bytes: int = 1 << 16) -> list[dict[str, Any]]:
    """The latest records of every rank (the end of each file): enough for rates, cheap."""
    return [r for rank in paths.ranks(attempt) for r in recent_records(paths, attempt, rank, max_bytes)]


def top_frame(record: Any) -> dict[str, Any]:
    """What ``phalanx top`` shows: the newest sample of each node of the latest attempt, with
    its ranks, and the hints of the recent window."""
    from .hints import hints
    from .resources import latest_samples, recent_resources

    paths = record.paths
    attempt = record.attempt
    now = time.time()
    nodes = []
    for node, sample in sorted(latest_samples(paths, attempt).items()):
        nodes.append({**sample, "node_rank": node, "age": max(0.0, now - float(sample.get("time", now)))})
    return {
        "job": record.id, "state": record.state.value, "attempt": attempt, "nodes": nodes,
        "hints": hints(recent_resources(paths, attempt), recent_metrics(paths, attempt)),
    }
