"""A job's metric and resource records in order, from a cursor that outlives the reader.

What an exporter (``supervise/tracking.py``) reads: every attempt in turn, and in it the metric
files (``metrics.bin``) of the chosen ranks and the resource samples (``resources.jsonl``) of the
chosen nodes, from where the last reader stopped. The cursor is plain JSON data, saved by the
caller once what it took has been delivered, so a reader that restarts (a supervisor that
vanished, ``phalanx resume``) goes on from there and nothing is taken twice.

Per file the cursor holds how many records were taken (``n``) and where: the byte offset of the
block (or line) holding the next record (``off``) and how many records of that block are already
taken (``skip``), with the file's inode. A metrics file written anew (a supervisor that re-reads an
attempt's output rewrites it, the same records in the same order) has another inode: it is read
from its start again, skipping the ``n`` records taken.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..core.paths import JobPaths
from .metricfile import NONE, iter_blocks, read_jsonl

# A resource sample's series: (name in the sample, name in the tracker).
RESOURCE_FIELDS = (("cpu_percent", "cpu_percent"), ("mem_used", "mem_used"))


@dataclass(frozen=True)
class Record:
    """One value: a metric of a rank (``kind`` "m", ``where`` the rank) or a resource series of
    a node (``kind`` "r", ``where`` the node; ``step`` None: the reader numbers samples)."""

    kind: str
    attempt: int
    where: int
    name: str
    value: float
    step: int | None
    time: float


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size


class JobStream:
    """``take`` the next records (in order), then ``commit`` once they are delivered."""

    def __init__(self, paths: JobPaths, all_ranks: bool, cursor: dict[str, Any] | None = None) -> None:
        self.paths = paths
        self.all_ranks = all_ranks
        self.committed: dict[str, dict[str, int]] = {k: dict(v) for k, v in (cursor or {}).items()}
        self.ahead: dict[str, dict[str, int]] = {}  # positions after the last take, not yet committed
        self._counted: dict[str, tuple[int, int, int]] = {}  # stream -> (inode, offset, records) counted

    def streams(self) -> Iterator[tuple[str, str, int, int, Path]]:
        """(key, kind, attempt, rank or node, file) in the order records are taken."""
        for attempt in self.paths.attempts():
            ranks = self.paths.ranks(attempt) if self.all_ranks else [0]
            for rank in ranks:
                yield f"m:{attempt}:{rank}", "m", attempt, rank, self.paths.rank_metrics(attempt, rank)
            nodes = self.paths.nodes(attempt) if self.all_ranks else [0]
            for node in nodes:
                yield f"r:{attempt}:{node}", "r", attempt, node, self.paths.node_resources(attempt, node)

    def position(self, key: str) -> dict[str, int]:
        return dict(self.ahead.get(key) or self.committed.get(key) or {"n": 0, "off": 0, "skip": 0, "ino": 0})

    def take(self, limit: int) -> list[Record]:
        """Up to ``limit`` records after the last take (or commit), oldest attempt first."""
        out: list[Record] = []
        for key, kind, attempt, where, path in self.streams():
            if len(out) >= limit:
                break
            seen = _inode(path)
            if seen is None:
                continue
            pos = self.position(key)
            if pos["ino"] and (pos["ino"] != seen[0] or seen[1] < pos["off"]):
                pos = {"n": pos["n"], "off": 0, "skip": pos["n"], "ino": seen[0]}  # written anew
            pos["ino"] = seen[0]
            reader = self._metrics if kind == "m" else self._resources
            pos = reader(path, attempt, where, pos, limit - len(out), out)
            self.ahead[key] = pos
        return out

    def _metrics(self, path: Path, attempt: int, rank: int, pos: dict[str, int], room: int,
                 out: list[Record]) -> dict[str, int]:
        start, skip, n = pos["off"], pos["skip"], pos["n"]
        for block in iter_blocks(path, start):
            rows: list[tuple[int, str, int, float]] = []
            for name, col in block.columns.items():
                rows.extend(zip(col.seq, [name] * len(col.values), col.steps, col.values))
            rows.sort()
            if skip >= len(rows):
                skip -= len(rows)
                start = block.end
                continue
            took = rows[skip:skip + room]
            t = block.time
            out.extend(Record("m", attempt, rank, name, value, None if step == NONE else step, t)
                       for _, name, step, value in took)
            n += len(took)
            room -= len(took)
            if skip + len(took) < len(rows):
                return {**pos, "n": n, "off": start, "skip": skip + len(took)}
            skip, start = 0, block.end
            if room <= 0:
                break
        return {**pos, "n": n, "off": start, "skip": skip}

    def _resources(self, path: Path, attempt: int, node: int, pos: dict[str, int], room: int,
                   out: list[Record]) -> dict[str, int]:
        lines, end = read_jsonl(path, pos["off"])
        skip, n, taken = pos["skip"], pos["n"], 0
        for sample in lines[skip:]:
            if taken >= room:
                return {**pos, "n": n, "skip": skip + taken}
            taken += 1
            n += 1
            out.extend(Record("r", attempt, node, name, value, None, float(sample.get("time") or 0.0))
                       for name, value in resource_values(sample))
        return {**pos, "n": n, "off": end, "skip": 0}

    def commit(self) -> None:
        """What the last take returned is delivered: its positions become the cursor."""
        self.committed.update(self.ahead)
        self.ahead = {}

    def cursor(self) -> dict[str, Any]:
        return {k: dict(v) for k, v in self.committed.items()}

    def waiting(self) -> int:
        """Records in the files not yet committed (counted incrementally; metrics and samples)."""
        total = 0
        for key, kind, _attempt, _where, path in self.streams():
            seen = _inode(path)
            if seen is None:
                continue
            ino, off, count = self._counted.get(key, (seen[0], 0, 0))
            if ino != seen[0] or seen[1] < off:
                off, count = 0, 0
            if kind == "m":
                for block in iter_blocks(path, off):
                    count += sum(len(c.values) for c in block.columns.values())
                    off = block.end
            else:
                lines, off2 = read_jsonl(path, off)
                count, off = count + len(lines), off2
            self._counted[key] = (seen[0], off, count)
            total += max(0, count - int((self.committed.get(key) or {}).get("n", 0)))
        return total


def resource_values(sample: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """A resource sample's numbers: CPU and memory of the node, each GPU's utilisation and memory."""
    for field_name, name in RESOURCE_FIELDS:
        value = sample.get(field_name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            yield name, float(value)
    used, total = sample.get("mem_used"), sample.get("mem_total")
    if isinstance(used, (int, float)) and isinstance(total, (int, float)) and total:
        yield "mem_percent", 100.0 * used / total
    for gpu in sample.get("gpus") or ():
        index = gpu.get("index", 0)
        for field_name in ("util", "mem_used"):
            value = gpu.get(field_name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                yield f"gpu{index}/{field_name}", float(value)
