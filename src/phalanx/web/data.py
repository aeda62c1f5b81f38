"""What the dashboard shows, read from the store and the job directories. No web imports here.

Every file read goes through :func:`job_file`, which refuses paths that resolve outside the
job's directory (a symlinked log, a crafted rank number), so the API can never serve
anything else from the disk.
"""

from __future__ import annotations

import math
import threading
from array import array
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from ..core.contracts import read_node_result
from ..core.paths import read_json
from ..core.state import is_terminal
from ..errors import PhalanxError, UsageError
from ..monitor.hints import hints
from ..monitor.metricfile import NONE, read_series
from ..monitor.readback import metric_file
from ..monitor.report import recent_metrics
from ..monitor.resources import node_ranks, read_resources, recent_resources
from ..store import JobRecord

MAX_POINTS = 1500  # per chart trace: more than a chart's width in pixels, and quick to send
LOG_CHUNK = 256 * 1024  # bytes of log per request: the tail first, older parts on demand
MAX_LOG_CHUNK = 4 * 1024 * 1024
MAX_MATCHES = 1000


class Forbidden(PhalanxError):
    """A request for a file outside the job directory."""


def job_file(record: JobRecord, path: Path) -> Path:
    """``path`` if it resolves inside the job's directory; raises Forbidden otherwise."""
    root = Path(record.job_dir).resolve()
    resolved = path.resolve()
    if resolved != root and root not in resolved.parents:
        raise Forbidden(f"{path} is outside the job directory")
    return resolved


def job_summary(record: JobRecord) -> dict[str, Any]:
    data = record.to_dict()
    data["world_size"] = record.nnodes * record.nproc_per_node
    data["duration"] = record.duration
    return data


def jobs_page(limit: int, after: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the job list (newest first, keyset-paged: page 1,000 costs what page 1
    does) and the cursor of the next page, or None on the last one."""
    from .. import query
    from ..supervise.liveness import effective

    page = query.open_store().page(max(1, limit), after)
    records = [effective(r) for r in page.records]
    return [job_summary(r) for r in records], page.next


def job_detail(record: JobRecord) -> dict[str, Any]:
    """The job with its ranks, attempts (timeline), root cause and hints."""
    from .. import query

    paths = record.paths
    data = job_summary(record)
    data["ranks"] = [asdict(r) for r in query.rank_statuses(record)]
    data["attempts"] = attempts_timeline(record)
    data["hints"] = hints(recent_resources(paths, record.attempt), recent_metrics(paths, record.attempt))
    data["terminal"] = is_terminal(record.state)
    return data


def attempts_timeline(record: JobRecord) -> list[dict[str, Any]]:
    """Per attempt: start, end (None while running), exit code and per-node results."""
    paths = record.paths
    out = []
    for attempt in paths.attempts():
        nodes: list[dict[str, Any]] = []
        for node in node_ranks(paths, attempt):
            result = read_node_result(paths.node_result(attempt, node))
            if result is None:
                nodes.append({"node_rank": node, "host": None, "exitcode": None, "started": None, "finished": None})
            else:
                nodes.append({"node_rank": node, "host": result.host, "exitcode": result.exitcode,
                              "started": result.started, "finished": result.finished})
        starts = [n["started"] for n in nodes if n["started"]]
        for rank in paths.ranks(attempt):
            proc = read_json(paths.rank_proc(attempt, rank)) or {}
            if proc.get("started"):
                starts.append(proc["started"])
        ends: list[float] = [n["finished"] for n in nodes if n["finished"]]
        done = bool(nodes) and len(ends) == len(nodes)
        codes = [n["exitcode"] for n in nodes if n["exitcode"] not in (None, 0)]
        latest = attempt == record.attempt
        out.append({
            "attempt": attempt,
            "start": min(starts) if starts else (record.started_at if latest else None),
            "end": max(ends) if done else (record.ended_at if latest and is_terminal(record.state) else None),
            "exitcode": codes[0] if codes else (0 if done else None),
            "nodes": nodes,
        })
    return out


# -- metrics: incremental, compact, shared by all requests ------------------------------------


class _Series:
    """One rank's metrics file as arrays per metric name (steps :data:`NONE` where a value has
    none; ``loose`` names the metrics that have such values: they are charted by index)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.offset = 0
        self.steps: dict[str, array] = {}
        self.values: dict[str, array] = {}
        self.loose: set[str] = set()

    def update(self, path: Path) -> None:
        try:
            if path.stat().st_size < self.offset:  # rewritten (collected afresh): start over
                self.reset()
        except OSError:
            return
        series, self.offset = read_series(path, self.offset)
        for name, new in series.items():
            if name not in self.values:
                self.steps[name], self.values[name] = array("q"), array("d")
            if NONE in new.steps:
                self.loose.add(name)
            self.steps[name].extend(new.steps)
            self.values[name].extend(new.values)


_cache: dict[Path, _Series] = {}
_cache_lock = threading.Lock()


CACHED_FILES = 256  # metrics files kept parsed in memory; the least recently used go first


def _series(path: Path) -> _Series:
    with _cache_lock:  # one reader per file at a time; requests for other files wait briefly
        series = _cache.pop(path, None) or _Series()
        _cache[path] = series  # (re)inserted last: the dict's order is the use order
        while len(_cache) > CACHED_FILES:
            del _cache[next(iter(_cache))]
        series.update(path)
        return series


def _thin(xs: Sequence[int], ys: array, points: int) -> tuple[list[int], list[float]]:
    """At most ``points`` evenly spaced points, always keeping the last one."""
    n = len(ys)
    stride = max(1, math.ceil(n / points))
    x, y = list(xs[::stride]), list(ys[::stride])
    if n and (n - 1) % stride:
        x.append(xs[-1])
        y.append(ys[-1])
    return x, y


def metric_series(record: JobRecord, attempt: int | None = None, ranks: list[int] | None = None,
                  points: int = MAX_POINTS) -> dict[str, Any]:
    """Chart traces: per metric name, one trace per (attempt, rank); x is the step when every
    value has one, else the value's index."""
    paths = record.paths
    attempts = paths.attempts() if attempt is None else [attempt]
    traces: dict[str, list[dict[str, Any]]] = {}
    available: set[int] = set()
    for a in attempts:
        for rank in paths.ranks(a):
            available.add(rank)
            if ranks is not None and rank not in ranks:
                continue
            found = metric_file(paths, a, rank)
            if found is None:
                continue
            series = _series(job_file(record, found))
            for name, values in series.values.items():
                loose = name in series.loose
                steps: Sequence[int] = range(len(values)) if loose else series.steps[name]
                x, y = _thin(steps, values, points)
                kind = "index" if loose else "step"
                traces.setdefault(name, []).append(
                    {"attempt": a, "rank": rank, "x": x, "y": y, "x_kind": kind, "count": len(values)})
    return {"job": record.id, "attempts": attempts, "ranks": sorted(available), "metrics": traces}


def compare_series(records: list[JobRecord], points: int = MAX_POINTS) -> dict[str, Any]:
    """Rank 0's curves of several jobs, every attempt in order, one trace per job and metric."""
    out: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        data = metric_series(record, None, [0], points)
        for name, traces in data["metrics"].items():
            x: list[int] = []
            y: list[float] = []
            for t in traces:
                x.extend(t["x"])
                y.extend(t["y"])
            out.setdefault(name, []).append({"job": record.id, "label": f"{record.id} {record.name}", "x": x, "y": y})
    return {"jobs": [job_summary(r) for r in records], "metrics": out}


# -- resources ----------------------------------------------------------------------------------


def resource_series(record: JobRecord, attempt: int | None = None, points: int = MAX_POINTS) -> dict[str, Any]:
    """Per node: time series of node CPU and memory, each rank's CPU and RSS, each GPU's util
    and memory (thinned to ``points``; None where a sample lacks the rank or GPU)."""
    paths = record.paths
    attempt = record.attempt if attempt is None else attempt
    nodes: dict[str, Any] = {}
    for node in node_ranks(paths, attempt):
        job_file(record, paths.node_resources(attempt, node))
        samples = read_resources(paths, attempt, node)
        if not samples:
            continue
        picked = samples[:: max(1, math.ceil(len(samples) / points))]
        if picked[-1] is not samples[-1]:
            picked.append(samples[-1])
        ranks = [s.get("ranks") or {} for s in picked]
        gpus = [{str(g.get("index")): g for g in s.get("gpus") or []} for s in picked]
        rank_ids = sorted({r for rs in ranks for r in rs}, key=int)
        gpu_ids = sorted({g for gs in gpus for g in gs}, key=lambda g: int(g) if g.isdigit() else 0)
        nodes[str(node)] = {
            "host": picked[-1].get("host"),
            "time": [s.get("time") for s in picked],
            "cpu_percent": [s.get("cpu_percent") for s in picked],
            "mem_used": [s.get("mem_used") for s in picked],
            "mem_total": picked[-1].get("mem_total"),
            "ranks": {r: {key: [rs.get(r, {}).get(key) for rs in ranks] for key in ("cpu_percent", "rss")}
                      for r in rank_ids},
            "gpus": {g: {**{key: [gs.get(g, {}).get(key) for gs in gpus] for key in ("util", "mem_used")},
                         "mem_total": next((gs[g].get("mem_total") for gs in reversed(gpus) if g in gs), None)}
                     for g in gpu_ids},
        }
    return {"job": record.id, "attempt": attempt, "nodes": nodes}


# -- logs ---------------------------------------------------------------------------------------


def _log_path(record: JobRecord, attempt: int | None, rank: int) -> tuple[int, Path]:
    paths = record.paths
    attempt = record.attempt if attempt is None else attempt
    if attempt < 0 or rank < 0:
        raise UsageError("attempt and rank must be 0 or more", "e.g. ?rank=0&attempt=0")
    return attempt, job_file(record, paths.rank_log(attempt, rank))


def read_log(record: JobRecord, rank: int, attempt: int | None = None, offset: int | None = None,
             limit: int = LOG_CHUNK) -> dict[str, Any]:
    """A piece of a rank's log: from ``offset`` (default: the last ``limit`` bytes, from a line
    start) up to the last complete line, or to the end once the job has ended."""
    attempt, path = _log_path(record, attempt, rank)
    limit = max(1, min(int(limit), MAX_LOG_CHUNK))
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            start = max(0, size - limit) if offset is None else max(0, min(int(offset), size))
            fh.seek(start)
            data = fh.read(limit)
    except FileNotFoundError:
        return {"rank": rank, "attempt": attempt, "offset": 0, "next": 0, "size": 0, "text": "", "exists": False}
    if offset is None and start > 0:
        cut = data.find(b"\n") + 1  # begin at a line start
        start, data = start + cut, data[cut:]
    if not is_terminal(record.state) or start + len(data) < size:
        data = data[: data.rfind(b"\n") + 1]  # a line still being written comes next time
    return {"rank": rank, "attempt": attempt, "offset": start, "next": start + len(data), "size": size,
            "text": data.decode("utf-8", errors="replace"), "exists": True}


def search_log(record: JobRecord, rank: int, query: str, attempt: int | None = None,
               max_matches: int = MAX_MATCHES) -> dict[str, Any]:
    """Lines of a rank's log containing ``query`` (case-insensitive), with line numbers."""
    attempt, path = _log_path(record, attempt, rank)
    needle = query.lower().encode()
    matches: list[dict[str, Any]] = []
    truncated = False
    try:
        with open(path, "rb") as fh:
            for number, line in enumerate(fh, 1):
                if needle in line.lower():
                    if len(matches) >= max_matches:
                        truncated = True
                        break
                    matches.append({"line": number, "text": line.rstrip(b"\r\n").decode("utf-8", errors="replace")})
    except FileNotFoundError:
        pass
    return {"rank": rank, "attempt": attempt, "query": query, "matches": matches, "truncated": truncated}
