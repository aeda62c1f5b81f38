"""The tracker exporter: ``python -m phalanx.supervise.exporter JOB_DIR PID STARTED`` (its supervisor), a process
beside the supervisor that sends a ``--track`` job's metrics, resource samples, parameters and
outcome to its trackers (``track/``), reading only the job's directory.

It is not in the ranks' output path (the supervisor's collector writes ``metrics.bin`` as before)
nor in the supervisor's loop, and runs at a lower priority (nice 10), so a tracker that is slow or
down slows neither. Per tracker a thread
takes the next points from ``monitor/stream.JobStream`` (every attempt of the job in turn: one run,
its steps continuing), sends them, and only then moves the cursor in ``track/<kind>.json``: the
files are the buffer, so nothing is lost when the tracker, this process or the supervisor dies.
A tracker that fails is retried with backoff (1 s doubling to 10 s); ``status`` shows the points
waiting and the last error. At the job's end (``track/ended.json``, written by the supervisor) the
run gets the outcome and root cause and is closed; while a tracker stays down the exporter lingers
``track_linger`` seconds (setting) and then leaves the points on disk for a later exporter (a
``phalanx resume``). One exporter per job at a time (a lock in ``track/``); a second waits for it.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..core.paths import JobPaths, read_json, write_json
from ..core.spec import JobSpec
from ..errors import TrackerRefused, TrackerUnavailable
from ..monitor.stream import JobStream, Record
from ..track.base import Ending, Point
from ..track.conventions import metric_key, read_state
from ..track.registry import make
from .liveness import alive
from .trackinfo import artifact_files, run_info

BATCH = 5000  # points per take: MLflow gets them in requests of 1000
POLL = 0.25  # seconds between looks at the files when everything is sent
BACKOFF_MAX = 10.0
SAVE_EVERY = 1.0


class Worker(threading.Thread):
    """One tracker of the job, from its cursor to the job's end."""

    def __init__(self, kind: str, paths: JobPaths, spec: JobSpec, supervisor: tuple[int, float], linger: float) -> None:
        super().__init__(name=f"phalanx-track-{kind}", daemon=True)
        self.kind, self.paths, self.spec, self.supervisor, self.linger = kind, paths, spec, supervisor, linger
        self.state = read_state(paths, kind)
        self.all_ranks = spec.track_ranks == "all"
        self.stream = JobStream(paths, self.all_ranks, self.state.cursor.get("stream"))
        self.steps: dict[str, int] = dict(self.state.cursor.get("steps") or {})
        self.exporter = make(kind)
        self.saved_at = 0.0

    def save(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.saved_at < SAVE_EVERY:
            return
        self.saved_at = now
        self.state.pid, self.state.updated = os.getpid(), now
        self.state.cursor = {"stream": self.stream.cursor(), "steps": dict(self.steps)}
        try:
            self.state.waiting = self.stream.waiting()
        except OSError:
            pass
        write_json(self.paths.track_state(self.kind), self.state.to_dict())

    def points(self, records: list[Record], steps: dict[str, int]) -> list[Point]:
        """Records as the tracker's points; a value printed without a step, and every resource
        sample, gets the next number of its series (kept in the cursor across attempts)."""
        out: list[Point] = []
        last_sample: tuple[int, int, float] | None = None
        for r in records:
            if r.kind == "m":
                key = metric_key(r.name, r.where, self.all_ranks)
                step = r.step
                if step is None:
                    step = steps.get(key, 0)
                    steps[key] = step + 1
            else:
                key = f"sys/{r.name}" if r.where == 0 else f"sys/node{r.where}/{r.name}"
                sample = (r.attempt, r.where, r.time)
                series = f"sys:{r.where}"
                if sample != last_sample:
                    steps[series] = steps.get(series, -1) + 1
                    last_sample = sample
                step = steps[series]
            out.append(Point(key, r.value, step, r.time))
        return out

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - the exporter never takes anything down with it
            self.state.error = f"exporter failed: {type(exc).__name__}: {exc}"[:400]
            print(f"phalanx: {self.kind}: {self.state.error}", file=sys.stderr, flush=True)
        finally:
            try:
                self.exporter.close()
            except Exception:  # noqa: BLE001
                pass
            self.save(force=True)

    def _run(self) -> None:
        opened = False
        batch: list[Point] | None = None
        backoff = 0.0
        ended_at: float | None = None
        while True:
            ending = self._ending()
            if ending is None and self.state.finished:
                self.state.finished, opened = False, False  # resumed after its end: the same run goes on
            if ending is not None and ended_at is None:
                ended_at = time.monotonic()
            try:
                if not opened:
                    run = run_info(self.paths, self.spec)
                    self.exporter.open(run, self.state)
                    opened = True
                    self.save(force=True)  # the run's id, which the job's start may be waiting for
                    if not self.state.extra.get("params_logged"):
                        self.exporter.params(run)
                        self.state.extra["params_logged"] = True
                        self.save(force=True)
                if batch is None:
                    steps = dict(self.steps)
                    batch = self.points(self.stream.take(BATCH), steps)
                if batch:
                    dropped = self.exporter.send(batch)
                    self._delivered(len(batch) - dropped, dropped, steps)
                    batch, backoff = None, 0.0
                    self.save()
                    continue
                batch = None
                self.stream.commit()  # positions of empty files still move (none taken)
                if ending is not None:
                    if not self.state.finished:
                        self.exporter.finish(ending)
                        if self.spec.track_artifacts:
                            self.exporter.artifacts(artifact_files(self.paths))
                        self.state.finished = True
                    self._clear_error()
                    return
                self.save()
                time.sleep(POLL)
            except TrackerRefused as exc:
                self._failed(str(exc))
                if batch:  # these points will never be taken: count them, go on
                    self._delivered(0, len(batch), steps)
                    batch = None
                elif not opened:
                    backoff = self._wait(backoff)
                elif ending is not None:  # the end or the artifacts: nothing more to do
                    self.state.finished = True
                    return
                else:  # parameters it will not take
                    self.state.extra["params_logged"] = True
            except TrackerUnavailable as exc:
                # The batch (and the stream's positions after it) is kept and sent again as it is.
                self._failed(str(exc))
                if ending is not None and ended_at is not None and time.monotonic() - ended_at > self.linger:
                    return  # the points stay on disk; a later exporter goes on from the cursor
                backoff = self._wait(backoff)

    def _delivered(self, sent: int, dropped: int, steps: dict[str, int]) -> None:
        self.stream.commit()
        self.steps = steps
        self.state.sent += sent
        self.state.dropped += dropped
        if sent:
            self._clear_error()

    def _clear_error(self) -> None:
        if self.state.error:
            self.state.error, self.state.error_since = "", None
            self.save(force=True)

    def _failed(self, message: str) -> None:
        if message != self.state.error:
            print(f"phalanx: {self.kind}: {message}", file=sys.stderr, flush=True)
        self.state.error = message
        self.state.error_since = self.state.error_since or time.time()
        self.save(force=True)

    def _wait(self, backoff: float) -> float:
        backoff = min(BACKOFF_MAX, max(1.0, backoff * 2))
        time.sleep(backoff)
        return backoff

    def _ending(self) -> Ending | None:
        """The job's end as the supervisor wrote it; the supervisor gone without writing it
        counts as an end (LOST) once its files are read."""
        data = read_json(self.paths.track_ended)
        if data:
            return Ending(str(data.get("state") or "FAILED"), data.get("exit_code"), str(data.get("root_cause") or ""),
                          float(data.get("ended") or time.time()))
        if self.supervisor[0] > 0 and not alive(*self.supervisor):
            return Ending("LOST", None, "the supervisor vanished", time.time())
        return None


def main(argv: list[str] | None = None) -> None:
    from .. import config

    args = sys.argv[1:] if argv is None else argv
    paths = JobPaths(Path(args[0]))
    supervisor = (int(args[1]), float(args[2])) if len(args) > 2 else (0, 0.0)  # its pid and start time
    try:
        os.nice(10)  # background work: the job's own processes come first on a busy machine
    except OSError:
        pass
    paths.track.mkdir(parents=True, exist_ok=True)
    with open(paths.track_lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # an earlier exporter of the job finishes first
        spec = JobSpec.from_dict(read_json(paths.spec))
        linger = float(config.get("track_linger"))
        workers = [Worker(kind, paths, spec, supervisor, linger) for kind in spec.track]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # tracker clients' own threads (W&B's) must not keep the process


def state_json(paths: JobPaths, kind: str) -> dict[str, Any]:
    """The state file as ``json`` (for tests and ``status --json``)."""
    return json.loads(paths.track_state(kind).read_text()) if paths.track_state(kind).exists() else {}


if __name__ == "__main__":
    main()
