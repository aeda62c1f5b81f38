"""Versions of the state directory taken as the job writes it (``--keep-states K``), and the
rollback to one of them after divergence (``--on-nan retry``).

A thread watches the state directory (inotify where the filesystem raises events, polling
elsewhere). The moment a file there changes, the step the job has printed so far is read from
the end of rank 0's log (``health.progress.last_step``): the step the checkpoint was written at,
not a later one. Once the directory has been quiet for ``QUIET`` seconds (a checkpoint of several
files is written whole), a version is taken (``storage/versions.py``), tagged with that step.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..health.anomaly import Anomaly, pick_version
from ..health.progress import last_step
from ..storage.versions import Versions, listing

if TYPE_CHECKING:
    from ..core.paths import JobPaths

Events = Callable[[str], None]
QUIET = 0.3  # seconds without a change before a version is taken
BUSY = 5.0  # a directory that never falls quiet this long is tried anyway (a changing file aborts the try)
TAIL = 1 << 16  # bytes of rank 0's log searched for the latest step


def step_in_log(path: Path) -> int | None:
    """The last step printed in the log at ``path`` so far."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - TAIL))
            return last_step(fh.read())
    except OSError:
        return None


class Keeper:
    """Keeps versions of ``live`` in ``versions`` while the job runs. ``log()`` is rank 0's log of
    the running attempt, ``attempt()`` its number. ``start``/``stop`` are idempotent."""

    def __init__(self, live: Path, versions: Versions, log: Callable[[], Path], attempt: Callable[[], int],
                 say: Events) -> None:
        self.live, self.versions, self.log, self.attempt, self.say = live, versions, log, attempt, say
        self.taken = 0
        self.cpu_seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # held while a version is taken: a rollback waits for it

    def start(self) -> "Keeper":
        if self._thread is None:
            self.live.mkdir(parents=True, exist_ok=True)
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="phalanx-state-versions", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._wake()
            self._thread.join()
            self._thread = None

    def rollback(self, anomaly: Anomaly | None) -> str:
        """Restore the newest version written before ``anomaly`` (the keeper is stopped meanwhile);
        returns what was done, in words, for the attempt's record."""
        running = self._thread is not None
        self.stop()
        try:
            with self._lock:
                versions = self.versions.list()
                chosen = pick_version(versions, anomaly) if anomaly is not None else (versions[-1] if versions else None)
                if chosen is None:
                    return "no kept state was written before it: retrying from the state as it is"
                aside = self.versions.restore(chosen, self.live)
                self.versions.drop_after(chosen)
                step = chosen.get("step")
                what = f"the state of step {step:,}" if step is not None else "the state the job started with"
                self.say(f"rolled back to {what} (version {chosen['n']}); the state as it was is in {aside}")
                return f"rolled back to {what}"
        finally:
            if running:
                self.start()

    def _take(self, step: int | None, written: float) -> None:
        began = time.thread_time()
        try:
            entry = self.versions.take(self.live, step, written, self.attempt())
        except OSError as exc:  # a full disk: the job matters more than its versions
            self.say(f"warning: could not keep a version of the state directory: {exc}")
            return
        finally:
            self.cpu_seconds += time.thread_time() - began
        if entry is not None:
            self.taken += 1

    def _run(self) -> None:
        try:
            self._keep()
        except Exception as exc:  # noqa: BLE001 - versions are an aid: the job goes on without them
            self.say(f"warning: keeping versions of the state directory stopped: {type(exc).__name__}: {exc}")

    def _keep(self) -> None:
        from ..monitor.filewatch import Watch

        with Watch(fallback=0.25) as watch:
            self._watch = watch
            seen = listing(self.live)
            with self._lock:
                self._take(None, time.time())  # the state the job starts from
            pending: tuple[int | None, float] | None = None
            changed_at = first_change = 0.0
            while not self._stop.is_set():
                for root, dirs, _ in os.walk(self.live):
                    dirs[:] = [d for d in dirs if not d.startswith(".")]
                    watch.add(Path(root), lambda name, is_dir: True)
                watch.wait(QUIET if pending is not None else None)
                if self._stop.is_set():
                    break
                now = listing(self.live)
                if now != seen:
                    # the step the checkpoint belongs to: read at the change, before more is printed
                    if pending is None:
                        first_change = time.monotonic()
                    pending = (step_in_log(self.log()), time.time())
                    seen, changed_at = now, time.monotonic()
                if pending is not None and (time.monotonic() - changed_at >= QUIET or
                                            time.monotonic() - first_change >= BUSY):
                    with self._lock:
                        self._take(*pending)
                    pending = None
            if pending is not None:
                with self._lock:
                    self._take(*pending)

    def _wake(self) -> None:
        watch: Any = getattr(self, "_watch", None)
        if watch is not None:
            watch.wake()


def for_job(live: Path, paths: JobPaths, keep: int, attempt: Callable[[], int], say: Events) -> Keeper:
    """The running keeper of a job's state directory ``live`` (``--keep-states keep``): versions
    under the job's directory, each tagged from rank 0's log of the attempt ``attempt()`` runs."""
    return Keeper(live, Versions(paths.state_versions, keep), lambda: paths.rank_log(attempt(), 0), attempt, say).start()
