"""Metrics and resources read back for people: summaries, curves by step, sparklines, ``status``
lines, ``top`` frames."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..core.contracts import Stray
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

    paths = JobPaths(Path(record.job_dir))
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

    paths = JobPaths(Path(record.job_dir))
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

    paths = JobPaths(Path(record.job_dir))
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
    attempts = paths.attempts()
    for number in attempts:
        for line in stray_lines(ended_strays(paths, number)):
            lines.append(f"leftover  {f'attempt {number}: ' if len(attempts) > 1 else ''}{line}")
    return lines


def ended_strays(paths: JobPaths, attempt: int) -> list[Stray]:
    """What the ranks of ``attempt`` left running and had to be ended (every node's result)."""
    from ..core.contracts import read_node_result
    from ..errors import ContractError

    found: list[Stray] = []
    for node in paths.nodes(attempt):
        try:
            result = read_node_result(paths.node_result(attempt, node))
        except ContractError:
            continue
        found += result.strays if result is not None else ()
    return found


def stray_lines(strays: Sequence[Stray]) -> list[str]:
    """One line per rank: "ended 1 leftover process of rank 0: pid 1234 `python daemon_helper` (setsid)"."""
    lines = []
    for rank in sorted({s.rank for s in strays}):
        mine = [s for s in strays if s.rank == rank]
        described = []
        for s in mine:
            notes = [n for n in (s.how, "SIGKILL after the grace period" if s.killed else None) if n]
            described.append(f"pid {s.pid} `{s.command}`" + (f" ({'; '.join(notes)})" if notes else ""))
        noun = "process" if len(mine) == 1 else "processes"
        lines.append(f"ended {len(mine)} leftover {noun} of rank {rank}: {', '.join(described)}")
    return lines


def recent_metrics(paths: JobPaths, attempt: int, max_bytes: int = 1 << 16) -> list[dict[str, Any]]:
    """The latest records of every rank (the end of each file): enough for rates, cheap."""
    return [r for rank in paths.ranks(attempt) for r in recent_records(paths, attempt, rank, max_bytes)]


def top_frame(record: Any) -> dict[str, Any]:
    """What ``phalanx top`` shows: the newest sample of each node of the latest attempt, with
    its ranks, and the hints of the recent window."""
    from .hints import hints
    from .resources import latest_samples, recent_resources

    paths = JobPaths(Path(record.job_dir))
    attempt = record.attempt
    now = time.time()
    nodes = []
    for node, sample in sorted(latest_samples(paths, attempt).items()):
        nodes.append({**sample, "node_rank": node, "age": max(0.0, now - float(sample.get("time", now)))})
    return {
        "job": record.id, "state": record.state.value, "attempt": attempt, "nodes": nodes,
        "hints": hints(recent_resources(paths, attempt), recent_metrics(paths, attempt)),
    }


CHART_SAMPLES = 4  # a node with fewer samples than this draws no chart worth a look: one summary row
_SMALL_FILE = 1 << 16  # a samples file larger than this holds more than CHART_SAMPLES samples


def resource_summary(paths: JobPaths) -> dict[str, Any] | None:
    """A job that was too short to chart (no node has :data:`CHART_SAMPLES` samples, every attempt
    counted) in one row per node: its samples, the peaks of CPU and memory (the node's, its
    largest rank's), of GPU use, and what it read and wrote. None when some node has enough
    samples for charts, or no node has any."""
    from .metricfile import read_jsonl
    from .resources import node_ranks

    by_node: dict[int, list[dict[str, Any]]] = {}
    for attempt in paths.attempts():
        for node in node_ranks(paths, attempt):
            path = paths.node_resources(attempt, node)
            try:
                if path.stat().st_size > _SMALL_FILE:
                    return None
            except OSError:
                continue
            by_node.setdefault(node, []).extend(read_jsonl(path)[0])
    if not any(by_node.values()) or any(len(s) >= CHART_SAMPLES for s in by_node.values()):
        return None
    return {"samples": sum(len(s) for s in by_node.values()),
            "nodes": [_node_row(node, samples) for node, samples in sorted(by_node.items()) if samples]}


def _node_row(node: int, samples: list[dict[str, Any]]) -> dict[str, Any]:
    samples = sorted(samples, key=lambda s: s.get("time") or 0)
    first, last = samples[0], samples[-1]
    ranks = [r for s in samples for r in (s.get("ranks") or {}).values()]
    gpus = [g for s in samples for g in s.get("gpus") or []]

    def peak(values: Iterable[Any]) -> float | None:
        found = [v for v in values if isinstance(v, (int, float))]
        return max(found) if found else None

    def grew(key: str) -> float | None:
        a, b = first.get(key), last.get(key)
        return b - a if len(samples) > 1 and isinstance(a, (int, float)) and isinstance(b, (int, float)) else None

    return {"node_rank": node, "host": last.get("host"), "samples": len(samples),
            "span": (last.get("time") or 0) - (first.get("time") or 0),
            "cpu_percent": peak(s.get("cpu_percent") for s in samples), "cpu_count": last.get("cpu_count"),
            "mem_used": peak(s.get("mem_used") for s in samples), "mem_total": last.get("mem_total"),
            "rank_rss": peak(r.get("rss") for r in ranks), "rank_cpu_percent": peak(r.get("cpu_percent") for r in ranks),
            "gpu_util": peak(g.get("util") for g in gpus), "gpu_mem": peak(g.get("mem_used") for g in gpus),
            "disk_read": grew("disk_read"), "disk_write": grew("disk_write"),
            "net_recv": grew("net_recv"), "net_sent": grew("net_sent")}


def resource_summary_line(row: dict[str, Any]) -> str:
    """One node's summary row in words (``status``; the dashboard draws the same row)."""
    cores = f" of {row['cpu_count']} cores" if row.get("cpu_count") else ""
    parts = [f"{row['samples']} sample{'s' if row['samples'] != 1 else ''}"]
    if row.get("cpu_percent") is not None:
        parts.append(f"CPU peak {row['cpu_percent']:.0f}%{cores}")
    if row.get("mem_used") is not None:
        total = f" of {_size(row['mem_total'])}" if row.get("mem_total") else ""
        parts.append(f"memory peak {_size(row['mem_used'])}{total}")
    if row.get("rank_rss") is not None:
        parts.append(f"largest rank {_size(row['rank_rss'])}")
    if row.get("gpu_util") is not None:
        parts.append(f"GPU peak {row['gpu_util']:.0f}%, {_size(row['gpu_mem'] or 0)}")
    if row.get("disk_read") is not None:
        parts.append(f"disk {_size(row['disk_read'])} read, {_size(row['disk_write'] or 0)} written")
    return f"node {row['node_rank']}" + (f" ({row['host']})" if row.get("host") else "") + ": " + ", ".join(parts)


def _size(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
