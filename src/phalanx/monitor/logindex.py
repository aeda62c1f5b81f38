"""Where to start reading a rank's log: its last N lines (``logs --tail N``), or what it printed
since a time (``logs --since 10m``).

Logs hold no times (they are the script's own bytes). The supervisor, which reads every
rank's output about once a second anyway, notes in ``rank_<r>/output.idx`` how long each log
was at that moment (``note``): a line ``TIME SIZE`` whenever it grew. Output written after time
T starts at the size noted last before T, so ``--since`` is exact to that second. Jobs recorded
before the index existed have none: ``since_offset`` says so (None) and the caller shows all.
"""

from __future__ import annotations

import os
import re
import time
from datetime import datetime
from pathlib import Path

from ..core.paths import JobPaths
from ..errors import UsageError

_noted: dict[tuple[str, int, int], int] = {}  # (job dir, attempt, rank) -> size last noted
_MAX_NOTED = 100_000


def note(paths: JobPaths, attempt: int, now: float | None = None) -> None:
    """Record the current size of every rank's log of ``attempt`` that grew since last time."""
    now = time.time() if now is None else now
    for rank in paths.ranks(attempt):
        try:
            size = os.stat(paths.rank_log(attempt, rank)).st_size
        except OSError:
            continue
        key = (str(paths.root), attempt, rank)
        if _noted.get(key, 0) >= size:
            continue
        if len(_noted) >= _MAX_NOTED:
            _noted.clear()
        _noted[key] = size
        try:
            with open(paths.rank_log_index(attempt, rank), "a") as fh:
                fh.write(f"{now:.3f} {size}\n")
        except OSError:
            pass  # an index is an aid: never let it stop the job


def forget(paths: JobPaths) -> None:
    """The job ended: drop what was remembered of it."""
    root = str(paths.root)
    for key in [k for k in _noted if k[0] == root]:
        del _noted[key]


def since_offset(paths: JobPaths, attempt: int, rank: int, since: float) -> int | None:
    """The offset of the first byte the rank printed at or after ``since``; None without an index."""
    try:
        lines = paths.rank_log_index(attempt, rank).read_text().splitlines()
    except OSError:
        return None
    offset = 0
    for line in lines:
        stamp, _, size = line.partition(" ")
        try:
            if float(stamp) > since:
                break
            offset = int(size)
        except ValueError:
            continue
    return offset


def tail_offset(path: Path, lines: int, block: int = 65536) -> int:
    """The offset where the last ``lines`` lines of ``path`` begin (0: the whole file)."""
    if lines <= 0:
        try:
            return os.stat(path).st_size
        except OSError:
            return 0
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            pos, seen = end, 0
            last = b""
            if end:
                fh.seek(end - 1)
                last = fh.read(1)
            wanted = lines + (1 if last == b"\n" else 0)  # a final newline ends the last line
            while pos > 0:
                start = max(0, pos - block)
                fh.seek(start)
                chunk = fh.read(pos - start)
                for i in range(len(chunk) - 1, -1, -1):
                    if chunk[i] == 10:
                        seen += 1
                        if seen == wanted:
                            return start + i + 1
                pos = start
    except OSError:
        return 0
    return 0


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)?\s*$")
_UNITS = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, what: str) -> float:
    """``90s``, ``10m``, ``2h``, ``30d``, ``1w`` (a bare number is seconds) -> seconds."""
    match = _DURATION.match(text or "")
    if not match:
        raise UsageError(f"invalid {what} '{text}'", "use a number with s, m, h, d or w, e.g. 30d or 10m")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_since(text: str, what: str = "--since", now: float | None = None) -> float:
    """A time: a duration back from now (``10m``, ``2d``) or a date and time
    (``2025-03-01``, ``2025-03-01T14:30``, local time) -> seconds since the epoch."""
    now = time.time() if now is None else now
    if _DURATION.match(text or ""):
        return now - parse_duration(text, what)
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise UsageError(f"invalid {what} '{text}'", "use a duration back from now (10m, 2h, 30d) or a date (2025-03-01T14:30)") from None
