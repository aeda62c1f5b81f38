"""One attempt's nodes as the supervisor drives them: start (or re-attach), fail fast, stall,
stop with the grace period, kill; and the launch files every node agent reads."""

from __future__ import annotations

import signal
import time
from typing import Callable

from ..backends.base import NodeHandle
from ..core.contracts import LaunchFile, StopReason, write_launch
from ..core.paths import JobPaths, write_atomic
from ..core.plan import Plan
from ..core.spec import JobSpec
from .guard import Guard, Verdict
from .outcome import Outcome, decide
from ..monitor.report import stray_lines
from .observers import Watch, dump_stacks, end_left_strays, end_stragglers

Events = Callable[[str], None]

# After a Ctrl-C, the seconds between the SIGTERM that escalates it and SIGKILL.
ESCALATE_S = 5.0


def write_launch_files(plan: Plan, paths: JobPaths, sample_interval: float = 5.0) -> None:
    """``plan.json`` and every node's ``launch.json``: what ``Backend.start`` starts from. The
    job directory in a launch file is where the node sees it (``PHALANX_JOB_DIR`` of its plan)."""
    write_atomic(paths.plan, plan.to_json())
    for node in plan.nodes:
        launch = LaunchFile(node, node.env.get("PHALANX_JOB_DIR", str(paths.root)), plan.attempt, plan.grace, sample_interval)
        write_launch(paths.node_launch(plan.attempt, node.node_rank), launch)


class AttemptRun:
    """Non-blocking: ``tick`` until it returns the outcome. Main thread, under a ChildWatcher."""

    def __init__(self, plan: Plan, handles: list[NodeHandle], started: float, spec: JobSpec, paths: JobPaths,
                 say: Events, ran_before: float = 0.0, objective: str | None = None) -> None:
        self.plan, self.handles, self.started, self.spec, self.paths = plan, handles, started, spec, paths
        self.say = say
        # progress, divergence, --max-duration/--idle-timeout, stragglers (ran_before: earlier attempts' run time)
        self.guard = Guard(spec, paths, plan.attempt, say, ran_before, objective)
        self.verdict: Verdict | None = None
        self.watch = Watch(paths, plan.attempt, spec, handles, say, self.guard)
        self.margin = max(h.kill_margin for h in handles)
        self.stop_reason: StopReason | None = None
        self.stop_signal: int = signal.SIGTERM
        self.stalled_for: float | None = None
        self.kill_at: float | None = None
        self.escalated_at: float | None = None  # after a Ctrl-C: when SIGTERM followed the SIGINT
        # Nodes that had failed when the supervisor stopped the rest (fail fast): only they say
        # whether the attempt was taken by a scheduler; the others got the supervisor's SIGTERM.
        self.failed_first: list[int] | None = None

    def stop(self, reason: StopReason, signum: int = signal.SIGTERM, now: bool = False) -> None:
        """Every node gets ``signum`` (SIGINT stays SIGINT, anything else is SIGTERM) and the
        grace period (none with ``now``: SIGKILL follows); a second call kills at once.

        SIGINT is a person's Ctrl-C and is python's Ctrl-C: the ranks get that one SIGINT (their
        ``except KeyboardInterrupt:`` runs) and the grace period to end as they choose; the
        second Ctrl-C (or the grace running out) escalates: SIGTERM, then SIGKILL after
        :data:`ESCALATE_S` (a third Ctrl-C: at once). The outcome is then the script's
        (``outcome.decide``)."""
        if self.stop_reason is not None:
            if self.stop_signal == signal.SIGINT and self.escalated_at is None:
                self._escalate()
                return
            if self.stop_signal == signal.SIGINT:
                self.say("SIGKILL sent to every rank")
            self.kill_at = time.monotonic()  # asked again: no more grace
            return
        self.stop_reason, self.stop_signal = reason, signum
        for h in self.handles:
            h.signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
        self.kill_at = time.monotonic() + (0.0 if now else self.plan.grace + self.margin)
        if now:
            self.say("stopping now: SIGKILL follows SIGTERM without the grace period")
        elif signum == signal.SIGINT:
            self.say(f"interrupted: SIGINT sent to every rank; waiting up to {self.plan.grace:g}s for them to end "
                     "(Ctrl-C again: SIGTERM, then SIGKILL)")

    def _escalate(self) -> None:
        """After a Ctrl-C: SIGTERM to every node now, SIGKILL a moment later."""
        self.escalated_at = time.monotonic()
        for h in self.handles:
            h.signal(signal.SIGTERM)
        self.kill_at = self.escalated_at + ESCALATE_S + self.margin
        self.say(f"SIGTERM sent to every rank; SIGKILL in {ESCALATE_S + self.margin:g}s (Ctrl-C again: now)")

    def wait_hint(self) -> float:
        hints = [h for h in (handle.wait_hint() for handle in self.handles) if h is not None]
        if self.kill_at is not None:
            hints.append(self.kill_at - time.monotonic())
        return max(0.0, min([Watch.EVERY, *hints]))

    def tick(self) -> Outcome | None:
        """Advance; the outcome once every node has ended (metrics collected, samplers stopped)."""
        results = [h.poll() for h in self.handles]
        if self.watch.due():
            self.watch.collect()
        if all(r is not None for r in results):
            end_stragglers(self.paths, self.plan.attempt)  # no rank outlives the attempt it belongs to
            ended = end_left_strays(self.paths, self.plan.attempt, self.plan.job_id, [r for r in results if r is not None])
            for line in stray_lines([s for r in ended for s in r.strays]):
                self.say(line)
            self.watch.collect(final=True)
            self.watch.close()
            self.guard.write()
            outcome = decide(self.paths, self.plan.attempt, ended, self.stop_reason,
                             self.stop_signal, self.stalled_for, self.spec.stall_timeout, self.failed_first)
            if self.verdict is not None and self.stop_reason is self.verdict.reason:
                outcome = Outcome(outcome.kind, self.verdict.exit_code, {**self.verdict.cause, "attempt": self.plan.attempt})
            return outcome
        if self.kill_at is None and any(r is not None and r.exitcode != 0 for r in results):
            self.failed_first = [n for n, r in enumerate(results) if r is not None and r.exitcode != 0]
            self._stop_all()  # fail fast: the rest of the job stops now
        if self.kill_at is None:
            verdict = self.guard.check(all(h.running() for h in self.handles), self.watch.collector.last_activity)
            if verdict is not None:
                self.verdict = verdict
                self.stop(verdict.reason)
        if self.spec.stall_timeout and self.kill_at is None:
            silent = self.watch.silent_for()
            if silent > self.spec.stall_timeout:
                self.stalled_for = silent
                dump_stacks(self.paths, self.plan.attempt)
                self._stop_all()
        if self.kill_at is not None and time.monotonic() >= self.kill_at:
            if self.stop_signal == signal.SIGINT and self.escalated_at is None:
                self._escalate()  # the grace after a Ctrl-C is over: SIGTERM first, as for a stop
                return None
            for h in self.handles:
                h.kill()
        return None

    def _stop_all(self) -> None:
        for h in self.handles:
            h.signal(signal.SIGTERM)
        self.kill_at = time.monotonic() + self.plan.grace + self.margin
