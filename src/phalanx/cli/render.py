"""Rendering records for people (tables) and programs (JSON)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Iterable, TextIO

from ..api.query import platform_state
from ..store import JobRecord


def ago(ts: float | None) -> str:
    if ts is None:
        return "-"
    delta = time.time() - ts
    if delta < 60:
        return f"{int(delta)}s ago"
    if delta < 3600:
        return f"{int(delta // 60)}m ago"
    if delta < 86400:
        return f"{int(delta // 3600)}h ago"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def table(rows: Iterable[tuple[str, ...]], headers: tuple[str, ...], out: TextIO) -> None:
    """A plain aligned table (fast: no rich import for `ps`)."""
    rows = [headers, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")


def job_rows(records: Iterable[JobRecord], width: int = 48) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for r in records:
        cmd = r.command if len(r.command) <= width else r.command[: width - 1] + "…"
        state = r.state.value if r.exit_code in (None, 0) else f"{r.state.value}({r.exit_code})"
        platform = platform_state(r)  # the platform's own words (SageMaker: Starting, Training...)
        state += f" ({platform})" if platform else ""
        rows.append((r.id, r.name, state, r.topology, ago(r.created_at), duration(r.duration), cmd))
    return rows


def sweep_row(s: Any, width: int = 48) -> tuple[str, ...]:
    best = f", best {s.objective}={s.best_value:.4g}" if s.best_value is not None else ""
    cmd = f"[sweep {s.progress}{best}] {s.command}"
    cmd = cmd if len(cmd) <= width + 24 else cmd[: width + 23] + "…"
    return (s.id, s.name, s.state.value, s.topology, ago(s.created_at), duration(s.duration), cmd)


PS_HEADERS = ("ID", "NAME", "STATE", "TOPOLOGY", "CREATED", "DURATION", "COMMAND")


def dump_json(data: Any, out: TextIO) -> None:
    out.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def dump_json_stream(items: Iterable[Any], out: TextIO) -> None:
    """``dump_json`` of the list of ``items``, byte for byte, written one item at a time: a
    listing of a million jobs never has to be held in memory."""
    first = True
    for item in items:
        out.write(("[\n  " if first else ",\n  ") + _indented_item(item))
        first = False
    out.write("[]\n" if first else "\n]\n")


def _indented_item(item: Any) -> str:
    """One list item as ``json.dumps(..., indent=2, sort_keys=True, default=str)`` writes it
    one level deep. A job's dict is flat but for a few values: writing its scalars directly is
    5x faster than json's indenting encoder (pure Python), and the same text."""
    if type(item) is not dict or not item or any(type(k) is not str for k in item):
        return json.dumps(item, indent=2, sort_keys=True, default=str).replace("\n", "\n  ")
    parts = []
    for key in sorted(item):
        value = item[key]
        kind = type(value)
        if kind is str:
            text = _string(value)
        elif value is None:
            text = "null"
        elif kind is bool:
            text = "true" if value else "false"
        elif kind is int:
            text = int.__repr__(value)
        elif kind is float:
            text = _float(value)
        else:
            text = json.dumps(value, indent=2, sort_keys=True, default=str).replace("\n", "\n    ")
        parts.append(f"    {_string(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n  }"


_string = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


def warn(warnings: list[str], notes: list[str] | None = None) -> None:
    """What the checks found worth saying, once all of them passed: notes, then warnings."""
    for text in notes or []:
        sys.stderr.write(f"phalanx: {text}\n")
    for text in warnings:
        sys.stderr.write(f"phalanx: warning: {text}\n")
