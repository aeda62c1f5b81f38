"""Metrics from what a job already prints: named regular expressions and ``name=value`` numbers.

Every rank's own ``output.log`` (never a launcher's tee'd console copy) is read incrementally
and each number found becomes one JSON line in that rank's ``metrics.jsonl``::

    {"name": "loss", "value": 0.1234, "step": 123, "epoch": 1, "rank": 0, "attempt": 0, "time": 1700000000.0}

Where numbers come from:

- ``--metric NAME=REGEX`` definitions (SageMaker-style): group 1 of every match is a value.
- automatic pick-up (``auto``, on by default): ``name=value`` and ``name: value`` numbers, e.g.
  ``loss=0.31 acc: 0.9``. ``step``, ``global_step``, ``iter``, ``iteration`` and ``epoch``
  (also written ``step 12``, ``Epoch [3/10]``) are not metrics: they are the step/epoch of the
  other numbers on their line, and carry over to later lines until the next one (a validation
  line printed after step 500 belongs to step 500). A number a definition already matched, or
  whose name a definition uses, is not picked up twice. Obvious non-metrics (rank, pid, port,
  seed, world_size) are skipped. Malformed and non-finite numbers are ignored, never fatal.
- ``PHALANX_METRICS_FILE``: a script that prefers explicit logging appends JSON lines to the
  file named by that environment variable (``rank_<r>/user_metrics.jsonl``), either
  ``{"loss": 0.3, "acc": 0.9, "step": 10, "epoch": 1}`` (every other number is a metric) or
  ``{"name": "loss", "value": 0.3, "step": 10}``. Write whole lines (one ``write`` per line).

``time`` is when the collector read the line (within one poll interval of when it was printed).
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..core.paths import JobPaths
from ..core.spec import MetricDef

# Bounded reads keep memory flat when a rank printed hundreds of MB between two polls.
READ_CHUNK = 8 << 20
# A "line" longer than this without a newline is read as it is rather than buffered forever.
MAX_LINE = 1 << 20

STEP_KEYS = ("global_step", "step", "iteration", "iter")
EPOCH_KEYS = ("epoch",)
# Numbers scripts print that are identities or settings, not measurements.
NOT_METRICS = frozenset({"rank", "local_rank", "global_rank", "world_size", "pid", "port", "seed", "node_rank", "gpu", "device"})

# A number as scripts print it; junk the class admits (1.2.3) is dropped by float().
_NUMBER = r"[-+]?(?:\d[\d.]*|\.\d+)(?:[eE][-+]?\d+)?"
# One pass per line finds both metrics and step/epoch: ``name=value`` or ``name: value``
# (groups: name, separator, number), or ``name value`` / ``Name [3/10]`` (no separator), which
# counts only for step and epoch. The name must start a token (so --lr=1 or a/b=1 do not
# half-match) and the number must end one (so 12:30:01, 1.5x or 10ms are not numbers).
_SCAN = re.compile(
    r"""(?:^|(?<=[\s,;({\[|'"]))([A-Za-z_][\w@./-]*+)['"]?(?:([=:])[ \t]*|[ \t]+)\[?[ \t]*("""
    + _NUMBER
    + r""")(?:/\d+)?(?=[\s,;|)\]}'"%]|$)"""
)
_CONTEXT = {**{k: "step" for k in STEP_KEYS}, **{k: "epoch" for k in EPOCH_KEYS}}


def _maybe_context(line: str) -> bool:
    """Could ``line`` name a step or an epoch? (Cheap substring tests before the regex.)"""
    low = line.lower()
    return "step" in low or "epoch" in low or "iter" in low


def _json_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _finite(text: Any) -> float | None:
    """A float from a captured group or a JSON value; None for junk, bools, nan and inf."""
    if isinstance(text, bool):
        return None
    try:
        value = float(text)
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


@dataclass
class _Source:
    """Read position in one growing file."""

    offset: int = 0
    partial: bytes = b""


@dataclass
class _RankState:
    log: _Source = field(default_factory=_Source)
    user: _Source = field(default_factory=_Source)
    step: int | None = None  # carried over from earlier lines
    epoch: int | None = None


class MetricsCollector:
    """Turn every rank's output (and user metrics file) of one attempt into ``metrics.jsonl``.

    ``poll`` is incremental and cheap when nothing changed; call it from one thread at a time.
    ``start``/``stop`` run it in a daemon thread (``stop`` does a final poll that also
    consumes a last line without a newline).
    """

    def __init__(self, paths: JobPaths, attempt: int, defs: Sequence[MetricDef] = (), auto: bool = True) -> None:
        self.paths = paths
        self.attempt = attempt
        self.auto = auto
        self._def_rx = [(re.compile(d.regex, re.MULTILINE), _json_str(d.name)) for d in defs]
        self._defs = [(rx.findall, jname, rx.groups == 1) for rx, jname in self._def_rx]
        self._def_names = frozenset(d.name for d in defs)
        self._names: dict[str, str] = {}  # name -> its JSON encoding, computed once
        self._ranks: dict[int, _RankState] = {}
        self.last_activity: float = time.time()
        self.records = 0
        self.errors = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.cpu_seconds = 0.0  # CPU time of the polling thread (for the benchmark)

    # -- polling -------------------------------------------------------------------

    def poll(self, final: bool = False) -> int:
        """Read what is new in every rank's files; append records; return how many."""
        total = 0
        for rank in self.paths.ranks(self.attempt):
            state = self._ranks.setdefault(rank, _RankState())
            out: list[str] = []
            now = time.time()
            for text in self._read(self.paths.rank_log(self.attempt, rank), state.log, final):
                self._extract(text, rank, state, now, out)
            for text in self._read(self.paths.rank_user_metrics(self.attempt, rank), state.user, final):
                self._user_lines(text, rank, now, out)
            if out:
                with open(self.paths.rank_metrics(self.attempt, rank), "a", encoding="utf-8") as fh:
                    fh.write("".join(out))
                total += len(out)
        self.records += total
        return total

    def _read(self, path: Path, src: _Source, final: bool) -> Iterable[str]:
        """Complete new lines of ``path`` as text, in bounded chunks.

        A carriage return ends a line too: progress bars (tqdm) redraw with ``\r`` and may
        never print a newline, and their postfix (``loss=0.3``) is worth reading.
        """
        try:
            fh = open(path, "rb")
        except OSError:
            return
        with fh:
            fh.seek(src.offset)
            while True:
                chunk = fh.read(READ_CHUNK)
                if chunk:
                    src.offset += len(chunk)
                    self.last_activity = time.time()
                at_end = len(chunk) < READ_CHUNK
                data = src.partial + chunk
                cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
                if final and at_end or not cut and len(data) > MAX_LINE:
                    cut = len(data)  # the file is complete (or the line absurd): take it all
                src.partial = data[cut:]
                if cut:
                    text = data[:cut].decode("utf-8", errors="replace")
                    yield text.replace("\r", "\n") if "\r" in text else text
                if at_end:
                    return

    def _extract(self, text: str, rank: int, state: _RankState, now: float, out: list[str]) -> None:
        """Every metric value in ``text`` (complete lines), with the step and epoch of its line.

        This runs over every line a job prints, so it is written for speed: one findall per
        definition and one scan per line, no match objects unless a line needs them.
        """
        defs = self._defs
        def_names = self._def_names
        auto = self.auto
        names = self._names
        scan = _SCAN.findall
        context = _CONTEXT
        step, epoch = state.step, state.epoch
        tail = f', "rank": {rank}, "attempt": {self.attempt}, "time": {now:.3f}}}\n'
        append = out.append
        for line in text.split("\n"):
            if not line:
                continue
            found: list[tuple[str, str]] = []  # (JSON name, number text)
            for findall, jname, single in defs:
                for g in findall(line):
                    found.append((jname, g if single else g[0]))
            if auto and ("=" in line or ":" in line) or _maybe_context(line):
                picked: list[tuple[str, str]] = []
                for name, sep, number in scan(line):
                    low = name.lower()
                    key = context.get(low)
                    if key is not None:
                        if number.isdigit():
                            if key == "step":
                                step = int(number)
                            else:
                                epoch = int(number)
                    elif auto and sep and name not in def_names and low not in NOT_METRICS:
                        picked.append((name, number))
                if picked:
                    if found:
                        picked = self._untaken(line, picked)
                    for name, number in picked:
                        jname = names.get(name)
                        if jname is None:
                            jname = names[name] = _json_str(name)
                        found.append((jname, number))
            if not found:
                continue
            head = f', "step": {"null" if step is None else step}, "epoch": {"null" if epoch is None else epoch}{tail}'
            for jname, number in found:
                try:
                    value = float(number)
                except ValueError:
                    continue
                if value - value:  # nan or inf: not a number JSON can hold
                    continue
                append(f'{{"name": {jname}, "value": {value!r}{head}')
        state.step, state.epoch = step, epoch

    def _untaken(self, line: str, picked: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The picked-up numbers of ``line`` that no definition matched (slow path: spans)."""
        taken = [m.span(1) for rx, _ in self._def_rx for m in rx.finditer(line)]
        keep = []
        for m in _SCAN.finditer(line):
            if (m.group(1), m.group(3)) in picked:
                start, end = m.span(3)
                if not any(s < end and start < e for s, e in taken):
                    keep.append((m.group(1), m.group(3)))
        return keep

    def _user_lines(self, text: str, rank: int, now: float, out: list[str]) -> None:
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                self.errors += 1
                continue
            if not isinstance(obj, dict):
                continue
            step = _int_or_none(obj.get("step", obj.get("global_step", obj.get("iteration"))))
            epoch = _int_or_none(obj.get("epoch"))
            if isinstance(obj.get("name"), str) and "value" in obj:
                pairs: Iterable[tuple[str, Any]] = [(obj["name"], obj["value"])]
            else:
                pairs = ((k, v) for k, v in obj.items() if k.lower() not in _CONTEXT and k != "time")
            for name, raw in pairs:
                value = _finite(raw) if isinstance(raw, (int, float)) else None
                if value is None:
                    continue
                out.append(json.dumps({"name": name, "value": value, "step": step, "epoch": epoch,
                                       "rank": rank, "attempt": self.attempt, "time": round(now, 3)}) + "\n")

    # -- background thread -----------------------------------------------------------

    def start(self, interval: float = 1.0) -> "MetricsCollector":
        """Poll every ``interval`` seconds in a daemon thread until ``stop``. Non-blocking."""
        if self._thread is not None:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(interval,), name="phalanx-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop the thread and do a final poll; returns the total number of records. Idempotent."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        began = time.thread_time()
        self._safe_poll(final=True)
        self.cpu_seconds += time.thread_time() - began
        return self.records

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            began = time.thread_time()
            self._safe_poll(final=False)
            self.cpu_seconds += time.thread_time() - began

    def _safe_poll(self, final: bool) -> None:
        # A full disk or a vanished directory must not take the supervisor down with it.
        try:
            self.poll(final=final)
        except Exception as exc:  # noqa: BLE001
            self.errors += 1
            if self.errors == 1:
                print(f"phalanx: metrics collection failed: {exc}", file=sys.stderr)


# -- reading back ---------------------------------------------------------------------


def _parse_lines(data: bytes) -> list[dict[str, Any]]:
    """JSON lines -> dicts; fast path parses all lines in one call, junk lines are dropped."""
    text = data.decode("utf-8", errors="replace")
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        return []
    try:
        parsed = json.loads("[" + ",".join(lines) + "]")
        if all(isinstance(r, dict) for r in parsed):
            return parsed
    except ValueError:
        pass
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def read_jsonl(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines of ``path`` from ``offset``; returns (records, new offset)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return [], offset
    cut = data.rfind(b"\n") + 1  # a line still being written is read next time
    return _parse_lines(data[:cut]), offset + cut


def tail_jsonl(path: Path, max_bytes: int = 1 << 18) -> list[dict[str, Any]]:
    """The complete JSON lines within the last ``max_bytes`` of ``path`` (recent records only)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            start = max(0, size - max_bytes)
            fh.seek(start)
            data = fh.read()
    except OSError:
        return []
    if start:
        data = data[data.find(b"\n") + 1:]  # the first line is cut by the window
    return _parse_lines(data[: data.rfind(b"\n") + 1])


def read_metrics(paths: JobPaths, attempt: int | None = None, rank: int | None = None) -> list[dict[str, Any]]:
    """Metric records of one attempt (all attempts, oldest first, if None), optionally one rank."""
    attempts = paths.attempts() if attempt is None else [attempt]
    out: list[dict[str, Any]] = []
    for a in attempts:
        for r in paths.ranks(a) if rank is None else [rank]:
            out.extend(read_jsonl(paths.rank_metrics(a, r))[0])
    return out


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
        buckets = array("d")
        for i in range(width):
            lo, hi = i * len(values) // width, (i + 1) * len(values) // width
            part = values[lo:max(hi, lo + 1)]
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
    found = sorted({r for a in attempts for r in paths.ranks(a) if paths.rank_metrics(a, r).exists()})
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
    records = [r for a in attempts for r in read_metrics(paths, a, rank)] if rank is not None else []
    summary = summarize(records)
    for name, s in summary.items():
        s["sparkline"] = sparkline([v for _, v in by_step(records, name)])
    span = "attempt " + str(attempt) if attempt is not None else (
        f"attempts {known[0]}-{known[-1]}" if len(known) > 1 else f"attempt {known[0] if known else 0}")
    return {"job": record.id, "attempt": attempt, "rank": rank, "where": f"rank {rank}, {span}", "metrics": summary}


def status_summary_lines(record: Any) -> list[str]:
    """Lines for ``phalanx status``: rank 0's metrics of the latest attempt, then hints."""
    from .hints import hints
    from .resources import recent_resources

    paths = JobPaths(Path(record.job_dir))
    attempt = record.attempt
    lines: list[str] = []
    rank = default_rank(paths, [attempt])
    summary = summarize(read_metrics(paths, attempt, rank)) if rank is not None else {}
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
    return [r for rank in paths.ranks(attempt) for r in tail_jsonl(paths.rank_metrics(attempt, rank), max_bytes)]
