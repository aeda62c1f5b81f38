"""Following a job that runs detached as a foreground run shows it: every rank's output as it is
written (``monitor/tail.follow_attempts``: partial lines, a ``[rank]`` prefix when there are
several, each retry's attempt in turn), the supervisor's own lines (``phalanx: attempt 0 failed
...; retrying``, from its ``supervisor.log``) as events, until the job ends. What a team server
streams to the client of a foreground ``phalanx run``, whose job it started detached so that it
survives a restart of the server. A view: reads the store and the files, writes nothing.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, TextIO

from ..core.state import is_terminal
from ..monitor.tail import Stop, follow_attempts
from ..store import JobRecord, Store
from ..supervise.liveness import effective

PREFIX = "phalanx: "


def follow_run(store: Store, record: JobRecord, out: TextIO, ranks: set[int] | None, events: Callable[[str], None],
               log_from: int = 0, interval: float = 0.1) -> JobRecord:
    """Stream ``record``'s attempts (from its current one) to ``out`` and its supervisor's lines
    after byte ``log_from`` of ``supervisor.log`` to ``events`` until the job ends; returns its
    final record. Blocking. An exception from ``out`` or ``events`` (the reader went away) ends
    the following, not the job."""
    done = Stop()
    quit_ = threading.Event()
    final: list[JobRecord] = [record]
    failure: list[BaseException] = []

    def watch() -> None:
        log = Lines(record.paths.supervisor_log, log_from)
        try:
            while not quit_.is_set():
                for line in log.new():
                    if line.startswith(PREFIX):
                        events(line[len(PREFIX):])
                current = effective(store.get(record.id))
                if is_terminal(current.state):
                    for line in log.new():
                        if line.startswith(PREFIX):
                            events(line[len(PREFIX):])
                    final[0] = current
                    return
                out.write("")  # a heartbeat: an ``out`` whose reader went away raises, and the following ends
                quit_.wait(interval)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            failure.append(exc)
        finally:
            done.set()

    watcher = threading.Thread(target=watch, name=f"phalanx-follow-{record.id}", daemon=True)
    watcher.start()
    try:
        prefix = record.nnodes * record.nproc_per_node > 1
        follow_attempts(record.paths, record.attempt, ranks, prefix, out, done)
    finally:
        quit_.set()
        watcher.join()
    if failure:
        raise failure[0]
    return final[0]


class Lines:
    """Complete lines appended to a file since an offset."""

    def __init__(self, path: Path, offset: int) -> None:
        self.path, self.offset, self.rest = path, offset, b""

    def new(self) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        return [line.decode(errors="replace") for line in lines]


def log_size(path: Path) -> int:
    """Where new lines of a log will start (0 when it does not exist yet)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0

