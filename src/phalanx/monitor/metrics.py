"""Metrics from what a job already prints: named regular expressions and ``name=value`` numbers.

Every rank's own ``output.log`` (never a launcher's tee'd console copy) is read incrementally
and each number found becomes one record in that rank's ``metrics.bin``: its name, value, step,
epoch and the time it was read (``metricfile`` has the format: compact columns, a few MB per
million printed lines; ``phalanx metrics JOB --jsonl`` exports records as JSON lines)::

    {"name":"loss","value":0.1234,"step":123,"epoch":1,"rank":0,"attempt":0,"time":1700000000.0}

Jobs recorded by older versions have ``metrics.jsonl`` (those JSON lines) instead: every reader
here reads both.

Where numbers come from:

- ``--metric NAME=REGEX`` definitions (SageMaker-style): group 1 of every match is a value.
- automatic pick-up (``auto``, on by default): ``name=value`` and ``name: value`` numbers, e.g.
  ``loss=0.31 acc: 0.9``. ``step``, ``global_step``, ``iter``, ``iteration`` and ``epoch``
  (also written ``step 12``, ``Epoch [3/10]``) are not metrics: they are the step/epoch of the
  other numbers on their line, and carry over to later lines until the next one (a validation
  line printed after step 500 belongs to step 500). A number a definition already matched, or
  whose name a definition uses, is not picked up twice. Obvious non-metrics (rank, pid, port,
  seed, world_size) are skipped. Malformed numbers are ignored, never fatal; non-finite ones
  (``loss=nan``, ``inf``) are no record either, but the collector's ``observer`` hears of them
  (``--on-nan``: the supervisor's ``health`` watch).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Protocol, Sequence

from ..core.paths import JobPaths
from ..core.spec import MetricDef
from .metricfile import NONE, Columns, encode_block
from .metricfile import read_jsonl, tail_jsonl  # noqa: F401  (re-exported: long-standing import paths)
from .readback import read_metrics, summarize  # noqa: F401

# Bounded reads keep memory flat when a rank printed hundreds of MB between two polls.
READ_CHUNK = 4 << 20
# A "line" longer than this without a newline is read as it is rather than buffered forever.
MAX_LINE = 1 << 20

STEP_KEYS = ("global_step", "step", "iteration", "iter")
EPOCH_KEYS = ("epoch",)
# Numbers scripts print that are identities or settings, not measurements.
NOT_METRICS = frozenset({"rank", "local_rank", "global_rank", "world_size", "pid", "port", "seed", "node_rank", "gpu", "device"})

# A number as scripts print it; junk the class admits (1.2.3) is dropped by float(). nan and inf
# are read too (as Python, NumPy and torch print them) so that a diverging loss is seen.
_NUMBER = r"[-+]?(?:\d[\d.]*|\.\d+|(?i:nan|inf(?:inity)?)\b)(?:[eE][-+]?\d+)?"
# One pass per line finds both metrics and step/epoch: ``name=value`` or ``name: value``
# (groups: name, separator, number), or ``name value`` / ``Name [3/10]`` (no separator), which
# counts only for step and epoch. The name must start a token (so --lr=1 or a/b=1 do not
# half-match) and the number must end one (so 12:30:01, 1.5x or 10ms are not numbers); names
# longer than 100 characters are data, not names.
_SCAN = re.compile(
    r"""(?:^|(?<=[\s,;({\[|'"]))([A-Za-z_][\w@./-]{0,99}+)['"]?(?:([=:])[ \t]*|[ \t]+)\[?[ \t]*("""
    + _NUMBER
    + r""")(?:/\d+)?(?=[\s,;|)\]}'"%]|$)"""
)
_CONTEXT = {**{k: "step" for k in STEP_KEYS}, **{k: "epoch" for k in EPOCH_KEYS}}
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_STEP, _EPOCH, _METRIC, _DEF = 0, 1, 2, 3
# (kind, name start, name end, JSON name or None when the name has digits, number start, number end)
_Match = tuple[int, int, int, "str | None", int, int]
MAX_PLANS = 4096  # line shapes remembered; a training loop prints a handful


def digit_agnostic(pattern: str) -> bool:
    """Does the regex treat every digit alike? True when its only digits are in ``0-9``
    ranges (``\\d`` has none): then its matches in a line depend only on the line's shape."""
    return not any(c.isdigit() for c in pattern.replace("0-9", ""))


def _maybe_context(line: str) -> bool:
    """Could ``line`` name a step or an epoch? (Cheap substring tests before the regex.)"""
    low = line.lower()
    return "step" in low or "epoch" in low or "iter" in low


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
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return _counter(value)
    return None


def _counter(value: int) -> int | None:
    """A step or epoch as stored (64 bits); a number beyond that is no counter."""
    return value if NONE < value < 2**63 else None


class NonFinite(NamedTuple):
    """A metric printed as nan or inf: no record, but a sign of divergence."""

    rank: int
    name: str
    text: str  # as printed: nan, -inf, NaN
    step: int | None
    epoch: int | None


class Observer(Protocol):
    """Told of what the collector reads, as it reads it (``supervise/guard.py``'s health watch)."""

    def output(self, rank: int, text: str, now: float) -> None:
        """New complete lines of ``rank``'s output."""

    def values(self, rank: int, block: dict[str, Columns], nonfinite: list[NonFinite], now: float) -> None:
        """The records just read from ``rank`` (by metric name), and the non-finite numbers."""


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
    written: bool = False  # this collector has written the rank's metrics file (it replaced any earlier one)


class MetricsCollector:
    """Turn every rank's output (and user metrics file) of one attempt into ``metrics.bin``.

    A collector reads each rank's output from its start, so its first write replaces what an
    earlier collector of the attempt left (a supervisor that vanished: repeating its records
    would count them twice). ``poll`` is incremental and cheap when nothing changed; call it
    from one thread at a time.
    ``start``/``stop`` run it in a daemon thread (``stop`` does a final poll that also
    consumes a last line without a newline).
    """

    def __init__(self, paths: JobPaths, attempt: int, defs: Sequence[MetricDef] = (), auto: bool = True,
                 observer: Observer | None = None) -> None:
        self.paths = paths
        self.observer = observer
        self._nonfinite: dict[str, NonFinite] = {}  # the first of each name in one read
        self._rank = 0  # the rank being read (for NonFinite)
        self.attempt = attempt
        self.auto = auto
        compiled = [(re.compile(d.regex, re.MULTILINE), d.name) for d in defs]
        self._def_rx = [(rx, name) for rx, name in compiled if rx.groups >= 1]  # parse_metric ensures it
        # Definitions that treat all digits alike run once per line shape (see _plan); the
        # others (say "Acc@1 (...)") once per line.
        self._shape_defs = [(rx, name) for rx, name in self._def_rx if digit_agnostic(rx.pattern)]
        self._line_rx = [(rx, name) for rx, name in self._def_rx if not digit_agnostic(rx.pattern)]
        self._defs = [(rx.findall, name, rx.groups == 1) for rx, name in self._line_rx]
        self._plans: dict[bytes, tuple[_Match, ...]] = {}
        self._def_names = frozenset(d.name for d in defs)
        self._ranks: dict[int, _RankState] = {}
        self.last_activity: float = time.time()
        self.records = 0
        self.errors = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.cpu_seconds = 0.0  # CPU time of the polling thread (for the benchmark)

    # -- polling -------------------------------------------------------------------

    def poll(self, final: bool = False, max_bytes: int | None = None) -> int:
        """Read what is new in every rank's files; append records; return how many.

        ``max_bytes`` bounds what one call reads per rank log (the rest waits for the next
        call), so a caller's loop stays responsive while a rank floods its output; a final
        poll reads everything.
        """
        total = 0
        for rank in self.paths.ranks(self.attempt):
            state = self._ranks.setdefault(rank, _RankState())
            block: dict[str, Columns] = {}
            now = time.time()
            count = 0
            self._rank = rank
            for data in self._read(self.paths.rank_log(self.attempt, rank), state.log, final, None if final else max_bytes):
                count = self._extract(data, state, block, count, now)
            for data in self._read(self.paths.rank_user_metrics(self.attempt, rank), state.user, final):
                count = self._user_lines(data.decode("utf-8", errors="replace"), block, count)
            if count:
                self._append(rank, state, encode_block(round(now, 3), block))
                total += count
            if self.observer is not None and (count or self._nonfinite):
                self.observer.values(rank, block, list(self._nonfinite.values()), now)
            self._nonfinite = {}
        self.records += total
        return total

    def _append(self, rank: int, state: _RankState, block: bytes) -> None:
        """Append one block in one write; a write that fails (a full disk) leaves no torn block."""
        path = self.paths.rank_metrics(self.attempt, rank)
        with open(path, "ab" if state.written else "wb", buffering=0) as fh:
            start = fh.tell()
            try:
                view = memoryview(block)
                while view:
                    view = view[fh.write(view):]
            except OSError:
                fh.truncate(start)
                raise
        if not state.written:
            state.written = True
            self.paths.rank_metrics_jsonl(self.attempt, rank).unlink(missing_ok=True)

    def _read(self, path: Path, src: _Source, final: bool, limit: int | None = None) -> Iterable[bytes]:
        """Complete new lines of ``path``, in bounded chunks.

        A carriage return ends a line too: progress bars (tqdm) redraw with ``\r`` and may
        never print a newline, and their postfix (``loss=0.3``) is worth reading.
        """
        try:
            fh = open(path, "rb")
        except OSError:
            return
        with fh:
            fh.seek(src.offset)
            budget = limit
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
                    lines = data[:cut]
                    yield lines.replace(b"\r", b"\n") if b"\r" in lines else lines
                if at_end:
                    return
                if budget is not None:
                    budget -= len(chunk)
                    if budget <= 0:
                        return

    def _extract(self, data: bytes, state: _RankState, block: dict[str, Columns], count: int, now: float = 0.0) -> int:
        """Every metric value in ``data`` (complete lines), with the step and epoch of its line,
        into ``block`` (``count`` records so far; returns the new count).

        This runs over every line a job prints, so it is written for speed (see ``_plan``): a
        line reuses what the regexes found in an earlier line of the same shape, so most lines
        cost a slice of one ``bytes.translate``, a dict lookup and a few slices. Only
        definitions with digits of their own (``Acc@1 (...)``) run per line (``findall``).
        """
        text = data.decode("utf-8", errors="replace")
        if self.observer is not None:
            self.observer.output(self._rank, text, now)
        step, epoch = state.step, state.epoch
        plans = self._plans
        auto = self.auto
        defs = self._defs
        by_shape = bool(self._shape_defs)
        for line, shape in zip(text.split("\n"), data.translate(_DIGITS).split(b"\n")):
            if not line:
                continue
            found: list[tuple[str, str]] = []  # (JSON name, number text)
            for findall, name, single in defs:
                for g in findall(line):
                    found.append((name, g if single else g[0]))
            if by_shape or auto and ("=" in line or ":" in line) or _maybe_context(line):
                plan = plans.get(shape)
                if plan is None:
                    plan = self._plan(shape.decode("utf-8", errors="replace"))
                    if len(plans) >= MAX_PLANS:
                        plans.clear()  # free-text lines rarely repeat: start over rather than grow
                    plans[shape] = plan
                by_defs = bool(found)
                taken: list[tuple[int, int]] | None = None  # spans of numbers definitions matched
                for kind, ns, ne, known, vs, ve in plan:
                    if kind == _DEF:
                        found.append((known, line[vs:ve]))  # type: ignore[arg-type]
                    elif kind == _STEP:
                        step = _counter(int(line[vs:ve]))
                    elif kind == _EPOCH:
                        epoch = _counter(int(line[vs:ve]))
                    elif auto:
                        if by_defs:  # rare: a picked-up number on a line a definition matched
                            if taken is None:
                                taken = [m.span(1) for rx, _ in self._line_rx for m in rx.finditer(line)]
                            if any(s < ve and vs < e for s, e in taken):
                                continue  # the definition already reported this number
                        if known is None:  # a name with digits: known only from the line itself
                            known = line[ns:ne]
                            if known in self._def_names:
                                continue
                        found.append((known, line[vs:ve]))
            if not found:
                continue
            s = NONE if step is None else step
            e = NONE if epoch is None else epoch
            for name, number in found:
                try:
                    value = float(number)
                except ValueError:
                    continue
                if value - value:  # nan or inf: not a measurement, but divergence to report
                    if name not in self._nonfinite and len(self._nonfinite) < 100:
                        self._nonfinite[name] = NonFinite(self._rank, name, number, step, epoch)
                    continue
                col = block.get(name)
                if col is None:
                    col = block[name] = Columns()
                col.seq.append(count)
                col.steps.append(s)
                col.epochs.append(e)
                col.values.append(value)
                count += 1
        state.step, state.epoch = step, epoch
        return count

    def _plan(self, shape: str) -> tuple[_Match, ...]:
        """What the digit-agnostic definitions and the scan find in a line of this shape
        (digits replaced by 0): per match its kind, the name's span, its JSON name (None if the
        name has digits), and the number's span.

        Those regexes treat all digits alike, so lines of one shape have their names and
        numbers at the same places: they run once per shape, not once per line.
        """
        plan: list[_Match] = []
        taken: list[tuple[int, int]] = []
        for rx, def_name in self._shape_defs:
            for d in rx.finditer(shape):
                if d.group(1) is not None:
                    plan.append((_DEF, 0, 0, def_name, *d.span(1)))
                    taken.append(d.span(1))
        for m in _SCAN.finditer(shape):
            name, sep, number = m.group(1), m.group(2), m.group(3)
            low = name.lower()
            key = _CONTEXT.get(low)
            if key is not None:
                if number.isdigit():
                    plan.append((_STEP if key == "step" else _EPOCH, 0, 0, None, *m.span(3)))
                continue
            if not sep or low in NOT_METRICS:
                continue
            start, end = m.span(3)
            if any(s < end and start < e for s, e in taken):
                continue  # a definition reports this number
            known: str | None = None
            if "0" not in name:
                if name in self._def_names:
                    continue
                known = name
            plan.append((_METRIC, *m.span(1), known, *m.span(3)))
        return tuple(plan)

    def _user_lines(self, text: str, block: dict[str, Columns], count: int) -> int:
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
            s = NONE if step is None else step
            e = NONE if epoch is None else epoch
            for name, raw in pairs:
                value = _finite(raw) if isinstance(raw, (int, float)) else None
                if value is None or not isinstance(name, str):
                    if isinstance(raw, float) and isinstance(name, str) and raw - raw and name not in self._nonfinite:
                        self._nonfinite[name] = NonFinite(self._rank, name, repr(raw), step, epoch)
                    continue
                col = block.get(name) or block.setdefault(name, Columns())
                col.seq.append(count)
                col.steps.append(s)
                col.epochs.append(e)
                col.values.append(value)
                count += 1
        return count

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
