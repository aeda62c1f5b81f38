"""Follow every rank's own log file of an attempt and print complete lines with a rank prefix.

Reads the files the bootstrap writes (one per rank), never a launcher's tee'd console
copy, so lines from different ranks can never be glued together.
"""

from __future__ import annotations

import threading
from typing import TextIO

from ..core.paths import JobPaths


class RankTailer:
    """Incrementally read ``attempt_<k>/rank_*/output.log`` files."""

    def __init__(self, paths: JobPaths, attempt: int, ranks: set[int] | None = None, prefix: bool = True) -> None:
        self.paths = paths
        self.attempt = attempt
        self.ranks = ranks
        self.prefix = prefix
        self._offsets: dict[int, int] = {}
        self._partial: dict[int, bytes] = {}

    def poll(self, final: bool = False) -> list[tuple[int, str]]:
        """New complete lines since the last call, as (rank, line); ``final`` flushes partial lines."""
        out: list[tuple[int, str]] = []
        for rank in self.paths.ranks(self.attempt):
            if self.ranks is not None and rank not in self.ranks:
                continue
            try:
                with open(self.paths.rank_log(self.attempt, rank), "rb") as fh:
                    fh.seek(self._offsets.get(rank, 0))
                    chunk = fh.read()
            except FileNotFoundError:
                continue
            if not chunk and not final:
                continue
            self._offsets[rank] = self._offsets.get(rank, 0) + len(chunk)
            data = self._partial.pop(rank, b"") + chunk
            lines = data.split(b"\n")
            rest = lines.pop()
            if rest and not final:
                self._partial[rank] = rest
            elif rest:
                lines.append(rest)
            out.extend((rank, line.decode(errors="replace")) for line in lines)
        return out

    def format(self, rank: int, line: str) -> str:
        return f"[{rank}] {line}" if self.prefix else line


def follow_attempts(
    paths: JobPaths, attempt: int, ranks: set[int] | None, prefix: bool, out: TextIO, done: threading.Event,
    interval: float = 0.1,
) -> None:
    """Like ``stream``, but moves on to each new attempt (job-level retries) as it appears."""
    tailer = RankTailer(paths, attempt, ranks, prefix)
    while True:
        finished = done.wait(interval)
        newer = [a for a in paths.attempts() if a > tailer.attempt]
        lines = tailer.poll(final=finished or bool(newer))
        if lines:
            out.write("".join(tailer.format(rank, line) + "\n" for rank, line in lines))
            out.flush()
        if newer:
            tailer = RankTailer(paths, min(newer), ranks, prefix)
            continue
        if finished:
            return
