"""The attempts log (``attempts.jsonl``): one ``AttemptRecord`` per ended attempt, written here
only. An attempt nobody saw end (its supervisor vanished) is recorded LOST by the next
supervisor of the job, before it starts another attempt, so the history has no gaps."""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

from ..core.contracts import AttemptRecord, OutcomeKind, append_attempt, read_attempts
from ..core.paths import JobPaths
from ..errors import ContractError
from .outcome import Outcome

LOST_MESSAGE = "its supervisor vanished without recording an end"


def log_attempt(paths: JobPaths, attempt: int, started: float, outcome: Outcome, retry: bool, reason: str,
                left_out: tuple[Mapping[str, Any], ...] = ()) -> None:
    append_attempt(paths.attempts_log, AttemptRecord(
        attempt, started, time.time(), outcome.kind, outcome.exit_code, outcome.short(), retry, reason, left_out))


def left_out(paths: JobPaths) -> tuple[str, ...]:
    """Every node an earlier attempt of the job left out (a resumed job keeps avoiding them)."""
    try:
        entries = read_attempts(paths.attempts_log)
    except ContractError:
        return ()
    return tuple(dict.fromkeys(str(n["node"]) for e in entries for n in e.left_out if n.get("left_out")))


def lost_record(paths: JobPaths, attempt: int) -> AttemptRecord:
    """An attempt that ended unseen, dated by its files: started with its launch files, ended
    with the last thing any of its processes wrote."""
    first, last = _file_times(paths, attempt)
    return AttemptRecord(attempt, first, last, OutcomeKind.LOST, None, LOST_MESSAGE, False, "lost")


def record_lost(paths: JobPaths, before: int) -> list[int]:
    """Record as LOST every attempt below ``before`` that has a directory but no entry; returns them."""
    try:
        logged = {a.attempt for a in read_attempts(paths.attempts_log)}
    except ContractError:
        return []  # an unreadable log is not made worse by appending to it
    missing = [a for a in paths.attempts() if a < before and a not in logged]
    for attempt in missing:
        append_attempt(paths.attempts_log, lost_record(paths, attempt))
    return missing


def _file_times(paths: JobPaths, attempt: int) -> tuple[float, float]:
    times = []
    for dirpath, _, filenames in os.walk(paths.attempt(attempt)):
        for name in filenames:
            try:
                times.append(os.stat(os.path.join(dirpath, name)).st_mtime)
            except OSError:
                continue
    if not times:
        try:
            stamp = paths.attempt(attempt).stat().st_mtime
        except OSError:
            stamp = time.time()
        return stamp, stamp
    return min(times), max(times)
