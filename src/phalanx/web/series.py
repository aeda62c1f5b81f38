"""Chart data: metric curves (by step and by time) and resource samples, thinned to what a
chart can show. No web imports here.

Metric files are parsed incrementally and kept in memory (the least recently used go first),
so a dashboard that refreshes a running job every few seconds reads only what was appended.
"""

from __future__ import annotations

import math
import threading
from array import array
from pathlib import Path
from typing import Any, Sequence

from ..monitor.metricfile import NONE, read_series
from ..monitor.readback import metric_file
from ..monitor.resources import node_ranks, read_resources
from ..store import JobRecord
from .jobview import job_file, job_summary

MAX_POINTS = 1500  # per chart trace: more than a chart's width in pixels, and quick to send
CACHED_FILES = 256  # metrics files kept parsed in memory


class _Series:
    """One rank's metrics file as arrays per metric name (steps :data:`NONE` where a value has
    none; ``loose`` names the metrics that have such values: they are charted by index)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.offset = 0
        self.steps: dict[str, array] = {}
        self.values: dict[str, array] = {}
        self.times: dict[str, array] = {}
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
                self.steps[name], self.values[name], self.times[name] = array("q"), array("d"), array("d")
            if NONE in new.steps:
                self.loose.add(name)
            self.steps[name].extend(new.steps)
            self.values[name].extend(new.values)
            self.times[name].extend(new.times)


_cache: dict[Path, _Series] = {}
_cache_lock = threading.Lock()


def _series(path: Path) -> _Series:
    with _cache_lock:  # one reader per file at a time; requests for other files wait briefly
        series = _cache.pop(path, None) or _Series()
        _cache[path] = series  # (re)inserted last: the dict's order is the use order
        while len(_cache) > CACHED_FILES:
            del _cache[next(iter(_cache))]
        series.update(path)
        return series


def _thin(n: int, points: int) -> tuple[int, bool]:
    stride = max(1, math.ceil(n / points))
    return stride, bool(n and (n - 1) % stride)


def _pick(values: Sequence[Any], stride: int, last: bool) -> list[Any]:
    out = list(values[::stride])
    if last:
        out.append(values[-1])
    return out


def metric_series(record: JobRecord, attempt: int | None = None, ranks: list[int] | None = None,
                  points: int = MAX_POINTS) -> dict[str, Any]:
    """Chart traces: per metric name, one trace per (attempt, rank) with x the step (or the
    value's index, when some values have no step) and ``t`` the time it was read."""
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
                stride, last = _thin(len(values), points)
                traces.setdefault(name, []).append({
                    "attempt": a, "rank": rank, "x": _pick(steps, stride, last), "y": _pick(values, stride, last),
                    "t": [round(t, 3) for t in _pick(series.times[name], stride, last)],
                    "x_kind": "index" if loose else "step", "count": len(values)})
    return {"job": record.id, "attempts": attempts, "ranks": sorted(available), "metrics": traces}


def compare_series(records: list[JobRecord], points: int = MAX_POINTS) -> dict[str, Any]:
    """Rank 0's curves of several jobs, every attempt in order, one trace per job and metric."""
    out: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        data = metric_series(record, None, [0], points)
        for name, traces in data["metrics"].items():
            x: list[int] = []
            y: list[float] = []
            t: list[float] = []
            for trace in traces:
                x.extend(trace["x"])
                y.extend(trace["y"])
                t.extend(trace["t"])
            out.setdefault(name, []).append({"job": record.id, "label": f"{record.id} {record.name}", "x": x, "y": y, "t": t,
                                             "x_kind": traces[0]["x_kind"]})
    return {"jobs": [job_summary(r) for r in records], "metrics": out}


RATES = ("disk_read_rate", "disk_write_rate", "net_sent_rate", "net_recv_rate")


def resource_series(record: JobRecord, attempt: int | None = None, points: int = MAX_POINTS) -> dict[str, Any]:
    """Per node: time series of node CPU, memory, disk and network rates, each rank's CPU and
    RSS, each GPU's utilisation and memory; every attempt (``attempt`` None) or one. Thinned
    to ``points``; None where a sample lacks the rank or GPU. ``starts``: when each attempt's
    samples begin (the charts mark them)."""
    paths = record.paths
    attempts = paths.attempts() if attempt is None else [attempt]
    by_node: dict[int, list[dict[str, Any]]] = {}
    starts: list[dict[str, Any]] = []
    for a in attempts:
        for node in node_ranks(paths, a):
            job_file(record, paths.node_resources(a, node))
            samples = read_resources(paths, a, node)
            if samples:
                by_node.setdefault(node, []).extend(samples)
                if node == min(node_ranks(paths, a)):
                    starts.append({"attempt": a, "time": samples[0].get("time")})
    nodes: dict[str, Any] = {}
    for node, samples in sorted(by_node.items()):
        samples.sort(key=lambda s: s.get("time") or 0)
        stride, last = _thin(len(samples), points)
        picked = _pick(samples, stride, last)
        ranks = [s.get("ranks") or {} for s in picked]
        gpus = [{str(g.get("index")): g for g in s.get("gpus") or []} for s in picked]
        rank_ids = sorted({r for rs in ranks for r in rs}, key=int)
        gpu_ids = sorted({g for gs in gpus for g in gs}, key=lambda g: int(g) if g.isdigit() else 0)
        nodes[str(node)] = {
            "host": picked[-1].get("host"),
            "time": [s.get("time") for s in picked],
            "attempt": [s.get("attempt") for s in picked],
            "cpu_percent": [s.get("cpu_percent") for s in picked],
            "cpu_count": picked[-1].get("cpu_count"),
            "mem_used": [s.get("mem_used") for s in picked],
            "mem_total": picked[-1].get("mem_total"),
            **{key: [s.get(key) for s in picked] for key in RATES},
            "ranks": {r: {key: [rs.get(r, {}).get(key) for rs in ranks] for key in ("cpu_percent", "rss")}
                      for r in rank_ids},
            "gpus": {g: {**{key: [gs.get(g, {}).get(key) for gs in gpus] for key in ("util", "mem_used")},
                         "name": next((gs[g].get("name") for gs in reversed(gpus) if g in gs), None),
                         "mem_total": next((gs[g].get("mem_total") for gs in reversed(gpus) if g in gs), None)}
                     for g in gpu_ids},
        }
    return {"job": record.id, "attempts": attempts, "starts": starts, "nodes": nodes}
