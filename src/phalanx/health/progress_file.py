"""A job's ``health.json``: what its supervisor last saw of its progress, straggler, anomaly and
stop clocks. Written by the supervisor (``supervise/guard.py``, atomically, at most once a second
while something changed), read by ``status``, ``ps``, ``wait --progress``, the dashboard and the
end notification::

    {"version": 1, "attempt": 2, "updated": 1700000000.0,
     "progress": {"text": "step 450/1000", "fraction": 0.45, "rate": 0.0012, "eta": 458.3, "at": ..., "rank": 0, ...},
     "straggler": {"ranks": [5], "nodes": [2], "hosts": ["node-2"], "factor": 2.8, "message": "rank 5 on node 2 ...", ...},
     "anomaly": {"kind": "nan", "metric": "loss", "value": "nan", "step": 1234, "rank": 0, "message": "diverged: ..."},
     "limits": {"max_duration": 21600, "ran": 3600.5, "idle_timeout": 1800, "idle_for": 12.0}}

A file a newer phalanx wrote with an unknown version reads as empty, never as an error: it only
informs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.paths import write_atomic
from .anomaly import Anomaly
from .progress import Estimate
from .straggler import Straggler

VERSION = 1


@dataclass(frozen=True)
class Health:
    attempt: int = 0
    updated: float = 0.0
    progress: Estimate | None = None
    straggler: Straggler | None = None
    anomaly: Anomaly | None = None
    limits: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "attempt": self.attempt, "updated": self.updated,
                "progress": self.progress.to_dict() if self.progress else None,
                "straggler": self.straggler.to_dict() if self.straggler else None,
                "anomaly": self.anomaly.to_dict() if self.anomaly else None, "limits": dict(self.limits)}


def read(path: Path) -> Health:
    """The health file at ``path``; an empty ``Health`` when there is none (or it is unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return Health()
    if not isinstance(data, dict) or int(data.get("version") or 1) > VERSION:
        return Health()
    straggler = None
    if isinstance(data.get("straggler"), dict):
        try:
            straggler = Straggler.from_dict(data["straggler"])
        except (TypeError, ValueError):
            straggler = None
    return Health(int(data.get("attempt") or 0), float(data.get("updated") or 0.0), Estimate.from_dict(data.get("progress")),
                  straggler, Anomaly.from_dict(data.get("anomaly")), dict(data.get("limits") or {}))


def write(path: Path, health: Health) -> None:
    write_atomic(path, json.dumps(health.to_dict(), sort_keys=True) + "\n")


def shown(path: Path, running: bool) -> dict[str, Any]:
    """``view`` of the health file at ``path`` as of now."""
    import time

    return view(read(path), running, time.time())


def view(health: Health, running: bool, now: float) -> dict[str, Any]:
    """What status, ps and the dashboard show: the parts as data, each with its words. A job that
    no longer runs shows its last progress (no ETA) and its anomaly, not a straggler."""
    from .progress import human

    out: dict[str, Any] = {"attempt": health.attempt, "updated": health.updated or None, "progress": None,
                           "straggler": None, "anomaly": None, "limits": dict(health.limits), "lines": []}
    lines: list[tuple[str, str]] = []
    p = health.progress
    if p is not None:
        eta = p.eta_at(now) if running else None
        share = f" ({100 * p.fraction:.0f}%{' of the epoch' if p.of_epoch else ''})" if p.fraction is not None else ""
        when = f", ETA {human(eta)}" if eta is not None else ""
        out["progress"] = {**p.to_dict(), "eta_now": eta, "short": p.short(now, running),
                           "words": f"{p.text}{share}{when}"}
        lines.append(("progress", out["progress"]["words"]))
    if health.straggler is not None and running:
        out["straggler"] = {**health.straggler.to_dict(), "short": health.straggler.short()}
        lines.append(("straggler", health.straggler.message()))
    if health.anomaly is not None:
        out["anomaly"] = health.anomaly.to_dict()
        lines.append(("anomaly", health.anomaly.message()))
    limits = health.limits
    if running and limits:
        parts = []
        if "max_duration" in limits:
            parts.append(f"ran {human(float(limits.get('ran') or 0))} of --max-duration {human(float(limits['max_duration']))}")
        if "idle_timeout" in limits:
            parts.append(f"idle {human(float(limits.get('idle_for') or 0))} of --idle-timeout "
                         f"{human(float(limits['idle_timeout']))}")
        if parts:
            lines.append(("limits", "; ".join(parts)))
    out["lines"] = [{"label": label, "text": text} for label, text in lines]
    return out
