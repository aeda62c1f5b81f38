"""Bad numbers caught: a watched metric printed as nan/inf (``--on-nan``), or jumping more than
``--on-spike FACTOR`` times above its recent median.

Which metrics are watched (``--watch-metric NAME``, repeatable, globs allowed): by default the
sweep objective's metric and every metric whose name ends in ``loss`` (``loss``, ``train_loss``,
``val/loss``; not ``loss_scale``, which mixed precision halves and doubles on purpose). Other
metrics may be nan on purpose (a skipped step's ``grad_norm``) and are left alone.

Pure: what the metrics collector read goes in (``nonfinite``, ``values``), an ``Anomaly`` comes
out; what to do about it (stop, or roll back and retry) is the supervisor's.
"""

from __future__ import annotations

import fnmatch
from collections import deque
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any, Iterable, Sequence

DEFAULT_WATCH = ("*loss",)
WINDOW = 20  # recent values a spike is measured against
MIN_VALUES = 10  # no spike is judged on fewer (the first steps swing widely)
NONE = -(2**63)  # a step or epoch the metrics file has none for (metricfile.NONE)


@dataclass(frozen=True)
class Rules:
    """What the job watches and how it reacts (from the spec)."""

    on_nan: str | None = None  # stop | retry | None: not watched
    spike: float | None = None  # --on-spike FACTOR
    watch: tuple[str, ...] = DEFAULT_WATCH

    @property
    def active(self) -> bool:
        return self.on_nan is not None or self.spike is not None

    @property
    def action(self) -> str:
        """What an anomaly leads to: ``retry`` (roll back) or ``stop``."""
        return "retry" if self.on_nan == "retry" else "stop"

    def watches(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.watch)


def rules_of(spec: Any, objective: str | None = None) -> Rules:
    """The rules of a ``JobSpec`` (its ``on_nan``, ``on_spike``, ``watch_metrics``) and, for a
    sweep's trial, its objective's metric."""
    watch = tuple(getattr(spec, "watch_metrics", ()) or ())
    if not watch:
        watch = DEFAULT_WATCH + ((objective,) if objective else ())
    return Rules(getattr(spec, "on_nan", None), getattr(spec, "on_spike", None), watch)


@dataclass(frozen=True)
class Anomaly:
    kind: str  # nan | spike
    metric: str
    value: str  # as printed ("nan") or as read ("12.3")
    step: int | None
    rank: int
    at: float  # when the line was read
    median: float | None = None  # a spike's recent median
    epoch: int | None = None

    def message(self) -> str:
        """``diverged: loss=nan at step 1,234 (rank 0)``."""
        where = f" at step {self.step:,}" if self.step is not None else (
            f" in epoch {self.epoch}" if self.epoch is not None else "")
        jump = ""
        if self.kind == "spike" and self.median:
            jump = f", {float(self.value) / self.median:.0f}× its recent median {self.median:.4g}"
        return f"diverged: {self.metric}={self.value}{where} (rank {self.rank}){jump}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "message": self.message()}

    @classmethod
    def from_dict(cls, data: Any) -> "Anomaly | None":
        from .progress import from_fields

        return from_fields(cls, data)


class AnomalyWatch:
    """The first anomaly among what the collector reads (later ones are not news)."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.found: Anomaly | None = None
        self._recent: dict[tuple[int, str], deque[float]] = {}

    def nonfinite(self, entries: Iterable[Any], now: float) -> Anomaly | None:
        """``entries``: the collector's ``NonFinite`` (rank, name, text, step, epoch)."""
        if self.found is not None or not self.rules.active:
            return self.found
        for rank, name, text, step, epoch in entries:
            if self.rules.watches(name):
                self.found = Anomaly("nan", name, text, step, rank, now, epoch=epoch)
                break
        return self.found

    def values(self, rank: int, block: dict[str, Any], now: float) -> Anomaly | None:
        """``block``: name -> columns (``values``, ``steps``, ``epochs``) just read from ``rank``."""
        factor = self.rules.spike
        if self.found is not None or factor is None:
            return self.found
        for name, columns in block.items():
            if not self.rules.watches(name):
                continue
            recent = self._recent.setdefault((rank, name), deque(maxlen=WINDOW))
            for value, step, epoch in zip(columns.values, columns.steps, columns.epochs):
                # the median is at least the minimum: most values need no median at all
                if len(recent) >= MIN_VALUES and value > factor * min(recent):
                    mid = median(recent)
                    if mid > 0 and value > factor * mid:
                        self.found = Anomaly("spike", name, f"{value:.6g}", None if step == NONE else step, rank, now,
                                             round(mid, 6), None if epoch == NONE else epoch)
                        return self.found
                recent.append(value)
        return None


def pick_version(versions: Sequence[dict[str, Any]], anomaly: Anomaly) -> dict[str, Any] | None:
    """The newest kept version of the state directory written before ``anomaly``: tagged with a
    step below the anomaly's (a checkpoint written at the anomaly's step may hold its numbers),
    or, where steps say nothing, taken before the anomaly was read. ``versions``: oldest first,
    each with ``step`` (or None) and ``time``."""
    for version in reversed(versions):
        step = version.get("step")
        if anomaly.step is not None and step is not None:
            if step < anomaly.step:
                return version
        elif float(version.get("time", 0.0)) < anomaly.at - 1.0:
            return version  # a second before the line was read: it was printed after this
    return None
