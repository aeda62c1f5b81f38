"""Trials of one sweep that write the same file: found while they run, said once per file.

Trials run side by side in the directory the sweep was typed in (as the script would run there),
so a script writing ``out/model.pt`` has every trial write that one file. Every second the runner
looks at the files the running trials' processes hold open for writing (``/proc/PID/fd`` and the
flags in ``fdinfo``; this machine's trials only): a file two trials write, at once or one after
the other while both ran, is a collision. Its warning says how to keep trials apart:
``{trial}`` in the script's arguments (``--output_dir out/{trial}``).

Cheap: a few ``readlink`` calls per process and second. A file a trial opens and closes between
two looks goes unseen; checkpoints and logs, written over seconds, are seen.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterable

EVERY = 1.0  # seconds between looks
_WRITING = os.O_WRONLY | os.O_RDWR


class Collisions:
    """What each running trial writes, and which files two of them wrote (each said once)."""

    def __init__(self, say: Callable[[str], None], every: float = EVERY) -> None:
        self.say = say
        self.every = every
        self.looked = 0.0
        self.writers: dict[str, set[int]] = {}  # path -> trials seen writing it while running together
        self.said: set[str] = set()

    def look(self, running: dict[int, Iterable[int]], now: float | None = None) -> list[str]:
        """``running``: trial number -> its processes' pids (this machine's). Returns the new
        collisions' paths (and says each); at most once every ``every`` seconds."""
        now = time.monotonic() if now is None else now
        if now - self.looked < self.every or len(running) < 2:
            return []
        self.looked = now
        live = set(running)
        for path, trials in list(self.writers.items()):  # a trial that ended no longer collides with new ones
            trials &= live
            if not trials:
                del self.writers[path]
        found = []
        for trial, pids in running.items():
            for path in {p for pid in pids for p in written(pid)}:
                trials = self.writers.setdefault(path, set())
                trials.add(trial)
                if len(trials) > 1 and path not in self.said:
                    self.said.add(path)
                    found.append(path)
                    listed = ", ".join(str(t) for t in sorted(trials))
                    self.say(f"warning: trials {listed} of this sweep write the same file {path}; give each trial "
                             "a place of its own, e.g. --output_dir out/{trial} ({trial}, {job_id}, {output_dir} "
                             "are filled in per trial)")
        return found


def written(pid: int) -> list[str]:
    """The regular files process ``pid`` holds open for writing (none when it is gone)."""
    fd_dir = Path(f"/proc/{pid}/fd")
    out = []
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return []
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
            if not target.startswith("/") or target.startswith("/dev/") or target.endswith(" (deleted)"):
                continue
            with open(f"/proc/{pid}/fdinfo/{name}") as info:
                flags = next((int(line.split()[1], 8) for line in info if line.startswith("flags:")), 0)
        except (OSError, ValueError, StopIteration):
            continue
        if flags & _WRITING and os.path.isfile(target):
            out.append(target)
    return out
