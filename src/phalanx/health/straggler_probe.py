"""Where each rank's main thread spends its time, sampled from ``/proc``: the evidence that names
the slow rank when only rank 0 prints (``straggler.py`` judges it).

In data-parallel training every step ends in a collective (DDP's gradient all_reduce, a
barrier): the ranks that finish their share of the step first wait in it, asleep, for the one
that has not. So a rank whose main thread is runnable (``R``) most of the time while the others'
sleep (``S``) is the one the others wait for. Reading one line of ``/proc/PID/stat`` per rank a
few times a second tells that apart at a cost of microseconds, needs no permission beyond
reading ``/proc`` (same as ``ps``) and no code in the script. The counts go into each resource
sample (``monitor/resources.py``), so they travel with the node's files from any backend.

``wait_site`` names *where* the waiting ranks wait (``all_reduce``, DDP's ``backward``) from one
``py-spy dump`` of them, when py-spy is installed; it is asked once, when a straggler is found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from typing import Callable

HZ = 5.0  # probes per second: 60-100 per rank in a 15-20 s window, a few microseconds each
PIDS_EVERY = 2.0  # seconds between re-reads of the ranks' pids (ranks start late, restart)

# /proc/PID/stat states: R running or runnable (it has work: computing, or queued for a core);
# S asleep (a futex in a collective, a socket, a queue); D uninterruptible (disk I/O).
_BUSY, _WAITING, _IO = b"R", b"S", b"D"


def thread_state(pid: int) -> bytes | None:
    """The state letter of ``pid``'s main thread (the thread group leader), or None if gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 512)
    except OSError:
        return None
    finally:
        os.close(fd)
    end = data.rfind(b")")  # the command name in parentheses may hold spaces and parentheses
    return data[end + 2:end + 3] if end > 0 else None


class StateProbe:
    """Counts, per rank, how often its main thread was busy, waiting or in I/O, in a daemon thread.

    ``pids()`` maps rank -> pid (called every few seconds). ``take()`` returns the counts since
    the last ``take`` ({rank: {"busy": n, "waiting": n, "io": n, "probes": n}}) and starts over.
    ``start``/``stop`` are idempotent; ``stop`` blocks until the thread has ended.
    """

    def __init__(self, pids: Callable[[], dict[int, int]], hz: float = HZ) -> None:
        self.pids = pids
        self.every = 1.0 / max(0.1, float(hz))
        self.cpu_seconds = 0.0  # CPU time of the probing thread (the overhead)
        self._counts: dict[int, list[int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "StateProbe":
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="phalanx-rank-states", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def take(self) -> dict[int, dict[str, int]]:
        with self._lock:
            counts, self._counts = self._counts, {}
        return {rank: {"busy": c[0], "waiting": c[1], "io": c[2], "probes": c[3]} for rank, c in counts.items()}

    def probe(self, ranks: dict[int, int]) -> None:
        """One probe of every rank in ``ranks`` (rank -> pid)."""
        for rank, pid in ranks.items():
            state = thread_state(pid)
            if state is None or state == b"Z":
                continue  # gone, or ended and not yet reaped: nothing to say about its steps
            with self._lock:
                c = self._counts.setdefault(rank, [0, 0, 0, 0])
                if state == _BUSY:
                    c[0] += 1
                elif state == _WAITING:
                    c[1] += 1
                elif state == _IO:
                    c[2] += 1
                c[3] += 1

    def _loop(self) -> None:
        ranks: dict[int, int] = {}
        refreshed = 0.0
        while not self._stop.wait(self.every):
            began = time.thread_time()
            now = time.monotonic()
            if now - refreshed >= PIDS_EVERY:
                try:
                    ranks = dict(self.pids())
                except Exception:  # noqa: BLE001 - a half-written proc.json: the old map serves
                    pass
                refreshed = now
            self.probe(ranks)
            self.cpu_seconds += time.thread_time() - began


# -- where the others wait ---------------------------------------------------------------------------

# Functions of torch.distributed a rank blocks in while it waits for its peers.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "all_to_all", "all_to_all_single", "broadcast", "barrier", "monitored_barrier", "reduce", "gather",
               "scatter", "recv", "send", "wait")


def wait_site(pids: list[int], timeout: float = 5.0) -> str | None:
    """Where the waiting ranks (``pids``) wait, in words, from one ``py-spy dump`` each: the
    collective they are in (``all_reduce``), or ``backward (DDP's gradient all_reduce)``; None
    when py-spy is not installed or says nothing useful."""
    spy = shutil.which("py-spy") or _beside_python("py-spy")
    if spy is None:
        return None
    found: dict[str, int] = {}
    for pid in pids:
        try:
            done = subprocess.run([spy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True,
                                  timeout=timeout)
        except (OSError, subprocess.SubprocessError):
            continue
        site = site_of(done.stdout)
        if site:
            found[site] = found.get(site, 0) + 1
    return max(found, key=lambda s: found[s]) if found else None


def site_of(dump: str) -> str | None:
    """The wait site in one ``py-spy dump`` text (its main thread's innermost known frame)."""
    frames: list[str] = []
    in_main = False
    for line in dump.splitlines():
        if line.startswith("Thread "):
            in_main = '"MainThread"' in line
            continue
        if in_main and line.startswith("    "):
            frames.append(line.strip())
    for frame in frames:  # innermost first
        name, _, where = frame.partition(" (")
        function = name.rsplit(".", 1)[-1]
        if "torch/distributed" in where and function in COLLECTIVES:
            return function
        if function == "_engine_run_backward" or (function == "backward" and "torch/" in where):
            return "backward (DDP's gradient all_reduce)"
    return None


def _beside_python(name: str) -> str | None:
    """A console script installed next to this interpreter (a virtual environment's bin/)."""
    import sys

    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.access(path, os.X_OK) else None
