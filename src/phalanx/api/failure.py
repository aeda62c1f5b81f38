"""A failed attempt as a reader wants it: the rank that failed first (the root cause) first, and
the ranks that only lost their peer because of it folded under one line each.

When one rank of a distributed job raises, its peers blocked in a collective fail too, with a
communication error ("Connection closed by peer" from gloo, an aborted NCCL communicator, a
TCPStore that stopped answering), and their traces are as long as the real one. A rank is such
a casualty when both hold: it failed after the root cause (its own exception record, its log's
last write, says when), and what it died of is a communication error (its exception record, or
the end of its log when it died without one). Anything else stays in view: a second, unrelated
failure is not folded away.

A view: it reads the job directory and writes nothing. ``logs`` (the CLI) and the dashboard's
log panel read :func:`failure`; the job's view (``jobview``) carries it as data.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.contracts import RankError, read_node_result, read_rank_error
from ..core.paths import JobPaths
from ..core.state import JobState
from ..errors import ContractError
from ..store import JobRecord
from ..supervise.outcome import error_text

# What a rank that lost its peer dies of, across the backends torch.distributed uses (gloo,
# NCCL, the c10d stores). Matched against "Type: message" or the end of the rank's log.
PEER_LOST = re.compile(
    r"connection (closed|reset) by peer|broken pipe|\bgloo\b|pair\.cc|"
    r"\bDist(Backend|Network|Store)Error\b|ProcessGroup(Gloo|NCCL|UCC|MPI)|"
    r"NCCL (error|communicator)|nccl(Remote|System|Internal)Error|communicator was aborted|"
    r"collective operation timeout|TCPStore|Socket Timeout|recvValue|Failed to recv",
    re.IGNORECASE)
TAIL_BYTES = 64 * 1024  # where a collateral trace is looked for: the end of the log
TAIL_LINES = 40  # a rank with no exception record: the lines that tell what it died of
_CXX_WHERE = re.compile(r"^\[[^\]\s]+\.(?:cc|cpp|cu|h|hpp):\d+\]\s*")
_TRACEBACK = b"Traceback (most recent call last):"


@dataclass(frozen=True)
class PeerLost:
    """A rank that failed only because the root-cause rank did."""

    rank: int
    after: int  # the root-cause rank
    error: str  # what it died of, one line
    fold_at: int | None  # where in its log the collateral trace begins (bytes); None: nothing to fold
    folded_lines: int

    @property
    def line(self) -> str:
        return f"rank {self.rank}: lost its peer after rank {self.after} failed"

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "after": self.after, "line": self.line, "error": self.error,
                "fold_at": self.fold_at, "folded_lines": self.folded_lines}


@dataclass(frozen=True)
class Failure:
    """How one attempt failed: its root cause (the record ``supervise.outcome`` made) and the
    ranks that lost their peer."""

    attempt: int
    cause: dict[str, Any]
    peer_lost: tuple[PeerLost, ...]

    @property
    def rank(self) -> int:
        return int(self.cause["rank"])

    def order(self, ranks: list[int]) -> list[int]:
        """``ranks`` with the root-cause rank first, the rest in rank order."""
        return sorted(ranks, key=lambda r: (r != self.rank, r))

    def folds(self) -> dict[int, tuple[int, str]]:
        """Per folded rank: where its log's collateral trace begins and the line shown instead."""
        return {p.rank: (p.fold_at, f"{p.line} ({p.error}; {p.folded_lines} lines folded, --rank {p.rank} shows them)")
                for p in self.peer_lost if p.fold_at is not None}

    def headline(self) -> str:
        """The one line ``logs`` says before the logs."""
        head = f"rank {self.rank} failed first ({error_text(self.cause)}): its log comes first"
        if not self.peer_lost:
            return head
        many = len(self.peer_lost) > 1
        lost = ", ".join(str(p.rank) for p in self.peer_lost)
        return f"{head}; rank{'s' if many else ''} {lost} lost {'their' if many else 'its'} peer after it (folded)"


def failure(record: JobRecord, attempt: int | None = None) -> Failure | None:
    """How ``attempt`` (default: the latest) of the job failed, when it failed with a rank as
    its root cause; None otherwise (it succeeded, still runs, or failed before or around its
    ranks)."""
    paths = record.paths
    attempt = record.attempt if attempt is None else attempt
    cause = _cause(record, paths, attempt)
    if not cause or not isinstance(cause.get("rank"), int):
        return None
    root = int(cause["rank"])
    when = cause.get("timestamp")
    lost = []
    for rank in paths.ranks(attempt):
        if rank == root or not isinstance(when, (int, float)):
            continue
        found = _peer_lost(paths, attempt, rank, root, float(when))
        if found is not None:
            lost.append(found)
    return Failure(attempt, cause, tuple(lost))


def _cause(record: JobRecord, paths: JobPaths, attempt: int) -> dict[str, Any] | None:
    """The root cause of a failed attempt: the one the supervisor recorded for the latest,
    worked out again the same way for an earlier attempt that failed."""
    if attempt == record.attempt:
        return record.root_cause_dict() if record.state is JobState.FAILED else None
    from ..core.contracts import read_attempts
    from ..monitor.resources import node_ranks
    from ..supervise.outcome import root_cause

    if not any(a.attempt == attempt and a.outcome.value == "failed" for a in read_attempts(paths.attempts_log)):
        return None
    results = [read_node_result(paths.node_result(attempt, n)) for n in node_ranks(paths, attempt)]
    if not results or any(r is None for r in results):
        return None
    return root_cause(paths, attempt, [r for r in results if r is not None])


def _peer_lost(paths: JobPaths, attempt: int, rank: int, root: int, root_at: float) -> PeerLost | None:
    log = paths.rank_log(attempt, rank)
    error = _error(paths, attempt, rank)
    try:
        died = error.timestamp if error is not None else log.stat().st_mtime
    except OSError:
        return None
    if died < root_at:
        return None
    start, data = _tail(log)
    last = data.splitlines(keepends=True)[-TAIL_LINES:]
    said = f"{error.type}: {error.message}" if error is not None else b"".join(last).decode(errors="replace")
    if PEER_LOST.search(said) is None:
        return None
    fold = _fold(data, last if error is None else [])
    folded = data[fold:].count(b"\n") + (0 if data.endswith(b"\n") else 1) if fold >= 0 else 0
    return PeerLost(rank, root, _one_line(error, said), start + fold if fold >= 0 else None, folded)


def _fold(data: bytes, last: list[bytes]) -> int:
    """Where the collateral trace begins in ``data``: its last Python traceback, or else (a rank
    that died without an exception record: an abort) the first of ``last`` lines that names a
    communication error; -1 when neither is there."""
    at = data.rfind(b"\n" + _TRACEBACK)
    if at >= 0 or data.startswith(_TRACEBACK):
        return at + 1
    offset = len(data) - sum(len(line) for line in last)
    for line in last:
        if PEER_LOST.search(line.decode(errors="replace")):
            return offset
        offset += len(line)
    return -1


def _error(paths: JobPaths, attempt: int, rank: int) -> RankError | None:
    try:
        return read_rank_error(paths.rank_error(attempt, rank))
    except ContractError:
        return None


def _tail(log: Path) -> tuple[int, bytes]:
    """The end of a log (its last :data:`TAIL_BYTES`, from a line start) and where it begins."""
    try:
        with open(log, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            start = max(0, size - TAIL_BYTES)
            fh.seek(start)
            data = fh.read()
    except OSError:
        return 0, b""
    if start:
        cut = data.find(b"\n") + 1
        start, data = start + cut, data[cut:]
    return start, data


def _one_line(error: RankError | None, said: str, width: int = 100) -> str:
    """What a collateral rank died of, short: the exception's type and first sentence, without
    the C++ source location gloo and NCCL put first."""
    if error is not None:
        message = _CXX_WHERE.sub("", error.message.strip())
        message = re.split(r"(?<=[^.\s])\.\s", message.splitlines()[0] if message else "", maxsplit=1)[0]
        text = error_text({"type": error.type, "message": message})
    else:
        text = next((line for line in said.splitlines()[::-1] if PEER_LOST.search(line)), said)
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"
