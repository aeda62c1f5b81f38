"""Progress and ETA from what a script already prints: no code in the script.

Read from each rank's output as the metrics collector reads it (``\\r`` redraws are lines too):

- tqdm bars, ``45%|████▌     | 450/1000 [00:12<00:15, 36.5it/s]`` (the HF Trainer's bar counts
  global steps; Lightning's TQDMProgressBar is ``Epoch 3: 45%|...| 36/80``);
- Lightning's Rich bar, ``Epoch 3/9 ━━━━━━╸━━━ 36/80 0:00:12 • 0:00:15`` (epochs from 0 to
  max_epochs-1; ANSI colours and cursor moves are ignored);
- Keras' bar, ``32/100 [=======>......] - ETA: 1s``, under an ``Epoch 3/10`` line;
- ``step N/M`` (also ``global_step``, ``iter``, ``iteration``, ``batch``), ``epoch N/M`` and
  ``[N/M]``, alone or together on a line (``Epoch [3/10] step 120/500``);
- ``--progress REGEX``: the user's pattern, with groups ``done`` and ``total`` (or the first two
  groups), or ``percent`` (or a single group).

An epoch count with a count inside it is read as epochs done plus the inner share, unless the
inner count is plainly the whole run's (it lies within the current epoch's share: a global step
counter). Epochs count from 1 unless a 0 was seen. Bars of evaluation (``Validation``,
``Sanity Checking``, ``Testing``, ``eval``), and unlabelled bars shorter than the main one (the
HF Trainer's evaluation bar), are not the run's progress. Epochs a bar does not say (Lightning's
TQDMProgressBar) come from the script's arguments when they hold ``--max_epochs``, ``--epochs``
or ``--num_train_epochs`` (``epochs_from_args``); otherwise the bar's share of its epoch is shown.

The ETA divides what is left by the rate over a recent window (a third of the time since the
first reading, between 30 s and 10 min), so a slow start (imports, compilation) fades out.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Sequence, TypeVar

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
# What makes a line worth parsing: a count N/M or a tqdm percentage (found at C speed in whole chunks).
_CANDIDATE = re.compile(r"\d\s*/\s*\d|\d%\|")
_SI = r"[\d.]+[kMGT]?"
_TQDM = re.compile(r"(?P<label>.*?)(?P<pct>\d{1,3})%\|[^|]*\|\s*(?P<n>" + _SI + r")/(?P<total>" + _SI + r")")
_RICH = re.compile(r"\bEpoch\s+(?P<e>\d+)/(?P<last>\d+)\s+[━╸╺╾╼─\s]*\s(?P<n>\d+)/(?P<total>\d+)\b")
_KERAS = re.compile(r"^\s*(?P<n>\d+)/(?P<total>\d+)\s+\[[=>.]+\]")
_EPOCH = re.compile(r"\bepoch\b[\s:=]*\[?\s*(?P<n>\d+)\s*/\s*(?P<total>\d+)", re.IGNORECASE)
_STEP = re.compile(r"\b(?:global[_ ]?step|step|iteration|iter|it|batch)\b[\s:=#]*\[?\s*(?P<n>\d+)\s*/\s*(?P<total>\d+)",
                   re.IGNORECASE)
_BRACKET = re.compile(r"\[\s*(?P<n>\d+)\s*/\s*(?P<total>\d+)\s*\]")
_EPOCH_LABEL = re.compile(r"\bepoch\s*(?P<e>\d+)\b", re.IGNORECASE)
_SECONDARY = re.compile(r"^\W*(?:valid|val\b|sanity|test|predict|eval|inference)", re.IGNORECASE)
_LAST_STEP = re.compile(rb"\b(?:global_step|step|iteration|iter)[\s:=#\[]*(\d+)", re.IGNORECASE)
_EPOCH_ARGS = ("--max_epochs", "--max-epochs", "--epochs", "--num_train_epochs", "--num-train-epochs",
               "--trainer.max_epochs", "--n_epochs", "--n-epochs")
CANDIDATES_PER_CHUNK = 64  # the latest lines worth parsing in one read of a rank's output
TAIL = 1 << 18  # of a flood, only its end is read for progress (the newest is what counts)
HISTORY = 512


@dataclass(frozen=True)
class Reading:
    """What one line says: ``done`` of ``total`` (``unit``), and the share of the run it means."""

    done: float
    total: float
    unit: str  # step | epoch | it | percent
    fraction: float | None  # of the whole run; None when only the share of an epoch is known
    text: str  # shown as is: "step 450/1000", "epoch 3/10 · 36/80"
    epoch_share: float | None = None  # without a run fraction: the share of the current epoch
    epoch: int | None = None


@dataclass(frozen=True)
class Estimate:
    """The job's progress as the supervisor last read it (``health.json``'s ``progress``)."""

    text: str
    fraction: float | None
    rate: float | None  # share of the run per second (of the epoch, without a run fraction)
    eta: float | None  # seconds left at ``at`` (of the epoch, without a run fraction)
    at: float  # when it was read
    rank: int
    attempt: int = 0
    of_epoch: bool = False  # fraction, rate and ETA are the current epoch's

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "Estimate | None":
        return from_fields(cls, data)

    def eta_at(self, now: float) -> float | None:
        """Seconds left as of ``now`` (the estimate counted down since it was made)."""
        return None if self.eta is None else max(0.0, self.eta - max(0.0, now - self.at))

    def short(self, now: float, running: bool = True) -> str:
        """``47% ETA 12m`` (a column); ``epoch 3 47%`` without a run fraction; ETA only while it runs."""
        share = self.fraction
        head = f"{100 * share:.0f}%" if share is not None else "-"
        if self.of_epoch and share is not None:
            head = f"{self.text.split(' ·')[0]} {head}"
        eta = self.eta_at(now) if running else None
        return head + (f" ETA {human(eta)}" if eta is not None else "")


T = TypeVar("T")


def from_fields(cls: type[T], data: Any) -> T | None:
    """A dataclass from the fields of ``data`` it knows (a newer writer's extra keys are left
    out); None when ``data`` is no mapping or lacks a field without a default."""
    if not isinstance(data, dict):
        return None
    try:
        return cls(**{k: data[k] for k in getattr(cls, "__dataclass_fields__") if k in data})
    except TypeError:
        return None


def human(seconds: float) -> str:
    """``45s``, ``12m``, ``3h05m``, ``2d4h``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def _si(text: str) -> float:
    """tqdm's unit_scale counts (``1.2k``); junk (``1.2.3``) is -1, which no bar reads as progress."""
    scale = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}.get(text[-1:], 1.0)
    try:
        return float(text[:-1] if scale != 1.0 else text) * scale
    except ValueError:
        return -1.0


def _candidates(text: str) -> Iterator[str]:
    """The lines of ``text`` that hold a count or a bar (the regex engine skims the rest)."""
    after = -1  # the end of the last line taken: a second match in it adds nothing
    for m in _CANDIDATE.finditer(text):
        if m.start() < after:
            continue
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.end())
        after = len(text) if end < 0 else end
        yield text[start:after]


def epochs_from_args(args: Sequence[str]) -> int | None:
    """The number of epochs the script's arguments ask for (``--max_epochs 3``, ``--epochs=3``)."""
    for i, word in enumerate(args):
        flag, eq, value = word.partition("=")
        if flag in _EPOCH_ARGS:
            text = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if text.isdigit() and int(text) > 0:
                return int(text)
    return None


def last_step(data: bytes) -> int | None:
    """The last step number printed in ``data`` (the end of a rank's log): ``step 50``,
    ``global_step=50``, ``step 50/100``, ``Step [50]``."""
    found = None
    for m in _LAST_STEP.finditer(data):
        found = m
    return int(found.group(1)) if found is not None else None


class ProgressTracker:
    """The latest progress of a job from its ranks' output, and its ETA.

    ``feed(rank, text, now)`` with each new piece of a rank's output (complete lines); the
    lowest rank that prints progress is followed. ``estimate(now)`` says where the run is.
    """

    def __init__(self, pattern: str | None = None, epochs: int | None = None, attempt: int = 0) -> None:
        self.user = re.compile(pattern) if pattern else None
        self.epochs = epochs
        self.attempt = attempt
        self.rank: int | None = None
        self.reading: Reading | None = None
        self.read_at = 0.0
        self.history: deque[tuple[float, float]] = deque(maxlen=HISTORY)
        self.zero_based = False  # an epoch 0 was seen
        self._epoch: tuple[int, int] | None = None  # (epoch as printed, epochs) of the last epoch line
        self._main_total: float | None = None  # total of the main unlabelled bar
        self._main_epoch: int | None = None

    def feed(self, rank: int, text: str, now: float) -> bool:
        """Read new output of ``rank``; True when the progress changed."""
        if self.rank is not None and rank > self.rank:
            return False  # a lower rank already reports progress
        lines: deque[str] = deque(maxlen=CANDIDATES_PER_CHUNK)
        if self.user is not None:
            lines.extend(text.split("\n")[-4 * CANDIDATES_PER_CHUNK:])
        else:
            lines.extend(_candidates(text[-TAIL:]))
        reading = None
        for line in lines:
            found = self._read(line)
            if found is not None:
                reading = found
        if reading is None:
            return False
        if self.rank is None or rank < self.rank:
            self.rank = rank
            self.history.clear()
        self._note(reading, now)
        return True

    def _note(self, reading: Reading, now: float) -> None:
        share = reading.fraction if reading.fraction is not None else reading.epoch_share
        previous = self.reading
        restarted = previous is not None and (
            (previous.fraction is None) != (reading.fraction is None) or previous.epoch != reading.epoch
            and reading.fraction is None)
        if share is not None and self.history and (restarted or share < self.history[-1][1] - 0.02):
            self.history.clear()  # a new epoch of an unknown number, or the script started over
        self.reading, self.read_at = reading, now
        if share is not None:
            self.history.append((now, share))

    def _read(self, raw: str) -> Reading | None:
        line = _ANSI.sub("", raw) if "\x1b" in raw else raw
        if self.user is not None:
            return self._user(line)
        m = _RICH.search(line)
        if m:
            self.zero_based = True
            epochs = int(m["last"]) + 1
            return self._combine(int(m["e"]), epochs, float(m["n"]), float(m["total"]), "it",
                                 f"epoch {int(m['e'])}/{epochs - 1} · {m['n']}/{m['total']}", per_epoch=True)
        m = _TQDM.search(line)
        if m:
            return self._tqdm(m)
        epoch = _EPOCH.search(line)
        if epoch:
            e, total = int(epoch["n"]), int(epoch["total"])
            if e == 0:
                self.zero_based = True
            self._epoch = (e, total)
            rest = line[:epoch.start()] + " " + line[epoch.end():]
            inner = _STEP.search(rest) or _BRACKET.search(rest)
            if inner and int(inner["total"]) > 0:
                return self._combine(e, total, float(inner["n"]), float(inner["total"]), "step",
                                     f"epoch {e}/{total} · {inner['n']}/{inner['total']}")
            done = e if self.zero_based else e - 1
            return Reading(e, total, "epoch", _clamp(done / total) if total else None, f"epoch {e}/{total}", epoch=e)
        m = _STEP.search(line) or _KERAS.search(line) or _BRACKET.search(line)
        if m and int(m["total"]) > 0:
            n, count = float(m["n"]), float(m["total"])
            if self._epoch is not None:
                e, epochs = self._epoch
                return self._combine(e, epochs, n, count, "step", f"epoch {e}/{epochs} · {m['n']}/{m['total']}",
                                     per_epoch=m.re is _KERAS)
            return Reading(n, count, "step", _clamp(n / count), f"step {m['n']}/{m['total']}")
        return None

    def _tqdm(self, m: re.Match[str]) -> Reading | None:
        label = m["label"].strip().rstrip(":").strip()
        if _SECONDARY.search(label):
            return None
        n, total = _si(m["n"]), _si(m["total"])
        if total <= 0 or n < 0:
            return None
        counted = _EPOCH.search(label)
        if counted:  # tqdm(desc=f"Epoch {e}/{epochs}")
            e, epochs = int(counted["n"]), int(counted["total"])
            self.zero_based = self.zero_based or e == 0
            return self._combine(e, epochs, n, total, "it", f"epoch {e}/{epochs} · {m['n']}/{m['total']}", per_epoch=True)
        labelled = _EPOCH_LABEL.search(label)
        if labelled:  # Lightning's TQDMProgressBar: "Epoch 3: 45%|...| 36/80", epochs from 0
            e = int(labelled["e"])
            self.zero_based = True
            if self.epochs:
                return self._combine(e, self.epochs, n, total, "it", f"epoch {e} · {m['n']}/{m['total']}", per_epoch=True)
            return Reading(n, total, "it", None, f"epoch {e} · {m['n']}/{m['total']}", epoch_share=_clamp(n / total),
                           epoch=e)
        if label:
            return Reading(n, total, "it", _clamp(n / total), f"{label} {m['n']}/{m['total']}")
        if self._main_total is not None and total < self._main_total:
            return None  # a shorter unlabelled bar below the main one: evaluation
        self._main_total = total
        if self._epoch is not None:
            e, epochs = self._epoch
            return self._combine(e, epochs, n, total, "it", f"epoch {e}/{epochs} · {m['n']}/{m['total']}")
        return Reading(n, total, "it", _clamp(n / total), f"{m['n']}/{m['total']}")

    def _combine(self, e: int, epochs: int, n: float, total: float, unit: str, text: str,
                 per_epoch: bool = False) -> Reading:
        """Epoch ``e`` of ``epochs`` and ``n`` of ``total`` inside it (``per_epoch``: surely so;
        otherwise a count within the epoch's share of the run is read as the run's own)."""
        if epochs <= 0 or total <= 0:
            return Reading(n, total, unit, None, text)
        done = e if self.zero_based else max(0, e - 1)
        low, high = done / epochs, (done + 1) / epochs
        inner = n / total
        whole_run = not per_epoch and epochs > 1 and low - 1e-9 <= inner <= high + 1e-9
        share = inner if whole_run else low + inner / epochs
        return Reading(n, total, unit, _clamp(share), text, epoch=e)

    def _user(self, line: str) -> Reading | None:
        assert self.user is not None
        m = self.user.search(line)
        if not m:
            return None
        groups = m.groupdict()
        try:
            if "percent" in groups and groups["percent"] is not None:
                pct = float(groups["percent"])
                return Reading(pct, 100.0, "percent", _clamp(pct / 100), f"{pct:g}%")
            if groups.get("done") is not None and groups.get("total") is not None:
                n, total = float(groups["done"]), float(groups["total"])
            elif m.re.groups >= 2:
                n, total = float(m.group(1)), float(m.group(2))
            else:
                pct = float(m.group(1))
                return Reading(pct, 100.0, "percent", _clamp(pct / 100), f"{pct:g}%")
        except (TypeError, ValueError, IndexError):
            return None
        if total <= 0:
            return None
        return Reading(n, total, "step", _clamp(n / total), f"{n:g}/{total:g}")

    def estimate(self, now: float) -> Estimate | None:
        """Where the run is and its ETA; None before any progress was read."""
        reading = self.reading
        if reading is None or self.rank is None:
            return None
        share = reading.fraction if reading.fraction is not None else reading.epoch_share
        rate = eta = None
        if share is not None and len(self.history) >= 2:
            t1, f1 = self.history[-1]
            first = self.history[0][0]
            window = min(600.0, max(30.0, (t1 - first) / 3))
            t0, f0 = next(((t, f) for t, f in self.history if t >= t1 - window), self.history[0])
            if t0 >= t1:  # readings far apart: the one before the last
                t0, f0 = self.history[-2]
            if t1 > t0 and f1 > f0:
                rate = (f1 - f0) / (t1 - t0)
                eta = (1.0 - share) / rate
        return Estimate(reading.text, share, rate, eta, self.read_at, self.rank, self.attempt,
                        reading.fraction is None)


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, value))
