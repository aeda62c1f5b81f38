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
from bisect import bisect_right
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

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
# name=value or name: value; the value must end the token (so 12:30:01, 1.2.3, 10ms, v=3x are
# not numbers) and the name must start the token (so a=b=1 or path/x=1 do not half-match).
_AUTO = re.compile(
    r"(?<![\w@./=-])([A-Za-z_][\w@./-]*?)['\"]?(?:\s*=\s*|:[ \t]*)(" + _NUMBER + r")(?=[\s,;|)\]}'\"]|%|$)",
    re.MULTILINE,
)
# step 12 / step=12 / Step: 12 / Epoch [3/10] / iter 5/100: integers only.
_CONTEXT = re.compile(
    r"\b(" + "|".join(STEP_KEYS + EPOCH_KEYS) + r")\b[ \t]*[=:]?[ \t]*\[?[ \t]*(\d+)(?![\d.])",
    re.IGNORECASE,
)
_CONTEXT_NAMES = frozenset(STEP_KEYS + EPOCH_KEYS)


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
        self._defs = [(re.compile(d.regex, re.MULTILINE), _json_str(d.name)) for d in defs]
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
                if final and at_end or len(data) > MAX_LINE:
                    cut = len(data)  # the file is complete (or the line absurd): take it all
                else:
                    cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
                src.partial = data[cut:]
                if cut:
                    text = data[:cut].decode("utf-8", errors="replace")
                    yield text.replace("\r", "\n") if "\r" in text else text
                if at_end:
                    return

    def _extract(self, text: str, rank: int, state: _RankState, now: float, out: list[str]) -> None:
        """Every metric value in ``text`` (complete lines), with the step/epoch of its line."""
        steps_at: list[int] = []
        steps: list[int] = []
        epochs_at: list[int] = []
        epochs: list[int] = []
        for m in _CONTEXT.finditer(text):
            key = m.group(1).lower()
            try:
                number = int(m.group(2))
            except ValueError:
                continue
            if key == "epoch":
                epochs_at.append(m.start())
                epochs.append(number)
            else:
                steps_at.append(m.start())
                steps.append(number)
        found: list[tuple[int, str, float]] = []  # (position, JSON name, value)
        taken: list[tuple[int, int]] = []  # spans of values a definition matched
        for rx, jname in self._defs:
            for m in rx.finditer(text):
                value = _finite(m.group(1))
                if value is None:
                    continue
                found.append((m.start(1), jname, value))
                if self.auto:
                    taken.append(m.span(1))
        if self.auto:
            taken.sort()
            starts = [s for s, _ in taken]
            names = self._names
            for m in _AUTO.finditer(text):
                name = m.group(1)
                low = name.lower()
                if low in _CONTEXT_NAMES or low in NOT_METRICS or name in self._def_names:
                    continue
                start, end = m.span(2)
                if taken:
                    i = bisect_right(starts, end - 1) - 1
                    if i >= 0 and taken[i][1] > start:
                        continue  # a definition already reported this number
                value = _finite(m.group(2))
                if value is None:
                    continue
                jname = names.get(name)
                if jname is None:
                    jname = names[name] = _json_str(name)
                found.append((start, jname, value))
        tail = f', "rank": {rank}, "attempt": {self.attempt}, "time": {now:.3f}}}\n'
        find = text.find
        line_end = last_pos = -1
        step_s = epoch_s = "null"
        # ``found`` ascends by position within each source (a definition, auto): look the
        # line's step and epoch up again only on a new line or when the source changes.
        for pos, jname, value in found:
            if pos > line_end or pos < last_pos:
                line_end = find("\n", pos)
                if line_end < 0:
                    line_end = len(text)
                i = bisect_right(steps_at, line_end) - 1
                step = steps[i] if i >= 0 else state.step
                j = bisect_right(epochs_at, line_end) - 1
                epoch = epochs[j] if j >= 0 else state.epoch
                step_s = "null" if step is None else str(step)
                epoch_s = "null" if epoch is None else str(epoch)
            last_pos = pos
            out.append(f'{{"name": {jname}, "value": {value!r}, "step": {step_s}, "epoch": {epoch_s}{tail}')
        if steps:
            state.step = steps[-1]
        if epochs:
            state.epoch = epochs[-1]

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
                pairs = ((k, v) for k, v in obj.items() if k.lower() not in _CONTEXT_NAMES and k != "time")
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


def status_summary_lines(record: Any) -> list[str]:
    """Lines for ``phalanx status``: rank 0's metrics of the latest attempt, then hints."""
    from .hints import hints
    from .resources import read_resources

    paths = JobPaths(Path(record.job_dir))
    attempt = record.attempt
    ranks = paths.ranks(attempt)
    lines: list[str] = []
    if ranks:
        summary = summarize(read_metrics(paths, attempt, ranks[0]))
        parts = []
        for name, s in summary.items():
            step = "" if s["last_step"] is None else f" (step {s['last_step']})"
            parts.append(f"{name} last={_fmt(s['last'])} min={_fmt(s['min'])} max={_fmt(s['max'])}{step}")
        if parts:
            label = "metrics" if ranks[0] == 0 else f"metrics (rank {ranks[0]})"
            lines.append(f"{label:<9} " + parts[0])
            lines.extend(" " * 10 + p for p in parts[1:])
    resources = read_resources(paths, attempt)
    for hint in hints(resources, read_metrics(paths, attempt) if len(ranks) > 1 else []):
        lines.append(f"hint      {hint}")
    return lines
