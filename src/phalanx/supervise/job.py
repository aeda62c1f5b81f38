"""A job's life: from RUNNING through its attempts (retries) to a final state in the store.

``JobRun`` owns the job-level decisions; what one attempt does is ``AttemptRun``'s:

- **fail fast**: a node that fails stops the whole job at once (SIGTERM to the other nodes,
  their grace period, then SIGKILL) instead of leaving peers hung in a collective;
- **stall**: with ``stall_timeout``, a job whose ranks print nothing for that long gets every
  rank's Python stacks dumped to its log (SIGUSR2 -> faulthandler), then counts as failed. The
  clock runs only while every node runs: time in a scheduler's queue (or suspended) is not a stall;
- **lost supervisors**: when a scheduler kept an attempt going after its supervisor vanished
  (the job is LOST), a new supervisor (``phalanx resume``) watches that attempt instead of
  starting a second copy (``leftover.py``); an attempt nobody saw end is recorded LOST;
- **retry**: a failed attempt is rerun as a whole (all nodes, fresh rendezvous, same job id,
  ``PHALANX_ATTEMPT`` + 1, same state directory) while retries remain and the failure is
  retryable (``retry.py``). Node agents the backend kept alive run it (torch imported already,
  ``NodeHandle.rerun``); the last attempt's agents are let go (``NodeHandle.release``);
- **stop vs preemption**: ``phalanx stop`` (the store says STOPPING) cancels the job, and so does
  Ctrl-C unless the script, given its SIGINT, ends with 0 (``AttemptRun.stop``, ``outcome.interrupted``);
  SIGTERM/SIGUSR1/SIGHUP from anyone else mean the machine is being taken away: every rank
  gets SIGTERM and the grace period to checkpoint, and the job is recorded PREEMPTED, ready
  for ``phalanx resume``. A second signal kills at once;
- **data**: inputs staged and the state directory pulled before the first attempt, state
  pushed while running and at the end, outputs uploaded at the end (``staging.py``);
- **health** (``guard.py``): progress and ETA, the slow rank, ``--max-duration`` and
  ``--idle-timeout`` (TIMEOUT), divergence (``--on-nan``): stopped, or rolled back to a kept
  version of the state directory and retried (``keeper.py``, ``--keep-states``);
- the **root cause** is the first failure by timestamp across all ranks and nodes (``outcome.py``).

The supervisor is the only writer of a running job's state. It runs in the ``phalanx run``
process for foreground jobs, as ``python -m phalanx.supervise JOB_ID`` for detached ones, and
inside the sweep runner for trials (many ``JobRun``s in one loop).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any, Callable

from ..backends.base import NodeHandle
from ..backends.registry import get_backend
from ..core import disk
from ..core.contracts import OutcomeKind, StopReason
from ..core.paths import HomePaths, write_atomic
from ..core.plan import Plan
from ..core.spec import JobSpec
from ..core.state import JobState
from ..errors import BackendError, NodesUnusable, PhalanxError
from ..launch import trace
from ..launch.console import Console
from ..launch.procs import ChildWatcher, signal_name
from ..secrets.server import for_spec as server_secrets
from ..store import JobRecord, Store, open_store
from . import admission, endings, history, keeper, leaveout, leftover, liveness, relay, staging, tracking
from .attempt import AttemptRun, write_launch_files
from .outcome import Outcome, failed, tail
from .retry import should_retry
from .submit import plan_attempt

Events = Callable[[str], None]
QUEUE_POLL = 0.25  # seconds between looks at the store while a job waits in its queue
QUEUE_MOVE = 5.0  # seconds between a waiting job's own moves of its queue (no server moves it here)


def supervise(store: Store, home: HomePaths, record: JobRecord, plan: Plan, events: Events | None = None,
              console: Console | None = None, output_closed: threading.Event | None = None,
              wait_queued: bool = True, lease_ttl: float | None = None) -> int | None:
    """Run ``plan`` (and its retries) to completion; returns the job's exit code. ``console``:
    the terminal a lone process is lent (a foreground run). ``output_closed``: set when the
    reader of the ranks' streamed output went away; the job then ends as python's broken pipe
    would end it (the ranks are stopped; FAILED, exit 1, never retried: ``outcome.output_closed``).
    A job its project's quota queues is waited for (``wait_queued``), or left to the queue: None
    is returned at once, and a new supervisor is started when the queue admits it
    (``admission.advance``). ``lease_ttl``: a team server's replica started this supervisor, which
    keeps its job's lease itself (``relay.SelfLease``).

    Blocking; main thread only (it handles signals). A stop asked on another machine (``relay``)
    counts as the SIGTERM a stop here sends.
    """
    run = JobRun(store, home, record, plan, events)
    run.backend.console = console
    asked_elsewhere = relay.StopRelay(record.paths.stop_request)
    own_lease = relay.SelfLease(lambda: open_store(home.db), record.id, lease_ttl, liveness.HOST)
    with ChildWatcher() as watcher, own_lease:
        run.start(wait_queued=wait_queued)
        if run.queued is not None and not wait_queued:
            return None
        seen = 0
        closing = False
        while not run.done:
            if output_closed is not None and output_closed.is_set() and not closing:
                closing = True
                run.stop(StopReason.CANCELLED, signal.SIGPIPE)
            if asked_elsewhere.due() is not None:
                watcher.stop_requests.append(signal.SIGTERM)
            if own_lease.taken is not None:
                run.abandon(f"job {record.id} was taken over by replica {own_lease.taken}: this machine lost the "
                            "job store for longer than its lease; ending this copy of its attempt, recording nothing")
                break
            if len(watcher.stop_requests) > seen:
                signum = watcher.stop_requests[seen]
                seen = len(watcher.stop_requests)
                reason = stop_reason(store, record.id, signum)
                run.stop(reason, signum, now=reason is StopReason.CANCELLED and asked_now(record, signum))
            run.tick()
            if not run.done:
                watcher.wait(run.wait_hint())
    assert run.exit_code is not None
    return run.exit_code


def stop_reason(store: Store, job_id: str, signum: int) -> StopReason:
    """A user stop (``phalanx stop`` marks the store first; Ctrl-C is SIGINT) or a preemption."""
    if signum == signal.SIGINT or store.get(job_id).state is JobState.STOPPING:
        return StopReason.CANCELLED
    return StopReason.PREEMPTED


def asked_now(record: JobRecord, signum: int) -> bool:
    """Whether the ``phalanx stop`` behind this signal asked to skip the grace period (``--now``)."""
    from ..core.contracts import read_stop_request
    from ..errors import ContractError

    if signum == signal.SIGINT:
        return False
    try:
        asked = read_stop_request(record.paths.stop_request)
    except ContractError:
        return False
    return asked is not None and asked.now


class JobRun:
    """One job from RUNNING to its final state, advanced by ``tick()``.

    Non-blocking, so one loop can drive many jobs (a sweep's trials); ``supervise`` drives
    one. Must run in the main thread under a ``ChildWatcher`` (child exits wake the loop).
    """

    def __init__(self, store: Store, home: HomePaths, record: JobRecord, plan: Plan, events: Events | None = None) -> None:
        self.store = store
        self.home = home
        self.record = record
        self.plan = plan
        self.say = events or (lambda text: None)
        self.spec = record.spec
        self.backend = get_backend(plan.backend)
        # a job submitted through a team server reads its submitter's secrets there
        self.backend.secret_store = server_secrets(record.spec, store)
        self.paths = record.paths
        self.retries = 0
        # Nodes found bad by earlier attempts (a resumed job keeps avoiding them), and the
        # reruns that leaving out nodes which failed their check cost (no --max-retries retry).
        self.left_out: tuple[str, ...] = history.left_out(self.paths)
        self.reruns = 0
        self.exit_code: int | None = None
        self.outcome: Outcome | None = None
        self.attempt: AttemptRun | None = None
        self._sync: Any = None
        self._reserve: disk.Reserve | None = None
        self.queued: admission.Decision | None = None  # waiting in its project's queue
        self._identity: dict[str, Any] | None = None
        self._moved_at = 0.0  # when this waiting job last moved its queue (``admission.advance``)
        self.ran = 0.0  # seconds the job's nodes have run, over its attempts (--max-duration)
        self.keeper: Any = None  # versions of the state directory (--keep-states)
        self.objective = endings.watched_objective(store, record)

    @property
    def done(self) -> bool:
        return self.exit_code is not None

    def start(self, identity: dict[str, Any] | None = None, wait_queued: bool = True) -> None:
        """Admission first (``admission.py``): the job starts now, or waits QUEUED (``queued``)
        and starts from ``tick`` once admitted; with ``wait_queued`` False nobody waits here."""
        self._identity = identity
        decision = admission.admit(self.store, self.record, (identity or liveness.identity()) if wait_queued else None)
        if decision.never:
            self.store.transition(self.record.id, JobState.FAILED, exit_code=1,
                                  root_cause=json.dumps({"message": f"could not start: {decision.reason}", "exitcode": 1}))
            self.say(f"could not start: {decision.reason}")
            self.exit_code = 1
            return
        if not decision.admitted:
            self.queued = decision
            self.say(f"queued: {decision.reason} (place {decision.place}); it starts by itself when capacity frees")
            self._moved_at = time.monotonic()
            admission.advance(self.store, [self.record.project])  # a share freed unseen: the queue moves now
            return
        self._begin()

    def _begin(self) -> None:
        try:
            self._start(self._identity)
        except Exception as exc:
            if not disk.is_full(exc):
                raise
            self._disk_full(exc)

    def _still_queued(self) -> bool:
        """Whether the job still waits in its queue; once admitted it starts, once ended (stopped
        while queued, its project removed) this run is done."""
        if time.monotonic() - self._moved_at > QUEUE_MOVE:  # holders whose supervisor vanished give back
            self._moved_at = time.monotonic()
            admission.advance(self.store, [self.record.project])
        now = self.store.get(self.record.id)
        if now.state is JobState.QUEUED and now.admitted_at is None:
            return True
        self.queued = None
        if now.state is JobState.QUEUED or now.state is JobState.PENDING:
            self.record = now
            self.say("admitted: starting")
            self._begin()
        else:
            self.exit_code = now.exit_code if now.exit_code is not None else 1
        return False

    def _start(self, identity: dict[str, Any] | None) -> None:
        if not self.store.transition(self.record.id, JobState.RUNNING, attempt=self.plan.attempt, admitted_at=time.time(),
                                     **(identity or liveness.identity())):
            self.exit_code = 1  # stopped before it started
            return
        # One attempt of a job runs at a time: one that a vanished supervisor left running is
        # watched, not started again next to itself.
        left = leftover.find(self.record, self.plan.attempt)
        if left is not None:
            self.say(f"attempt {left.plan.attempt} still runs as {left.where}, started by a supervisor that vanished; "
                     "watching it instead of starting another copy")
            # Its inputs are staged and its state directory is in use: no staging, no pull.
            sync = None if self.backend.remote_data else staging.state_sync(
                self.store, self.home, self.record, self.spec, self.say, pull=False)
        else:
            # inputs first: a failed Outcome when one cannot be staged, so nothing else starts;
            # a platform that brings the inputs and keeps the state itself (remote_data) gets neither
            sync = None if self.backend.remote_data else (
                staging.stage_inputs(self.home, self.spec, self.say)
                or staging.state_sync(self.store, self.home, self.record, self.spec, self.say))
        if isinstance(sync, Outcome):
            self._finish(sync)
            return
        self._sync = sync
        self.keeper = None if not self.spec.keep_states or self.backend.remote_data else keeper.for_job(
            self.home.state_dir(self.spec.state_key), self.paths, self.spec.keep_states, lambda: self.plan.attempt, self.say)
        # Room to record the end if the ranks fill the disk (released in _disk_full)
        self._reserve = disk.Reserve(self.paths.reserve)
        # --track: the exporter starts beside us; the ranks of every attempt get the tracker ids
        # (the user's own -e values win)
        ids = tracking.start(self.paths, self.spec, self.record.id, self.say)
        if ids:
            self.spec = self.spec.with_(env={**ids, **self.spec.env})
        if left is not None:
            self._attach(left)
            return
        if self.paths.attempt(self.plan.attempt).exists():
            # Started before and nothing of it runs now: a new attempt, never one reusing its files.
            self.plan = plan_attempt(self.backend, self._spec(), self.record.id, max(self.paths.attempts()) + 1, self.home)
            self.store.update(self.record.id, attempt=self.plan.attempt)
        elif ids or self.left_out:  # the plan made at submit lacks them (or resumed: the nodes found bad stay out)
            self.plan = plan_attempt(self.backend, self._spec(), self.record.id, self.plan.attempt, self.home)
        history.record_lost(self.paths, self.plan.attempt)  # the history has no gaps
        self._start_attempt()

    def _start_attempt(self, previous: list[NodeHandle] | None = None) -> None:
        """Start ``self.plan``; ``previous``: the ended attempt's handles, for a retry."""
        plan = self.plan
        write_launch_files(plan, self.paths, self.spec.sample_interval)
        started = time.time()
        try:
            handles = self.backend.start(plan, self.paths, previous or ())
        except NodesUnusable as exc:  # hosts that cannot run it: others, where there are spares
            outcome = failed(f"could not start: {exc}", plan.attempt)
            self._rerun_without(leaveout.unusable(self.backend.avoids(self.spec), exc.nodes, self.left_out), outcome, started)
            return
        except BackendError as exc:  # e.g. sbatch refused the job: nothing runs, say why
            outcome = failed(f"could not start: {exc}", plan.attempt)
            history.log_attempt(self.paths, plan.attempt, started, outcome, False, "could not start")
            self._end(outcome)
            return
        trace.mark(self.paths, "supervisor", "started", attempt=plan.attempt)
        self.attempt = AttemptRun(plan, handles, started, self.spec, self.paths, self.say, self.ran, self.objective)

    def _attach(self, left: leftover.Leftover) -> None:
        """Watch an attempt that a vanished supervisor started, from where it is now."""
        self.plan = left.plan
        write_atomic(self.paths.plan, left.plan.to_json())
        self.store.update(self.record.id, attempt=left.plan.attempt)
        # The ranks' metrics are derived from their output: read it all again rather than
        # append to what the vanished supervisor had collected (which would repeat records).
        for rank in self.paths.ranks(left.plan.attempt):
            self.paths.rank_metrics(left.plan.attempt, rank).unlink(missing_ok=True)
        self.attempt = AttemptRun(left.plan, left.handles, left.started, self.spec, self.paths, self.say, self.ran,
                                  self.objective)

    def stop(self, reason: StopReason, signum: int = signal.SIGTERM, now: bool = False) -> None:
        """Stop the current attempt: cancelled, preempted or pruned. A second call, or ``now``
        (``phalanx stop --now``), kills without the grace period. A job still queued is CANCELLED
        at once (nothing of it runs)."""
        if self.queued is not None and not self.done:
            code = 128 + int(signum)
            cause = json.dumps({"message": f"cancelled while queued ({signal_name(code)})", "exitcode": code})
            self.store.transition(self.record.id, JobState.CANCELLED, exit_code=code, root_cause=cause)
            self.queued = None
            self.exit_code = code
            admission.advance(self.store, [self.record.project])
            return
        if self.done or self.attempt is None:
            return
        if reason is StopReason.CANCELLED and self.attempt.stop_reason is None:
            self.store.transition(self.record.id, JobState.STOPPING)
        self.attempt.stop(reason, signum, now)

    def abandon(self, why: str) -> None:
        """Give the job up to the supervisor that took it over (``relay.SelfLease.taken``): the
        attempt's processes are killed at once, and nothing is written to the store."""
        self.say(why)
        if self.attempt is not None:
            for handle in self.attempt.handles:
                handle.kill()
        self.exit_code = 1

    def wait_hint(self) -> float:
        """Seconds the loop may sleep before this run needs a tick (child exits wake it anyway)."""
        if self.queued is not None:
            return QUEUE_POLL
        return self.attempt.wait_hint() if self.attempt is not None else 0.0

    def tick(self) -> None:
        if self.queued is not None and not self.done and self._still_queued():
            return
        if self.done or self.attempt is None:
            return
        try:
            outcome = self.attempt.tick()
            if outcome is not None:
                self._attempt_over(self.attempt, outcome)
        except Exception as exc:
            if not disk.is_full(exc):
                raise
            self._disk_full(exc)

    def _disk_full(self, exc: BaseException) -> None:
        """A write failed for lack of space: stop the ranks (what fills the disk), give back the
        reserve, and record the job FAILED saying what could not be written where. Never leaves
        it RUNNING: if even that cannot be written, the supervisor ends and reads show LOST."""
        full = disk.as_disk_full(exc)
        self.say(str(full))
        if self.exit_code is not None:  # the end is recorded; only its aftermath did not fit
            return
        handles = self.attempt.handles if self.attempt is not None else []
        for h in handles:  # kill() returns once the kill has landed
            try:
                h.kill()
            except Exception as again:  # noqa: BLE001 - its result.json may not fit either
                if not disk.is_full(again):
                    raise
        if self._reserve is not None:
            self._reserve.release()
        if self.keeper is not None:
            self.keeper.stop()
        if self._sync is not None:
            self._sync.stop()
        outcome = failed(full.message, self.plan.attempt)
        self.outcome = outcome
        try:
            if self.attempt is not None:
                history.log_attempt(self.paths, self.plan.attempt, self.attempt.started, outcome, False, "disk full")
            self.exit_code = endings.record_end(self.store, self.record, outcome)
        except Exception as again:  # noqa: BLE001
            if not disk.is_full(again):
                raise
            self.say(f"could not record the job's end either ({again}); it shows as LOST")
            self.exit_code = 1

    def _attempt_over(self, attempt: AttemptRun, outcome: Outcome) -> None:
        plan = attempt.plan
        trace.mark(self.paths, "supervisor", "attempt over", attempt=plan.attempt)
        self.ran = attempt.guard.ran
        results = [r for r in (h.poll() for h in attempt.handles) if r is not None]
        leave = leaveout.decide(self.backend.avoids(self.spec), outcome.cause, results, self.left_out, attempt.failed_first) \
            if outcome.kind is OutcomeKind.FAILED else leaveout.LeaveOut()
        if leave.check_only and leave.names and self.reruns < leaveout.FREE_RERUNS:
            self._rerun_without(leave, outcome, attempt.started, attempt.handles)
            return
        retry, reason = should_retry(self.spec, outcome, self.retries, lambda: "\n".join(
            tail(self.paths.rank_log(plan.attempt, r), 200) for r in self.paths.ranks(plan.attempt)))
        if retry and outcome.kind is OutcomeKind.DIVERGED:
            try:
                reason = self._roll_back(attempt)
            except Exception as exc:  # noqa: BLE001 - never retry on a state that may hold the bad numbers
                retry, reason = False, f"could not roll back: {type(exc).__name__}: {exc}"
        following = self._next_plan(plan.attempt + 1, leave.names) if retry else None  # after a rollback's new args
        if isinstance(following, str) and leave.names:
            # No spare nodes to run on without them: the retry runs where it can (a host that was
            # unreachable for a moment may well be back), saying that they could not be left out.
            kept = self._next_plan(plan.attempt + 1, ())
            if isinstance(kept, Plan):
                self.say(f"{', '.join(leave.names)} could not be left out ({following}); retrying on the same nodes")
                leave = leave.kept(following)
                following = kept
        if isinstance(following, str):
            retry, reason = False, following
        history.log_attempt(self.paths, plan.attempt, attempt.started, outcome, retry, reason, leave.entries)
        endings.attempt_over(self, plan.attempt, outcome, retry, reason)  # a retry's notification
        if retry and isinstance(following, Plan):
            self.retries += 1
            avoiding = f"; leaving out {leave.words()}" if leave.names else ""
            self.say(f"attempt {plan.attempt} {outcome.kind.value} (exit {outcome.exit_code}): {outcome.short()}; "
                     f"retrying ({self.retries}/{self.spec.max_retries}) as attempt {plan.attempt + 1}{avoiding}")
            self.plan = following
            self.store.update(self.record.id, attempt=self.plan.attempt, retries=self.retries)
            self._start_attempt(attempt.handles)
            return
        self._end(outcome)

    def _rerun_without(self, leave: leaveout.LeaveOut, outcome: Outcome, started: float,
                       previous: list[NodeHandle] | None = None) -> None:
        """Nodes failed their check (or could not be used) before any rank ran: run the attempt
        again without them, not counted as a retry; the job fails when no spare nodes are left."""
        attempt = self.plan.attempt
        following = self._next_plan(attempt + 1, leave.names) \
            if leave.names and self.reruns < leaveout.FREE_RERUNS else "no spare nodes to run on instead"
        if isinstance(following, str):
            history.log_attempt(self.paths, attempt, started, outcome, False, following, leave.entries)
            self._end(outcome)
            return
        self.reruns += 1
        history.log_attempt(self.paths, attempt, started, outcome, True, "nodes left out", leave.entries)
        self.say(f"attempt {attempt}: {leave.words()}; running it again as attempt {attempt + 1} without "
                 f"{', '.join(leave.names)}")
        self.plan = following
        self.store.update(self.record.id, attempt=self.plan.attempt)
        self._start_attempt(previous)

    def _spec(self, left_out: tuple[str, ...] | None = None) -> JobSpec:
        """The spec the next attempt is planned from: the job's, with the nodes found bad left out."""
        left_out = self.left_out if left_out is None else left_out
        return self.spec.with_(left_out=left_out) if left_out else self.spec

    def _next_plan(self, attempt: int, leaving: tuple[str, ...]) -> Plan | str:
        """Attempt ``attempt``'s plan with ``leaving`` left out too, or why there can be none
        (too few nodes left: the ssh backend's spare hosts ran out). The nodes count as left out
        only once a plan without them exists."""
        left_out = tuple(dict.fromkeys((*self.left_out, *leaving)))
        try:
            plan = plan_attempt(self.backend, self._spec(left_out), self.record.id, attempt, self.home)
        except PhalanxError as exc:
            return f"cannot plan attempt {attempt}: {exc.message}"
        self.left_out = left_out
        return plan

    def _roll_back(self, attempt: AttemptRun) -> str:
        """After divergence, before the retry: the state of before it, and the arguments
        ``--on-nan-args`` computes. Returns the attempt record's reason."""
        done = ["retrying"]
        if self.keeper is not None:
            done.insert(0, self.keeper.rollback(attempt.guard.anomaly()))
        if self.spec.on_nan_args:
            from dataclasses import replace

            from ..health.anomaly_args import apply

            entry = self.spec.entrypoint
            args = apply(self.spec.on_nan_args, entry.args)
            changed = [a for a in args if a not in entry.args]
            self.spec = self.spec.with_(entrypoint=replace(entry, args=args))
            done.append("with " + " ".join(changed or args))
        return "; ".join(done)

    def _end(self, outcome: Outcome) -> None:
        if self.attempt is not None:
            for handle in self.attempt.handles:  # no attempt follows: kept agents may go
                handle.release()
        if self.keeper is not None:
            self.keeper.stop()
        if self._sync is not None:
            self._sync.stop()
        self._finish(outcome)

    def _finish(self, outcome: Outcome) -> None:
        outcome = staging.upload_outputs(self.spec, self.paths, self.record.id, outcome, self.say)
        self.outcome = outcome
        self.exit_code = endings.record_end(self.store, self.record, outcome)
        if self._reserve is not None:
            self._reserve.release()
        admission.advance(self.store, [self.record.project])  # its share of the quota is free: the queue moves
        endings.job_ended(self, outcome)  # usage, metric summary, notification
