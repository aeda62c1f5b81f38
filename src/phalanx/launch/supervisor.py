"""The supervisor: runs one job from its plan to a final state in the store.

It starts every node agent through the backend, then watches them (signal-driven, no
busy loop) and owns the job-level decisions:

- **fail fast**: a node that fails stops the whole job at once (SIGTERM to the other nodes,
  their grace period, then SIGKILL) instead of leaving peers hung in a collective;
- **stall**: with ``stall_timeout``, a job whose ranks print nothing for that long gets every
  rank's Python stacks dumped to its log (SIGUSR2 -> faulthandler), then counts as failed. The
  clock runs only while every node runs: time in a scheduler's queue (or suspended) is not a stall;
- **lost supervisors**: when a scheduler kept an attempt going after its supervisor vanished
  (the job is LOST), a new supervisor (``phalanx resume``) watches that attempt instead of
  starting a second copy, and ``phalanx stop`` stops it (``stop_leftover``);
- **retry**: a failed attempt is rerun as a whole (all nodes, fresh rendezvous, same job id,
  ``PHALANX_ATTEMPT`` + 1, same state directory) while retries remain and the failure is
  retryable (``no_retry_on`` patterns, ``retry_on_exit_codes``);
- **stop vs preemption**: ``phalanx stop`` (the store says STOPPING) and Ctrl-C cancel the job;
  SIGTERM/SIGUSR1/SIGHUP from anyone else mean the machine is being taken away: every rank
  gets SIGTERM and the grace period to checkpoint, and the job is recorded PREEMPTED, ready
  for ``phalanx resume``. A second signal kills at once;
- **state**: with ``state_uri``, the state directory is pulled before the first attempt,
  pushed periodically while running and once more at the end;
- the **root cause** is the first failure by timestamp across all ranks and nodes.

Runs in the ``phalanx run`` process for foreground jobs, and as
``python -m phalanx.launch.supervisor JOB_ID`` (its own session) for detached ones.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import endings
from ..core.paths import HomePaths, JobPaths, read_json, write_atomic, write_json
from ..core.spec import JobSpec
from ..core.state import JobState
from ..monitor import logindex
from ..store import JobRecord, Store
from .plan import NodePlan, Plan
from .procs import ChildWatcher, signal_name

LOG_TAIL_LINES = 20
Events = Callable[[str], None]


@dataclass
class Outcome:
    kind: str  # succeeded | failed | stalled | cancelled | preempted | pruned
    exit_code: int
    cause: dict[str, Any] | None = None


def write_launch_files(plan: Plan, paths: JobPaths, sample_interval: float = 5.0) -> None:
    write_atomic(paths.plan, plan.to_json())
    for node in plan.nodes:
        write_json(
            paths.node_launch(plan.attempt, node.node_rank),
            {"node": node.to_dict(), "job_dir": str(paths.root), "attempt": plan.attempt, "grace": plan.grace,
             "sample_interval": sample_interval},
        )


def supervise(store: Store, home: HomePaths, record: JobRecord, plan: Plan, events: Events | None = None) -> int:
    """Run ``plan`` (and its retries) to completion; returns the job's exit code.

    Blocking; main thread only (it handles signals).
    """
    run = JobRun(store, home, record, plan, events)
    with ChildWatcher() as watcher:
        run.start()
        seen = 0
        while not run.done:
            if len(watcher.stop_requests) > seen:
                signum = watcher.stop_requests[seen]
                seen = len(watcher.stop_requests)
                run.stop(_stop_kind(store, record.id, signum), signum)
            run.tick()
            if not run.done:
                watcher.wait(run.wait_hint())
    assert run.exit_code is not None
    return run.exit_code


class JobRun:
    """One job from RUNNING to its final state, advanced by ``tick()``.

    Non-blocking, so one loop can drive many jobs (a sweep's trials); ``supervise`` drives
    one. Must run in the main thread under a ``ChildWatcher`` (child exits wake the loop).
    """

    METRICS_EVERY = 1.0  # seconds between reads of the ranks' output for metrics

    def __init__(self, store: Store, home: HomePaths, record: JobRecord, plan: Plan, events: Events | None = None) -> None:
        from ..backends.registry import get_backend

        self.store = store
        self.home = home
        self.record = record
        self.plan = plan
        self.say = events or (lambda text: None)
        self.spec = JobSpec.from_dict(json.loads(record.spec_json))
        self.backend = get_backend(plan.backend)
        self.paths = JobPaths(Path(record.job_dir))
        self.retries = 0
        self.exit_code: int | None = None
        self.outcome: Outcome | None = None
        self._sync: Any = None
        self._handles: list[Any] = []
        self._samplers: list[Any] = []
        self._collector: Any = None

    @property
    def done(self) -> bool:
        return self.exit_code is not None

    def start(self, identity: dict[str, Any] | None = None) -> None:
        if not self.store.transition(self.record.id, JobState.RUNNING, attempt=self.plan.attempt,
                                     **(identity or _self_identity())):
            self.exit_code = 1  # stopped before it started
            return
        # One attempt of a job runs at a time: one that a vanished supervisor left running is
        # watched, not started again next to itself.
        left = find_leftover(self.record, self.plan.attempt)
        if left is not None:
            self.say(f"attempt {left.plan.attempt} still runs as {left.where}, started by a supervisor that vanished; "
                     "watching it instead of starting another copy")
            # Its inputs are staged and its state directory is in use: no staging, no pull.
            sync = None if self.backend.remote_data else _state_sync(self.store, self.home, self.record, self.spec, self.say, pull=False)
        else:
            # inputs first: a failed Outcome when one cannot be staged, so nothing else starts
            sync = None if self.backend.remote_data else (
                _stage_inputs(self.home, self.spec, self.say) or _state_sync(self.store, self.home, self.record, self.spec, self.say))
        if isinstance(sync, Outcome):
            self._finish(sync)
            return
        self._sync = sync
        if left is not None:
            self._attach(left)
            return
        if self.paths.attempt(self.plan.attempt).exists():
            # Started before and nothing of it runs now: a new attempt, never one reusing its files.
            self.plan = self.backend.plan(self.spec, self.record.id, max(self.paths.attempts()) + 1, self.home)
            self.store.update(self.record.id, attempt=self.plan.attempt)
        self._start_attempt()

    def _start_attempt(self) -> None:
        plan = self.plan
        write_launch_files(plan, self.paths, self.spec.sample_interval)
        started = time.time()
        from ..errors import BackendError

        try:
            handles = self.backend.start(plan, self.paths)
        except BackendError as exc:  # e.g. sbatch refused the job: nothing runs, say why
            if self._sync is not None:
                self._sync.stop()
            self._finish(Outcome("failed", 1, {"exitcode": 1, "attempt": plan.attempt, "message": f"could not start: {exc}"}))
            return
        self._watch(handles, started)

    def _attach(self, left: Leftover) -> None:
        """Watch an attempt that a vanished supervisor started, from where it is now."""
        self.plan = left.plan
        write_atomic(self.paths.plan, left.plan.to_json())
        self.store.update(self.record.id, attempt=left.plan.attempt)
        # The ranks' metrics are derived from their output: read it all again rather than
        # append to what the vanished supervisor had collected (which would repeat records).
        for rank in self.paths.ranks(left.plan.attempt):
            self.paths.rank_metrics(left.plan.attempt, rank).unlink(missing_ok=True)
        self._watch(left.handles, left.started)

    def _watch(self, handles: list[Any], started: float) -> None:
        from ..monitor.metrics import MetricsCollector

        plan = self.plan
        self._handles = handles
        self._started = started
        self._margin = max(h.kill_margin for h in self._handles)
        self._stop_kind: str | None = None
        self._stop_signal: int = signal.SIGTERM
        self._stalled_for: float | None = None
        self._kill_at: float | None = None
        # Nodes that had failed when the supervisor stopped the rest (fail fast): only they say
        # whether the attempt was taken by a scheduler; the others got the supervisor's SIGTERM.
        self._failed_first: list[int] | None = None
        self._collector = MetricsCollector(self.paths, plan.attempt, self.spec.metrics, self.spec.auto_metrics)
        self._collected_at = 0.0
        # The stall clock runs from here, or from when the last node the scheduler held back runs.
        self._stall_from = time.time()
        self._samplers = [self._sampler(h.node_rank) for h in self._handles if not h.samples_itself]

    def _sampler(self, node_rank: int) -> Any:
        from ..monitor.resources import ResourceSampler, rank_pids

        attempt = self.plan.attempt
        return ResourceSampler(
            self.paths.node_resources(attempt, node_rank), node_rank,
            lambda: rank_pids(self.paths, attempt, node_rank), self.spec.sample_interval,
        ).start()

    def stop(self, kind: str, signum: int = signal.SIGTERM) -> None:
        """Stop the current attempt: ``cancelled``, ``preempted`` or ``pruned``. A second call kills."""
        if self.done:
            return
        if self._stop_kind is not None:
            self._kill_at = time.monotonic()  # asked twice: no more grace
            return
        self._stop_kind, self._stop_signal = kind, signum
        if kind == "cancelled":
            self.store.transition(self.record.id, JobState.STOPPING)
        for h in self._handles:
            h.signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
        self._kill_at = time.monotonic() + self.plan.grace + self._margin

    def wait_hint(self) -> float:
        """Seconds the loop may sleep before this run needs a tick (child exits wake it anyway)."""
        if self._kill_at is None:
            return self.METRICS_EVERY
        return max(0.0, min(self.METRICS_EVERY, self._kill_at - time.monotonic()))

    def tick(self) -> None:
        if self.done:
            return
        codes = [h.poll() for h in self._handles]
        if time.monotonic() - self._collected_at >= self.METRICS_EVERY:
            self._collect()
        if all(c is not None for c in codes):
            self._attempt_over(codes)
            return
        if self._kill_at is None and any(c not in (None, 0) for c in codes):
            self._failed_first = [n for n, c in enumerate(codes) if c not in (None, 0)]
            self._stop_all()  # fail fast: the rest of the job stops now
        if self.spec.stall_timeout and self._kill_at is None:
            now = time.time()
            if not all(h.running() for h in self._handles):
                self._stall_from = now  # queued, requeued or suspended: nothing could print
            # The metrics collector reads every rank's output anyway: its last new byte is the activity.
            silent = now - max(self._collector.last_activity, self._stall_from)
            if silent > self.spec.stall_timeout:
                self._stalled_for = silent
                _dump_stacks(self.paths, self.plan.attempt)
                self._stop_all()
        if self._kill_at is not None and time.monotonic() >= self._kill_at:
            for h in self._handles:
                h.kill()

    def _stop_all(self) -> None:
        for h in self._handles:
            h.signal(signal.SIGTERM)
        self._kill_at = time.monotonic() + self.plan.grace + self._margin

    def _collect(self, final: bool = False) -> None:
        self._collected_at = time.monotonic()
        try:
            # Bounded reads keep the loop responsive when a job floods its output.
            self._collector.poll(final=final, max_bytes=None if final else 32 << 20)
        except OSError as exc:  # metrics are an aid; never let them stop the job
            self.say(f"warning: reading metrics failed: {exc}")
        logindex.note(self.paths, self.plan.attempt)  # logs --since: how long each log is now

    def _attempt_over(self, codes: list[int | None]) -> None:
        self._collect(final=True)
        for sampler in self._samplers:
            sampler.stop()
        outcome = self._outcome(codes)
        retry, reason = _should_retry(self.spec, outcome, self.retries, self.paths, self.plan)
        _log_attempt(self.paths, self.plan.attempt, self._started, outcome, retry, reason)
        endings.attempt_over(self, outcome, retry, reason)  # notify a retry
        if retry:
            self.retries += 1
            self.say(f"attempt {self.plan.attempt} {outcome.kind} (exit {outcome.exit_code}): {_short(outcome)}; "
                     f"retrying ({self.retries}/{self.spec.max_retries}) as attempt {self.plan.attempt + 1}")
            self.plan = self.backend.plan(self.spec, self.record.id, self.plan.attempt + 1, self.home)
            self.store.update(self.record.id, attempt=self.plan.attempt, retries=self.retries)
            self._start_attempt()
            return
        if self._sync is not None:
            self._sync.stop()
        self._finish(outcome)

    def _outcome(self, codes: list[int | None]) -> Outcome:
        if self._stop_kind is not None:
            return Outcome(self._stop_kind, 128 + int(self._stop_signal))
        if self._stalled_for is not None:
            return Outcome("stalled", 124, {
                "exitcode": 124,
                "message": f"no output from any rank for {self._stalled_for:.0f}s "
                           f"(--stall-timeout {self.spec.stall_timeout:g}); each rank's Python stacks were dumped to its log",
            })
        if all(c == 0 for c in codes):
            return Outcome("succeeded", 0)
        taken = _taken_by_scheduler(self.paths, self.plan.attempt, codes, self._failed_first)
        if taken is not None:
            return Outcome("preempted", taken, {"exitcode": taken, "requeue": True, "message":
                           "the nodes were stopped by a signal phalanx did not send (a scheduler's preemption or time limit)"})
        cause = root_cause(self.paths, self.plan.attempt, len(self.plan.nodes), codes)
        return Outcome("failed", int(cause.get("exitcode") or 1), cause)

    def _finish(self, outcome: Outcome) -> None:
        outcome = _upload_outputs(self.spec, self.paths, self.record.id, outcome, self.say)
        self.outcome = outcome
        self.exit_code = _finish(self.store, self.record, outcome)
        endings.job_ended(self, outcome)  # usage, metric summary, notification


# -- attempts that outlived their supervisor ------------------------------------------------


@dataclass
class Leftover:
    """An attempt that a supervisor started, then vanished (the job is LOST), while the
    scheduler kept the attempt running or queued."""

    plan: Plan
    handles: list[Any]  # NodeHandle, one per node
    started: float  # when it was submitted
    where: str  # what a person can look up: "SLURM job 4711"


def attempt_plan(record: JobRecord, attempt: int) -> Plan | None:
    """The plan ``attempt`` was started with, read back from its launch files (and batch
    script); None when the attempt never got that far."""
    paths = JobPaths(Path(record.job_dir))
    nodes, grace = [], 0.0
    for node_rank in range(record.nnodes):
        launch = read_json(paths.node_launch(attempt, node_rank))
        if launch is None:
            return None
        nodes.append(NodePlan.from_dict(launch["node"]))
        grace = float(launch["grace"])
    try:
        submission = paths.batch_script(attempt).read_text()
    except OSError:
        submission = ""
    return Plan(record.id, attempt, record.backend, tuple(nodes), grace, submission)


def find_leftover(record: JobRecord, upto: int | None = None) -> Leftover | None:
    """The job's latest attempt (at most ``upto``) when something of it still runs although
    no supervisor watches it; None otherwise, and always on backends whose agents die with
    their supervisor (local, ssh). Asks the scheduler at most once; starts and stops nothing.

    Only the latest attempt can be left: a supervisor starts the next one after the last ended.
    """
    from ..backends.registry import get_backend

    paths = JobPaths(Path(record.job_dir))
    attempts = [a for a in paths.attempts() if upto is None or a <= upto]
    plan = attempt_plan(record, max(attempts)) if attempts else None
    handles = get_backend(record.backend).attach(plan, paths) if plan is not None else None
    if not handles or plan is None:
        return None
    submitted = read_json(paths.scheduler_job(plan.attempt)) or {}
    where = (f"{str(submitted.get('scheduler', record.backend)).upper()} job {submitted['job_id']}"
             if submitted.get("job_id") else f"attempt {plan.attempt}")
    return Leftover(plan, handles, float(submitted.get("submitted") or time.time()), where)


def resume_plan(record: JobRecord, home: HomePaths) -> Plan:
    """The plan ``phalanx resume`` continues a job with: its latest attempt while that still
    runs (a LOST job the scheduler kept going; the new supervisor watches it), else a new one."""
    from ..backends.registry import get_backend

    left = find_leftover(record)
    if left is not None:
        return left.plan
    paths = JobPaths(Path(record.job_dir))
    spec = JobSpec.from_dict(json.loads(record.spec_json))
    return get_backend(spec.backend).plan(spec, record.id, max([*paths.attempts(), record.attempt]) + 1, home)


def stop_leftover(store: Store, record: JobRecord, events: Events | None = None, poll: float = 0.5) -> Leftover | None:
    """Stop what a LOST job left running, as a supervisor stops an attempt: SIGTERM to every
    node (the ranks get the grace period to checkpoint), then SIGKILL. Blocking, until every
    node has ended; idempotent: None when nothing was left. The job stays LOST; its root cause
    and attempts log say what was stopped."""
    left = find_leftover(record)
    if left is None:
        return None
    say = events or (lambda text: None)
    attempt = left.plan.attempt
    say(f"job {record.id} is LOST (its supervisor vanished) but {left.where} (attempt {attempt}) still runs; stopping it")
    for h in left.handles:
        h.signal(signal.SIGTERM)
    margin = max(h.kill_margin for h in left.handles)
    deadline, killed = time.monotonic() + left.plan.grace + margin, False
    while any(h.poll() is None for h in left.handles):
        if time.monotonic() >= deadline:
            if killed:
                say(f"warning: {left.where} had not ended {margin:g}s after SIGKILL; check it with your scheduler")
                break
            for h in left.handles:
                h.kill()
            killed, deadline = True, time.monotonic() + margin
        time.sleep(poll)
    paths = JobPaths(Path(record.job_dir))
    done = f"phalanx stop stopped {left.where} (attempt {attempt}), which ran on without it"
    _log_attempt(paths, attempt, left.started, Outcome("cancelled", 128 + signal.SIGTERM), False, done)
    cause = record.root_cause_dict() or {}
    cause["message"] = "; ".join(filter(None, [cause.get("message"), done]))
    store.update(record.id, root_cause=json.dumps(cause, sort_keys=True))
    say(f"stopped {left.where}")
    return left


def _stop_kind(store: Store, job_id: str, signum: int) -> str:
    """A user stop (``phalanx stop`` marks the store first; Ctrl-C is SIGINT) or a preemption."""
    if signum == signal.SIGINT or store.get(job_id).state is JobState.STOPPING:
        return "cancelled"
    return "preempted"


def _taken_by_scheduler(paths: JobPaths, attempt: int, codes: list[int | None], first: list[int] | None) -> int | None:
    """The exit code when the nodes that failed first (``first``, else all that failed) were
    stopped by a signal the supervisor did not send (a scheduler preempting the job, or its
    time limit coming): the job was taken, not broken. A node whose handle saw another end than
    its agent reported (a lost ssh link: 255) was not taken."""
    failed = [(codes[n], read_json(paths.node_result(attempt, n)) or {})
              for n in (first if first is not None else range(len(codes))) if codes[n]]
    if failed and all(r.get("stopped_by") and not r.get("failures") and r.get("exitcode") == code for code, r in failed):
        return int(failed[0][0] or 1)
    return None


def _should_retry(spec: JobSpec, outcome: Outcome, retries: int, paths: JobPaths, plan: Plan) -> tuple[bool, str]:
    # A preemption the supervisor outlived (SLURM's) is requeued like a failure is retried.
    requeue = outcome.kind == "preempted" and bool((outcome.cause or {}).get("requeue"))
    if outcome.kind not in ("failed", "stalled") and not requeue:
        return False, outcome.kind
    if retries >= spec.max_retries:
        return False, f"no retries left ({retries}/{spec.max_retries} used)"
    if requeue:
        return True, "preempted; requeued"
    if spec.retry_on_exit_codes and outcome.exit_code not in spec.retry_on_exit_codes:
        return False, f"exit code {outcome.exit_code} is not in --retry-on-exit-codes"
    text = "\n".join(_tail(paths.rank_log(plan.attempt, r), 200) for r in paths.ranks(plan.attempt))
    for pattern in spec.no_retry_on:
        if re.search(pattern, text):
            return False, f"the output matches --no-retry-on '{pattern}'"
    return True, "retryable"


def _log_attempt(paths: JobPaths, attempt: int, started: float, outcome: Outcome, retry: bool, reason: str) -> None:
    entry = {
        "attempt": attempt, "started": started, "ended": time.time(), "outcome": outcome.kind,
        "exit_code": outcome.exit_code, "message": _short(outcome), "retry": retry, "reason": reason,
    }
    with open(paths.attempts_log, "a") as fh:
        fh.write(json.dumps(entry) + "\n")


def _short(outcome: Outcome) -> str:
    cause = outcome.cause or {}
    where = f"rank {cause['rank']}: " if "rank" in cause else ""
    return f"{where}{cause.get('message', outcome.kind)}"


def _dump_stacks(paths: JobPaths, attempt: int) -> None:
    """SIGUSR2 to every rank: the bootstrap's faulthandler prints all Python stacks to its log."""
    for rank in paths.ranks(attempt):
        proc = read_json(paths.rank_proc(attempt, rank)) or {}
        if proc.get("pid"):
            try:
                os.kill(int(proc["pid"]), signal.SIGUSR2)
            except (ProcessLookupError, PermissionError):
                pass
    time.sleep(1.0)  # let faulthandler write before the ranks are stopped


def _state_sync(store: Store, home: HomePaths, record: JobRecord, spec: JobSpec, say: Events, pull: bool = True) -> Any:
    """Pull the remote state before the first attempt (unless ``pull`` is False: the job already
    runs and writes it); returns the running sync, None, or a failed Outcome."""
    if not spec.state_uri:
        return None
    from ..errors import PhalanxError
    from ..storage.state import StateSync

    sync = StateSync(
        home.state_dir(spec.state_key), spec.state_uri,
        on_pushed=lambda ts: store.update(record.id, state_synced_at=ts),
        on_error=lambda msg: say(f"warning: {msg}"),
    )
    try:
        pulled = sync.pull() if pull else 0
    except PhalanxError as exc:
        return Outcome("failed", 1, {"exitcode": 1, "message": f"could not restore the state directory: {exc}"})
    if pulled:
        say(f"restored {pulled} file(s) of state from {spec.state_uri}")
    from .. import config

    sync.start(float(config.get("state_sync_interval")))
    return sync


def _stage_inputs(home: HomePaths, spec: JobSpec, say: Events) -> Outcome | None:
    """Stage the input channels before the first attempt; a failed Outcome if one cannot be."""
    if not spec.channels:
        return None
    from ..errors import PhalanxError
    from ..storage.channels import stage

    try:
        stage(home, spec, say)
    except (PhalanxError, OSError) as exc:
        return Outcome("failed", 1, {"exitcode": 1, "message": f"could not stage the inputs: {exc}"})
    return None


def _upload_outputs(spec: JobSpec, paths: JobPaths, job_id: str, outcome: Outcome, say: Events) -> Outcome:
    """Upload outputs and logs at the end, whatever the outcome (a failed job uploads what it
    has). A job that succeeded but whose outputs could not be uploaded has failed."""
    if not spec.output_uri:
        return outcome
    from ..storage.outputs import upload_job

    problem = upload_job(spec, paths, job_id, say)
    if problem is None:
        return outcome
    say(f"warning: {problem}")
    if outcome.kind != "succeeded":
        return outcome
    return Outcome("failed", 1, {"exitcode": 1, "message": f"{problem}; the outputs are in {paths.output_dir}"})


def _self_identity() -> dict[str, Any]:
    import psutil

    return {"supervisor_pid": os.getpid(), "supervisor_started": psutil.Process().create_time()}


def _finish(store: Store, record: JobRecord, outcome: Outcome) -> int:
    code = outcome.exit_code
    if outcome.kind == "succeeded":
        store.transition(record.id, JobState.SUCCEEDED, exit_code=0)
    elif outcome.kind == "cancelled":
        if not store.transition(record.id, JobState.CANCELLED, exit_code=code):
            store.transition(record.id, JobState.FAILED, exit_code=code)
    elif outcome.kind == "pruned":
        store.transition(record.id, JobState.PRUNED, exit_code=code)
    elif outcome.kind == "preempted":
        cause = {"exitcode": code, "message": f"preempted ({signal_name(code)}); continue with: phalanx resume {record.id}"}
        store.transition(record.id, JobState.PREEMPTED, exit_code=code, root_cause=json.dumps(cause, sort_keys=True))
    else:
        store.transition(record.id, JobState.FAILED, exit_code=code, root_cause=json.dumps(outcome.cause, sort_keys=True))
    return code


def rank_failures(paths: JobPaths, attempt: int, nnodes: int) -> list[dict[str, Any]]:
    """Every rank failure reported by the node agents, enriched with the rank's error.json."""
    failures = []
    for node_rank in range(nnodes):
        result = read_json(paths.node_result(attempt, node_rank)) or {}
        for failure in result.get("failures", []):
            failure = dict(failure, node_rank=node_rank, host=result.get("host"))
            error = read_json(paths.rank_error(attempt, failure["rank"]))
            if error:
                failure.update(
                    timestamp=error["timestamp"], type=error["type"], message=error["message"], traceback=error["traceback"]
                )
            failures.append(failure)
    return failures


def root_cause(paths: JobPaths, attempt: int, nnodes: int, codes: list[int | None]) -> dict[str, Any]:
    """The first failure by timestamp; falls back to the first failed node agent."""
    failures = rank_failures(paths, attempt, nnodes)
    if failures:
        first = dict(min(failures, key=lambda f: f["timestamp"]))
        first["attempt"] = attempt
        first["log_tail"] = _tail(paths.rank_log(attempt, first["rank"]))
        first["log"] = str(paths.rank_log(attempt, first["rank"]))
        if not first.get("message"):
            sig = first.get("signal")
            first["message"] = f"killed by {sig}" if sig else f"exited with code {first['exitcode']}"
        return first
    for node_rank, code in enumerate(codes):
        if code not in (None, 0):
            log = paths.agent_log(attempt, node_rank)
            sig = signal_name(code)
            return {
                "attempt": attempt,
                "node_rank": node_rank,
                "exitcode": code,
                "signal": sig,
                "message": f"node agent {node_rank} {'was killed by ' + sig if sig else f'exited with code {code}'}",
                "log": str(log),
                "log_tail": _tail(log),
            }
    return {"attempt": attempt, "exitcode": 1, "message": "the job failed for an unknown reason"}


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def main(argv: list[str] | None = None) -> None:
    """Detached entry point: ``python -m phalanx.launch.supervisor JOB_ID``."""
    from .. import config

    args = sys.argv[1:] if argv is None else argv
    home = HomePaths(config.home())
    store = Store(home.db)
    record = store.get(args[0])
    plan = Plan.from_dict(read_json(JobPaths(Path(record.job_dir)).plan))

    def say(text: str) -> None:
        print(f"phalanx: {text}", flush=True)

    code = supervise(store, home, record, plan, events=say)
    sys.stdout.flush()
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
