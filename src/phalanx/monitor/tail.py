"""Follow every rank's own log file of an attempt and print complete lines with a rank prefix.

Reads the files the bootstrap writes (one per rank), never a launcher's tee'd console
copy, so lines from different ranks can never be glued together.

Following waits for the files to change (``watch.Watch``: inotify) rather than reading them
every 100 ms: a quiet job costs the follower nothing, and a line appears as soon as it is
written. While output flows, reads are at most every ``interval`` (they batch what came).
Where events cannot be trusted (a shared filesystem, no inotify) it polls every ``interval``.
"""

from __future__ import annotations

import codecs
import re
import threading
import time
from pathlib import Path
from typing import Callable, Sequence, TextIO

from ..core.paths import JobPaths
from .filewatch import Watch

# How often a follower of ``logs -f`` looks at the job's record although nothing changed: a
# supervisor that vanished changes nothing, and is noticed (LOST) that way.
LIVENESS_S = 2.0


class RankTailer:
    """Incrementally read ``attempt_<k>/rank_*/output.log`` files."""

    def __init__(self, paths: JobPaths, attempt: int, ranks: set[int] | None = None, prefix: bool = True,
                 offsets: dict[int, int] | None = None, order: Sequence[int] = (),
                 folds: dict[int, tuple[int, str]] | None = None) -> None:
        self.paths = paths
        self.attempt = attempt
        self.ranks = ranks
        self.prefix = prefix
        self._offsets: dict[int, int] = dict(offsets or {})  # where each rank's reading starts (logs --tail/--since)
        self._partial: dict[int, bytes] = {}
        self._decoders: dict[int, codecs.IncrementalDecoder] = {}
        self._order = list(order)  # ranks read first (a failed job's root-cause rank), then the rest in rank order
        # Per rank: where its log stops being shown, and the one line shown for the rest (a
        # collateral trace of a failed job: ``api/failure.py``).
        self._folds = dict(folds or {})
        self._folded: set[int] = set()

    def poll(self, final: bool = False) -> list[tuple[int, str]]:
        """New complete lines since the last call, as (rank, line); ``final`` flushes partial lines."""
        out: list[tuple[int, str]] = []
        for rank, chunk in self._new_bytes():
            if not chunk and not final:
                continue
            data = self._partial.pop(rank, b"") + chunk
            lines = data.split(b"\n")
            rest = lines.pop()
            if rest and not final:
                self._partial[rank] = rest
            elif rest:
                lines.append(rest)
            out.extend((rank, line.decode(errors="replace")) for line in lines)
            fold = self._folds.get(rank)
            if fold is not None and rank not in self._folded and self._offsets.get(rank, 0) >= fold[0]:
                self._folded.add(rank)
                out.append((rank, fold[1]))
        return out

    def poll_live(self) -> list[tuple[int, str]]:
        """New output since the last call as it was written, partial lines included, as
        (rank, text): what a terminal would have shown (a progress bar's ``\r`` updates live)."""
        out: list[tuple[int, str]] = []
        for rank, chunk in self._new_bytes():
            if chunk:
                decoder = self._decoders.setdefault(rank, codecs.getincrementaldecoder("utf-8")(errors="replace"))
                out.append((rank, decoder.decode(chunk)))
        return out

    def _new_bytes(self) -> list[tuple[int, bytes]]:
        """What each followed rank's log gained since the last read (the offsets move past it)."""
        out: list[tuple[int, bytes]] = []
        first = {rank: i for i, rank in enumerate(self._order)}
        for rank in sorted(self.paths.ranks(self.attempt), key=lambda r: (first.get(r, len(first)), r)):
            if self.ranks is not None and rank not in self.ranks:
                continue
            offset = self._offsets.get(rank, 0)
            fold = self._folds.get(rank)
            try:
                with open(self.paths.rank_log(self.attempt, rank), "rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read() if fold is None else fh.read(max(0, fold[0] - offset))
            except FileNotFoundError:
                continue
            self._offsets[rank] = self._offsets.get(rank, 0) + len(chunk)
            out.append((rank, chunk))
        return out

    def format(self, rank: int, line: str) -> str:
        return f"[{rank}] {line}" if self.prefix else line

    def watch(self, watch: Watch) -> None:
        """Have ``watch`` report new attempts, new ranks and writes to the followed ranks' logs.
        Call before each ``poll``: a directory watched first and read second misses nothing."""
        watch.add(self.paths.root, _directories)
        watch.add(self.paths.attempt(self.attempt), _directories)
        for rank in self.paths.ranks(self.attempt):
            if self.ranks is None or rank in self.ranks:
                log = self.paths.rank_log(self.attempt, rank)
                watch.add(log.parent, _named(log.name))



class Screen:
    """The ranks' raw output as a terminal should show it: a ``[rank]`` prefix at the start of
    every line and after every ``\r`` (a progress bar redrawn in place keeps its prefix),
    partial lines written as they come, and a line another rank left open ended first, so two
    ranks never share a line."""

    SEPARATORS = re.compile(r"(\r\n|\n|\r)")

    def __init__(self, prefix: bool) -> None:
        self.prefix = prefix
        self.open: int | None = None  # the rank whose unfinished line the cursor is on
        self.at_start = True  # whether that rank's next text begins a line (needs its prefix)

    def render(self, rank: int, text: str) -> str:
        out = []
        if self.open is not None and self.open != rank and text:
            out.append("\n")
            self.open, self.at_start = None, True
        elif self.open != rank:
            self.at_start = True
        for piece in self.SEPARATORS.split(text):
            if not piece:
                continue
            if self.SEPARATORS.fullmatch(piece):
                out.append(piece)
                self.at_start = True
                self.open = None if piece.endswith("\n") else rank
                continue
            if self.at_start and self.prefix:
                out.append(f"[{rank}] ")
            out.append(piece)
            self.at_start, self.open = False, rank
        return "".join(out)

    def end(self) -> str:
        """What ends an unfinished line, so phalanx's own last words start on a line of their own."""
        ending = "\n" if self.open is not None else ""
        self.open, self.at_start = None, True
        return ending


def _directories(name: str, is_dir: bool) -> bool:
    return is_dir


def _named(wanted: str, prefix: bool = False) -> Callable[[str, bool], bool]:
    def matches(name: str, is_dir: bool) -> bool:
        return name.startswith(wanted) if prefix else name == wanted

    return matches


class Stop(threading.Event):
    """A ``threading.Event`` whose ``set`` also wakes the followers waiting for it."""

    def __init__(self) -> None:
        super().__init__()
        self._hooks: list[Callable[[], None]] = []
        self._hooks_lock = threading.Lock()

    def set(self) -> None:
        super().set()
        with self._hooks_lock:
            hooks = list(self._hooks)
        for hook in hooks:
            hook()

    def on_set(self, hook: Callable[[], None]) -> None:
        with self._hooks_lock:
            self._hooks.append(hook)
        if self.is_set():
            hook()


def follow_attempts(
    paths: JobPaths, attempt: int, ranks: set[int] | None, prefix: bool, out: TextIO, done: threading.Event,
    interval: float = 0.1,
) -> None:
    """Print the followed ranks' output as it comes (partial lines too: :class:`Screen`),
    moving on to each new attempt (job-level retries) as it appears, until ``done`` is set; then
    print the rest. Blocking. With a :class:`Stop` as ``done`` the follower sleeps until
    something happens; with a plain ``threading.Event`` it also looks at ``done`` every ``interval``."""
    tailer = RankTailer(paths, attempt, ranks, prefix)
    screen = Screen(prefix)
    with Watch(fallback=interval) as watch:
        event_driven = False
        if isinstance(done, Stop):
            done.on_set(watch.wake)
            event_driven = True
        finished, changed, read_at = done.is_set(), True, 0.0
        while True:
            if changed or finished:
                tailer.watch(watch)
                newer = [a for a in paths.attempts() if a > tailer.attempt]
                read_at = time.monotonic()
                text = "".join(screen.render(rank, chunk) for rank, chunk in tailer.poll_live())
                if newer or finished:
                    text += screen.end()
                if text:
                    out.write(text)
                    out.flush()
                if newer:
                    tailer = RankTailer(paths, min(newer), ranks, prefix)
                    continue
                if finished:
                    return
            # A plain Event cannot wake the watch: look at it every interval, read only on changes.
            changed = done.is_set() or watch.wait(None if event_driven else interval)
            finished = _settle(done, read_at, interval) if changed else done.is_set()


def _settle(done: threading.Event, read_at: float, interval: float) -> bool:
    """After a change, wait until ``interval`` has passed since the last read (a flood of
    output is read in batches, not per write); True when ``done`` was set meanwhile."""
    left = read_at + interval - time.monotonic()
    return done.wait(left) if left > 0 else done.is_set()


def follow_job(
    paths: JobPaths, attempt: int, ranks: set[int] | None, prefix: bool, emit: Callable[[str], None],
    refresh: Callable[[], tuple[int, bool]], follow: bool, latest: bool, also: Sequence[Path] = (),
    interval: float = 0.2, offsets: dict[int, int] | None = None, order: Sequence[int] = (),
    folds: dict[int, tuple[int, str]] | None = None,
) -> None:
    """``phalanx logs [-f]``: emit an attempt's lines (all of them, then with ``follow`` every
    new one until the job ends). ``refresh()`` returns the job's current attempt and whether it
    has ended; it runs when the logs, the job's directories or the files in ``also`` (the
    store) change, and every :data:`LIVENESS_S` seconds. With ``latest``, a new attempt is
    followed as it starts. ``order`` and ``folds``: see :class:`RankTailer`."""
    tailer = RankTailer(paths, attempt, ranks, prefix=prefix, offsets=offsets, order=order, folds=folds)
    with Watch(fallback=interval) as watch:
        for path in also if follow else ():
            watch.add(path.parent, _named(path.name, prefix=True))  # the store and its -wal file
        read_at = 0.0
        while True:
            if follow:
                tailer.watch(watch)
            current, ended = refresh()
            moved_on = latest and follow and current != tailer.attempt
            read_at = time.monotonic()
            lines = tailer.poll(final=ended or not follow or moved_on)
            if lines:
                emit("".join(tailer.format(r, line) + "\n" for r, line in lines))
            if moved_on:
                emit(f"--- attempt {current} ---\n")
                tailer = RankTailer(paths, current, tailer.ranks, prefix=prefix)
                continue
            if ended or not follow:
                return
            if watch.wait(LIVENESS_S):
                left = read_at + interval - time.monotonic()
                if left > 0:
                    time.sleep(left)  # batch a flood of output; a quiet job never gets here
            else:
                emit("")  # a heartbeat: an ``emit`` whose reader went away raises, and the following ends
