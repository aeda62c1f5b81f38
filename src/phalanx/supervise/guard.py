"""One attempt's health, as its supervisor watches it (the ``health`` package judges, this acts):

- **progress and ETA** from the ranks' output, as the metrics collector reads it (the guard is
  the collector's ``observer``);
- **divergence** (``--on-nan``, ``--on-spike``): a watched metric printed as nan/inf, or jumping:
  the attempt is stopped at once (SIGTERM, the grace period) and ends *diverged*;
- **stops that save money**: ``--max-duration`` (time the job ran, over all its attempts; queue
  time not counted) and ``--idle-timeout`` (GPUs, or CPUs and output, idle): the attempt ends
  with the outcome *timeout*;
- **the slow rank**: every few seconds the recent resource samples are judged
  (``health/straggler.py``); a straggler is said once, with where the others wait (py-spy, for
  ranks on this machine).

Everything it finds goes to ``health.json`` (``health/progress_file.py``), which ``status``,
``ps`` and the dashboard read.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..core.contracts import StopReason
from ..core.paths import JobPaths, read_json
from ..core.spec import JobSpec
from ..health import idle, progress_file
from ..health.anomaly import Anomaly, AnomalyWatch, rules_of
from ..health.progress import ProgressTracker, epochs_from_args, human
from ..health.straggler import Straggler

Events = Callable[[str], None]
WRITE_EVERY = 1.0  # seconds between writes of health.json while things change
STRAGGLER_EVERY = 5.0  # seconds between judgements of the resource samples
TIMEOUT_EXIT = 124  # as timeout(1) and a stall


@dataclass(frozen=True)
class Verdict:
    """Why the guard stopped the attempt, and the outcome's cause."""

    reason: StopReason
    exit_code: int
    cause: dict[str, Any]


class Guard:
    """Health of one attempt. ``check`` once per tick of the attempt (main thread); ``output`` and
    ``values`` from the metrics collector (the same thread: the watch polls it there)."""

    def __init__(self, spec: JobSpec, paths: JobPaths, attempt: int, say: Events, ran_before: float = 0.0,
                 objective: str | None = None) -> None:
        self.spec, self.paths, self.attempt, self.say = spec, paths, attempt, say
        self.tracker = ProgressTracker(spec.progress, epochs_from_args(spec.entrypoint.args), attempt)
        self.watch = AnomalyWatch(rules_of(spec, objective))
        self.ran = ran_before  # seconds the job's nodes ran, this attempt included as it goes
        self.verdict: Verdict | None = None
        self.errors = 0
        self.straggler: Straggler | None = None
        self.gpus = False
        self.last_busy = time.time()
        self._ticked = time.monotonic()
        self._judged = 0.0
        self._sampled = 0.0
        self._seen: dict[int, float] = {}  # node -> time of the newest sample read
        self._written = 0.0
        self._dirty = True
        self._said: set[tuple[int, ...]] = set()
        earlier = progress_file.read(paths.health)
        self._carried = earlier.progress  # an earlier attempt's progress until this one prints its own

    # -- the metrics collector's observer --------------------------------------------------------------

    def output(self, rank: int, text: str, now: float) -> None:
        try:
            if self.tracker.feed(rank, text, now):
                self._dirty = True
        except Exception as exc:  # noqa: BLE001 - a judge's slip must never take the supervisor down
            self._slipped("reading progress", exc)

    def values(self, rank: int, block: dict[str, Any], nonfinite: list[Any], now: float) -> None:
        try:
            if self.watch.found is None and (self.watch.nonfinite(nonfinite, now) or self.watch.values(rank, block, now)):
                self._dirty = True
        except Exception as exc:  # noqa: BLE001
            self._slipped("watching the metrics", exc)

    def _slipped(self, doing: str, exc: Exception) -> None:
        """Health is an aid: a failure in it is one warning (the first), never the job's end."""
        self.errors += 1
        if self.errors == 1:
            self.say(f"warning: {doing} failed: {type(exc).__name__}: {exc}")

    # -- each tick --------------------------------------------------------------------------------------

    def check(self, running: bool, last_output: float) -> Verdict | None:
        """The verdict that stops the attempt now, if any (given once)."""
        now, mono = time.time(), time.monotonic()
        if running:
            self.ran += mono - self._ticked
        else:
            self.last_busy = now  # queued or suspended: nothing could run
        self._ticked = mono
        verdict = None
        if self.verdict is None:
            verdict = self._diverged() or self._over_time() or self._idle(now, last_output)
            if verdict is not None:
                self.verdict = verdict
                self._dirty = True
                self.say(f"{verdict.cause['message']}: stopping the job")
        if mono - self._judged >= STRAGGLER_EVERY:
            self._judged = mono
            try:
                self._judge_stragglers()
            except Exception as exc:  # noqa: BLE001
                self._slipped("judging the ranks' pace", exc)
        if self._dirty and mono - self._written >= WRITE_EVERY:
            self.write(now)
        return verdict

    def _diverged(self) -> Verdict | None:
        anomaly = self.watch.found
        if anomaly is None:
            return None
        return Verdict(StopReason.DIVERGED, 1, {"exitcode": 1, "message": anomaly.message(), "anomaly": anomaly.to_dict(),
                                                "action": self.watch.rules.action})

    def _over_time(self) -> Verdict | None:
        limit = self.spec.max_duration
        if limit is None or self.ran < limit:
            return None
        return Verdict(StopReason.TIMEOUT, TIMEOUT_EXIT, {
            "exitcode": TIMEOUT_EXIT, "limit": "max_duration",
            "message": f"ran for {human(self.ran)}: --max-duration {human(limit)} reached"})

    def _idle(self, now: float, last_output: float) -> Verdict | None:
        limit = self.spec.idle_timeout
        if limit is None:
            return None
        if now - self._sampled >= min(self.spec.sample_interval, 5.0) / 2:
            self._sampled = now
            try:
                self._read_samples()
            except Exception as exc:  # noqa: BLE001
                self._slipped("reading the resource samples", exc)
        if not self.gpus:
            self.last_busy = max(self.last_busy, last_output)
        idle_for = now - self.last_busy
        if idle_for < limit:
            return None
        return Verdict(StopReason.TIMEOUT, TIMEOUT_EXIT, {"exitcode": TIMEOUT_EXIT, "limit": "idle_timeout",
                                                          "message": idle.reason(idle_for, self.gpus)})

    def _read_samples(self) -> None:
        recent = _recent_resources()
        if recent is None:
            return
        for sample in recent(self.paths, self.attempt, 1 << 14):
            node, at = int(sample.get("node_rank", 0)), float(sample.get("time", 0.0))
            if at <= self._seen.get(node, 0.0):
                continue
            self._seen[node] = at
            self.gpus = self.gpus or idle.has_gpus(sample)
            if idle.busy(sample) is not False:
                self.last_busy = max(self.last_busy, at)

    def _judge_stragglers(self) -> None:
        from ..health.straggler import find
        from ..monitor.report import recent_metrics

        recent = _recent_resources()
        if self.spec.resources.world_size < 2 or recent is None:
            return
        found = find(recent(self.paths, self.attempt), recent_metrics(self.paths, self.attempt))
        if found is not None and self.straggler is not None and found.ranks == self.straggler.ranks:
            found = _with_where(found, self.straggler.where)
        elif found is not None:
            found = _with_where(found, _wait_site(self.paths, self.attempt, found.ranks))
        if found != self.straggler:
            self.straggler = found
            self._dirty = True
            if found is not None and found.ranks not in self._said:
                self._said.add(found.ranks)
                self.say(f"warning: {found.message()}")

    # -- health.json ------------------------------------------------------------------------------------

    def limits(self, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.spec.max_duration is not None:
            out.update(max_duration=self.spec.max_duration, ran=round(self.ran, 1))
        if self.spec.idle_timeout is not None:
            out.update(idle_timeout=self.spec.idle_timeout, idle_for=round(max(0.0, now - self.last_busy), 1))
        return out

    def write(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        estimate = self.tracker.estimate(now) or self._carried
        health = progress_file.Health(self.attempt, now, estimate, self.straggler, self.watch.found, self.limits(now))
        try:
            progress_file.write(self.paths.health, health)
        except OSError as exc:  # health is an aid; a full disk is the job's own business
            self.say(f"warning: could not write {self.paths.health}: {exc}")
        self._written, self._dirty = time.monotonic(), False

    def anomaly(self) -> Anomaly | None:
        return self.watch.found


def _recent_resources() -> Callable[..., list[dict[str, Any]]] | None:
    """``monitor.resources.recent_resources``; None where psutil is missing (a Kubernetes
    supervisor pod): no samples are read there, and no straggler or idle job is judged."""
    try:
        from ..monitor.resources import recent_resources
    except ImportError:
        return None
    return recent_resources


def _with_where(found: Straggler, where: str | None) -> Straggler:
    from dataclasses import replace

    return replace(found, where=where) if where and not found.where else found


def _wait_site(paths: JobPaths, attempt: int, slow: tuple[int, ...]) -> str | None:
    """Where the ranks that wait for ``slow`` wait: a py-spy dump of up to three of them, when they
    run on this machine."""
    from ..health.straggler_probe import wait_site

    here = {socket.gethostname(), os.uname().nodename}
    pids = []
    for rank in paths.ranks(attempt):
        proc = read_json(paths.rank_proc(attempt, rank)) or {}
        if rank not in slow and proc.get("pid") and proc.get("host") in here:
            pids.append(int(proc["pid"]))
    return wait_site(pids[:3]) if pids else None
