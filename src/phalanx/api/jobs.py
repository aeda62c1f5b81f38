"""The library's verbs: run, submit, resume, stop and wait for jobs.

The verbs that act on jobs are here (a sweep's are :mod:`phalanx.api.sweepjobs`'s, ``rm`` and
``prune`` :mod:`phalanx.api.cleanup`'s); the
views that look at them are :mod:`phalanx.api.query`, ``lists``, ``ps``, ``jobview`` and
``sweepview``; :mod:`phalanx.api.face` puts both behind the one object the CLI and the dashboard
call. The work itself is :mod:`phalanx.supervise`'s.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO

from ..backends.registry import get_backend
from ..core.contracts import StopRequest, read_stop_request, write_stop_request
from ..core.paths import read_json, write_atomic, write_json
from ..core.plan import Plan
from ..core.spec import JobSpec
from ..core.state import JobState, can_resume, is_terminal
from ..errors import PhalanxError, UsageError
from .query import find_job, get_job, home, open_store
from ..store import JobRecord, Store
from ..supervise import detached, leasing, leftover, liveness, submit
from ..supervise.liveness import effective

if TYPE_CHECKING:
    pass

Events = Callable[[str], None]


def plan_job(spec: JobSpec, job_id: str | None = None, attempt: int = 0) -> Plan:
    """The plan ``submit`` would execute (what ``--dry-run`` prints). Starts nothing."""
    return submit.plan_job(spec, home(), job_id, attempt)


def check_storage(spec: JobSpec) -> None:
    """What a dry run checks before it prints the plan: the stores the job names (state, inputs,
    output), as a real run does; not the backend's cluster or credentials (a dry run is offline)."""
    submit.check_storage(spec, home(), backend=False)


def clean_state(spec: JobSpec) -> Path | None:
    """``--clean-state``: move the job name's state directory aside (never delete a checkpoint);
    with a state URI, mark the remote copy empty. Returns where the old state went."""
    return submit.clean_state(spec, home())


def doctor(spec: JobSpec, events: Events | None = None, burn: float = 2.0) -> Any:
    """Check the nodes a job of ``spec`` would get (``supervise/doctor.py``): run the check as a
    job there and judge it. Blocking. Returns a ``Diagnosis`` (``.verdict.healthy``, ``.render()``)."""
    from ..supervise.doctor import diagnose

    store, where = open_store(), home()
    get_backend(spec.backend).check(spec)
    return diagnose(store, where, spec, events, burn)


def run(spec: JobSpec, out: TextIO | None = None, ranks: set[int] | None = None,
        events: Events | None = None,
        started: Callable[[JobRecord], None] | None = None, user: str | None = None) -> tuple[JobRecord, int]:
    """Run ``spec`` in the foreground, streaming rank output to ``out``. Blocking.
    ``started`` is called with the record once the job exists (the CLI's start line).

    Returns the final record and the job's exit code. Ctrl-C (SIGINT) reaches the ranks as
    python's does and the job ends as the script chooses (SUCCEEDED when it exits 0, CANCELLED
    with its exit status otherwise); SIGTERM from elsewhere records it PREEMPTED. A lone process
    is lent the terminal (``launch/console.py``) when ``out`` has a file descriptor. ``user``:
    who submits it (default: this process's user).
    """
    store, where = open_store(), home()
    submit.check_storage(spec, where)
    done, inputs = submit.check_done(spec, store, where)
    if done is not None:
        _skipped(done, events)
        return done, 0
    plan = submit.plan_job(spec, where)
    record = submit.create_job(store, where, spec, plan, inputs=inputs, **_submitter(user), **liveness.identity())
    write_json(record.paths.start_mode, {"detached": False})
    if started is not None:
        started(record)
    _say_at_submit(store, record, events, plan=plan)
    return _supervise_here(store, record, plan, out, ranks, events)


def submit_detached(spec: JobSpec, events: Events | None = None, user: str | None = None,
                    job_id: str | None = None) -> JobRecord:
    """Start ``spec`` in the background (survives this process and the terminal); returns at once
    (with ``--skip-if-done``, possibly the earlier job that makes this one unnecessary).
    ``user``: who submits it (default: this process's user); ``job_id``: an id drawn already
    (``supervise.submit.new_job_id``: a server lays the job's shipped code out under it first)."""
    store, where = open_store(), home()
    submit.check_storage(spec, where)
    done, inputs = submit.check_done(spec, store, where)
    if done is not None:
        _skipped(done, events)
        return done
    plan = submit.plan_job(spec, where, job_id)
    # a server's job carries its lease from the first statement that records it (store/leases.py)
    record = submit.create_job(store, where, spec, plan, inputs=inputs, **_submitter(user), **leasing.columns())
    write_json(record.paths.start_mode, {"detached": True})
    _say_at_submit(store, record, events, plan=plan)
    if _queued(store, record, events):  # its project's quota is full: no supervisor until the queue admits it
        return store.get(record.id)
    # A backend may run the supervisor itself (k8s --in-cluster: a supervisor pod); else a process here.
    try:
        hosted = get_backend(spec.backend).host_supervisor(record, plan, events)
    except PhalanxError as exc:  # nothing runs: the record says why rather than turning LOST
        store.transition(record.id, JobState.FAILED, exit_code=1,
                         root_cause=json.dumps({"message": f"could not start: {exc}", "exitcode": 1}))
        raise
    store.update(record.id, **(hosted if hosted is not None else detached.spawn_supervisor(record, spec.workdir)))
    return store.get(record.id)


def _queued(store: Store, record: JobRecord, events: Events | None) -> bool:
    """Admission at submit (``supervise/admission.py``): True when the job waits in its
    project's queue (QUEUED, said in ``events``); a job that can never start is recorded FAILED
    and raised."""
    from ..supervise.admission import admit, advance

    decision = admit(store, record)
    if decision.never:
        store.transition(record.id, JobState.FAILED, exit_code=1,
                         root_cause=json.dumps({"message": f"could not start: {decision.reason}", "exitcode": 1}))
        raise UsageError(f"job {record.id} can never start: {decision.reason}", "ask for less, or for a larger quota")
    if decision.admitted:
        return False
    # A share freed unseen (a holder's supervisor killed: nobody moved the queue) is taken by the
    # head of the queue now; if that is this job, ``advance`` started its supervisor.
    moved = advance(store, [record.project])
    if record.id in moved:
        return True
    if moved:  # what it waits for now
        decision = admit(store, store.get(record.id))
    if events:
        events(f"queued: {decision.reason} (place {decision.place}); it starts by itself when capacity frees")
    return True


def reship(spec: JobSpec, job_id: str) -> tuple[JobSpec, str]:
    """``spec`` of job ``job_id``, which a team server ran in the copy of its code shipped with it
    (``home.shipped``), made to run in a copy of that copy under a new id: a job run again keeps
    its working directory when the first one is removed. Returns the spec and the new id."""
    import shutil
    from dataclasses import replace

    where = home()
    new_id = submit.new_job_id(where)
    old, dest = where.shipped(job_id), where.shipped(new_id)
    shutil.copytree(old, dest, symlinks=True)
    entry = spec.entrypoint
    if entry.target.startswith(f"{old}/"):
        entry = replace(entry, target=str(dest) + entry.target[len(str(old)):])
    return spec.with_(workdir=str(dest), entrypoint=entry), new_id


def _submitter(user: str | None) -> dict[str, Any]:
    return {"user_name": user} if user else {}


def _skipped(done: JobRecord, events: Events | None) -> None:
    if events:
        events(f"skipped: job {done.id}, the last successful run of '{done.name}', had the same inputs "
               "(without --skip-if-done it runs again)")


def _say_at_submit(store: Store, record: JobRecord, events: Events | None, resuming: bool = False,
                   plan: Plan | None = None) -> None:
    """At submit: the plan's warnings (launch/explain.py), and one line when the job starts
    with files already in its state directory (storage/statedir.py)."""
    from ..launch.explain import warnings
    from ..storage.statedir import pickup_line

    if events is None:
        return
    for warning in warnings(plan) if plan is not None else []:
        events(warning)
    line = pickup_line(home(), record.spec, lambda: store.list(trials=True), record.id, resuming)
    if line:
        events(line)


def _supervise_here(store: Store, record: JobRecord, plan: Plan, out: TextIO | None, ranks: set[int] | None,
                    events: Events | None) -> tuple[JobRecord, int]:
    from ..launch.console import lend
    from ..monitor.tail import Stop
    from ..supervise.job import supervise

    done = Stop()  # setting it wakes the streamer, which otherwise sleeps until output comes
    closed = threading.Event()  # the streamer's reader went away (`phalanx run -n 2 gen.py | head -1`)
    streamer = None
    # A lone process started here gets the terminal (stdin; its output relayed as it comes);
    # the ranks of other jobs are streamed from their logs (rank 0 writing to a terminal of its own).
    console = lend(out) if out is not None else None
    if out is not None and not (console is not None and get_backend(plan.backend).lends_console(plan)):
        prefix = record.nnodes * record.nproc_per_node > 1
        streamer = threading.Thread(
            target=_stream, args=(record.paths, plan.attempt, ranks, prefix, out, done, closed), daemon=True
        )
        streamer.start()
    try:
        code = supervise(store, home(), record, plan, events=events, console=console, output_closed=closed)
    finally:
        done.set()
        if streamer:
            streamer.join()
        if console:
            console.close()
    assert code is not None  # a foreground run waits for its queue
    return store.get(record.id), code


def started_detached(mark: Path) -> bool:
    """Whether ``phalanx run -d`` started it (``JobPaths.start_mode``); a job recorded before
    the mark existed ran in the foreground as far as anyone knows."""
    found = read_json(mark)
    return bool(found.get("detached")) if isinstance(found, dict) else False


def _stream(paths: Any, attempt: int, ranks: set[int] | None, prefix: bool, out: TextIO, done: threading.Event,
            closed: threading.Event) -> None:
    """The ranks' output to ``out`` until ``done``. When ``out``'s reader goes away, ``closed`` is
    set and the supervisor ends the job as python's broken pipe would (``supervise``)."""
    from ..launch.procs import wake
    from ..monitor.tail import follow_attempts

    try:
        follow_attempts(paths, attempt, ranks, prefix, out, done)
    except BrokenPipeError:
        try:  # nothing reaches the reader any more, not even Python's last flush at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        closed.set()
        wake()


def resume(ref: str, detach: bool | None = None, out: TextIO | None = None, ranks: set[int] | None = None,
           events: Events | None = None) -> tuple[JobRecord, int | None]:
    """Continue a failed, cancelled, preempted or lost job as a new attempt of the same job:
    same id, same state directory (so the script resumes from its last checkpoint). A lost job
    whose scheduler kept its attempt running is watched again instead (``leftover.resume_plan``).
    ``detach`` None: as ``phalanx run`` started it (``-d``: in the background again). Returns the
    record and the exit code (None: it runs in the background)."""
    store = open_store()
    record = liveness.record_lost(store, store.find(ref))  # acting on it: a LOST job is recorded so
    if not can_resume(record.state):
        hint = "it has finished successfully" if record.state is JobState.SUCCEEDED else "it is still running"
        raise UsageError(f"job {record.id} is {record.state.value}: nothing to resume", f"{hint}; see: phalanx status {record.id}")
    if detach is None:
        detach = started_detached(record.paths.start_mode)
    plan = leftover.resume_plan(record, home())
    write_atomic(record.paths.plan, plan.to_json())
    if detach:
        if not store.reopen(record.id, plan.attempt):
            raise PhalanxError(f"job {record.id} changed state meanwhile", "try again")
        store.update(record.id, **detached.spawn_supervisor(record, record.spec.workdir))
        leasing.claim(store, record.id)
        return store.get(record.id), None
    if not store.reopen(record.id, plan.attempt, **liveness.identity()):
        raise PhalanxError(f"job {record.id} changed state meanwhile", "try again")
    _say_at_submit(store, record, events, resuming=True)
    return _supervise_here(store, store.get(record.id), plan, out, ranks, events)


def stop(ref: str, timeout: float | None = None, events: Events | None = None, now: bool = False,
         by: str | None = None) -> JobRecord:
    """Stop a job gracefully: SIGTERM to every rank, the job's grace period, then SIGKILL.

    Idempotent: stopping a finished job returns its record unchanged, and a stop of a job that
    is stopping already (another ``stop``, the dashboard's, a Ctrl-C) changes nothing: its ranks
    keep the rest of their grace period (``events`` hears how much). ``now`` skips the grace
    period, also of a stop under way: SIGTERM, then SIGKILL at once. A LOST job (its supervisor
    vanished) may have left its scheduler's job running: that is stopped the same way, and the
    job stays LOST. Blocks until the job has ended. ``timeout`` (default grace +
    the backend's ``stop_margin``, 15 s but for SageMaker) bounds the wait for the ranks to stop; once they all have, the supervisor is saving
    the outputs and the state, which takes as long as the upload does: that is waited for as
    long as the supervisor lives, and ``events`` hears about it once. A job waiting in its
    project's queue is CANCELLED at once (``by``: who stopped it, for its record).
    """
    store = open_store()
    record = liveness.record_lost(store, find_job(ref, store))
    if liveness.elsewhere(record):  # supervised in a cluster (k8s --in-cluster): stopped through it
        return get_backend(record.backend).stop_elsewhere(store, record, events, leftover.stop)
    if is_terminal(record.state):
        return stop_leftover(store, record, events)
    if record.state is JobState.QUEUED and record.admitted_at is None:
        from ..supervise.admission import stop_queued

        if stop_queued(store, record, by or config_user()):  # nothing runs: cancelled at once
            return store.get(record.id)
        record = store.get(record.id)
    # Mark first: the supervisor reads STOPPING as "the user cancelled" (not a preemption). Only
    # the stop that marks it signals: a second signal would cut the grace period short.
    marked = store.transition(record.id, JobState.STOPPING)
    if not marked:
        record = liveness.record_lost(store, store.get(record.id))
        if is_terminal(record.state):
            return stop_leftover(store, record, events)
        if events and not now:
            events(_already_stopping(record))
    # A supervisor on another machine (a team server's replica there) is not signalled from here: it
    # finds the request in the job's directory (``supervise/relay.py``).
    away = liveness.elsewhere_host(record)
    if marked or now:
        write_stop_request(record.paths.stop_request, StopRequest(time.time(), now, relay=away))  # read on the signal
    if marked and record.supervisor_pid is None:
        store.transition(record.id, JobState.CANCELLED, exit_code=143)
        return store.get(record.id)
    if (marked or now) and record.supervisor_pid is not None and not away:
        try:
            os.kill(record.supervisor_pid, signal.SIGTERM)
        except ProcessLookupError:
            return stop_leftover(store, liveness.record_lost(store, store.get(record.id)), events)
    limit = timeout if timeout is not None else record.spec.grace + get_backend(record.spec.backend).stop_margin
    deadline = time.monotonic() + limit
    saving = False
    while True:
        record = liveness.record_lost(store, store.get(record.id))
        if is_terminal(record.state):
            return stop_leftover(store, record, events)
        if not saving and time.monotonic() >= deadline:
            if not _ranks_ended(record):
                raise PhalanxError(
                    f"job {record.id} did not stop within {limit:g}s",
                    f"its supervisor is pid {record.supervisor_pid}; try again or kill it",
                )
            saving = True
            if events:
                events(f"every rank of job {record.id} has stopped; its supervisor (pid {record.supervisor_pid}) "
                       "is saving the outputs and the state (Ctrl-C stops waiting, not the saving)")
        time.sleep(0.1)


def config_user() -> str:
    from .. import config

    return config.user()


def interrupt(record: JobRecord) -> JobRecord:
    """What Ctrl-C does to a foreground run, for a job whose supervisor runs detached: one
    SIGINT to the supervisor, which passes it to the ranks (a second one escalates, as a second
    Ctrl-C does). Nothing happens to a job that has ended or whose supervisor is gone."""
    if not is_terminal(record.state) and record.supervisor_pid and liveness.alive(record.supervisor_pid,
                                                                                 record.supervisor_started):
        try:
            os.kill(record.supervisor_pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    return record


def _already_stopping(record: JobRecord) -> str:
    """"job ID is already stopping: 2.1 s of grace left" (what a second stop says)."""
    try:
        asked = read_stop_request(record.paths.stop_request)
    except PhalanxError:
        asked = None
    left = asked.at + record.spec.grace - time.time() if asked is not None and not asked.now else 0.0
    grace = f": {left:.1f} s of grace left" if left > 0 else ""
    return f"job {record.id} is already stopping{grace} (--now ends it at once)"


def _ranks_ended(record: JobRecord) -> bool:
    """Every node of the job's current attempt has reported its end."""
    return all(record.paths.node_result(record.attempt, n).exists() for n in range(record.nnodes))


def stop_leftover(store: Store, record: JobRecord, events: Events | None) -> JobRecord:
    """What a LOST job's scheduler still runs is stopped too (idempotent)."""
    if record.state is not JobState.LOST:
        return record
    leftover.stop(store, record, events)
    return store.get(record.id)


def wait(ref: str, timeout: float | None = None, poll: float = 0.2,
         watch: Callable[[JobRecord], None] | None = None) -> JobRecord:
    """Block until the job ends; returns its record. Raises PhalanxError on timeout. Writes
    nothing. ``watch`` is called with the record at every look (``wait --progress``)."""
    store = open_store()
    record = _settled(store, get_job(ref, store))
    deadline = None if timeout is None else time.monotonic() + timeout
    while not is_terminal(record.state):
        if watch is not None:
            watch(record)
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"job {record.id} still {record.state.value} after {timeout:g}s", "wait longer or check: phalanx status " + record.id)
        time.sleep(poll)
        # get_job: a job supervised in a cluster (k8s --in-cluster) is brought up to date from it
        record = get_job(record.id, store) if liveness.elsewhere(record) else _settled(store, effective(store.get(record.id)))
    return record


def _settled(store: Store, record: JobRecord) -> JobRecord:
    """A job seen LOST that is not recorded LOST is read once more: its supervisor may have recorded
    the end and exited between the read of the row and the look at its process (a short job's
    ``run -d`` then ``wait`` said LOST now and then)."""
    if record.state is JobState.LOST:
        again = store.get(record.id)
        if is_terminal(again.state):
            return again
    return record


class WaitTimeout(PhalanxError):
    exit_code = 124


def download(record: JobRecord, dest: Path | None = None, logs: bool = False, state: bool = False,
             events: Events | None = None) -> tuple[Path, dict[str, int]]:
    """Bring a job's outputs (and logs, state) to ``dest`` (default ``./<name>-<id>``). Blocking."""
    from ..storage.outputs import download_job

    dest = (dest or Path.cwd() / f"{record.name}-{record.id}").resolve()
    counts = download_job(record.spec, record.paths, home(), dest, logs, state, events or (lambda text: None))
    return dest, counts
