"""The library behind the CLI: submit, inspect, follow, wait for and stop jobs.

Everything ``phalanx`` can do from the shell is a function here.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

from . import config
from .core.paths import HomePaths, JobPaths, read_json, write_atomic, write_json
from .core.spec import JobSpec
from .core.state import JobState, is_terminal
from .errors import PhalanxError, UsageError
from .launch.plan import Plan
from .store import JobRecord, Store


def home() -> HomePaths:
    return HomePaths(config.home())


def open_store() -> Store:
    return Store(home().db)


def new_job_id() -> str:
    return secrets.token_hex(4)


def check_storage(spec: JobSpec) -> None:
    """Reach every store the job names before anything starts (a typo should not cost a run)."""
    if spec.state_uri:
        from .storage.state import StateSync

        StateSync(home().state_dir(spec.name), spec.state_uri).check()
    if spec.channels:
        from .storage import channels

        channels.check(spec)
    if spec.output_uri:
        from .storage import outputs

        outputs.check(spec)


def resolve_job_input(uri: str) -> str:
    """``job:NAME_OR_ID[/output|/state]`` -> where that job's results are: its output directory
    (or the uploaded copy), or its state directory. A name means its latest successful run."""
    ref, _, part = uri[len("job:"):].partition("/")
    part = part.strip("/") or "output"
    if not ref or part not in ("output", "state"):
        raise UsageError(f"invalid job reference '{uri}'", "use job:NAME_OR_ID, job:NAME_OR_ID/output or job:NAME_OR_ID/state")
    store = open_store()
    named = [r for r in store.list() if r.name == ref]
    record = next((r for r in named if r.state is JobState.SUCCEEDED), None) if named else store.find(ref)
    if record is None:
        latest = named[0]
        raise UsageError(f"'{uri}': no run of '{ref}' has succeeded (the latest, job {latest.id}, is {latest.state.value})",
                         f"run it first; see: phalanx status {latest.id}")
    if record.state is not JobState.SUCCEEDED:
        raise UsageError(f"'{uri}': job {record.id} is {record.state.value}, so its {part} may be incomplete",
                         "refer to a job that succeeded")
    if part == "state":
        return str(home().state_dir(record.name))
    from .storage.outputs import job_output_source

    return job_output_source(JobPaths(Path(record.job_dir)))


def check_done(spec: JobSpec) -> tuple[JobRecord | None, dict[str, Any] | None]:
    """``--skip-if-done``: the latest successful job of this name when it ran with the same
    inputs (code, command, input data), and the fingerprint of this spec's inputs."""
    if not spec.skip_if_done:
        return None, None
    from .storage.inputs import fingerprint

    inputs = fingerprint(spec, home())
    last = next((r for r in open_store().list() if r.name == spec.name and r.state is JobState.SUCCEEDED), None)
    if last is not None and (read_json(JobPaths(Path(last.job_dir)).inputs) or {}).get("digest") == inputs["digest"]:
        return last, inputs
    return None, inputs


def artifacts(record: JobRecord) -> Any:
    """What the job produced (``storage.outputs.Artifacts``): uploaded, or in its job directory."""
    from .storage.outputs import artifacts as read_artifacts

    return read_artifacts(JobPaths(Path(record.job_dir)))


def download(record: JobRecord, dest: Path | None = None, logs: bool = False, state: bool = False,
             events: Callable[[str], None] | None = None) -> tuple[Path, dict[str, int]]:
    """Bring a job's outputs (and logs, state) to ``dest`` (default ``./<name>-<id>``). Blocking."""
    from .storage.outputs import download_job

    dest = (dest or Path.cwd() / f"{record.name}-{record.id}").resolve()
    counts = download_job(read_spec(record), JobPaths(Path(record.job_dir)), home(), dest, logs, state,
                          events or (lambda text: None))
    return dest, counts


def _skipped(done: JobRecord, events: Callable[[str], None] | None) -> None:
    if events:
        events(f"skipped: job {done.id}, the last successful run of '{done.name}', had the same inputs "
               "(without --skip-if-done it runs again)")


def preflight(spec: JobSpec) -> None:
    """The backend's checks against where the job will run (a cluster's namespace, permissions,
    capacity), before anything is recorded or created; raises UsageError. Backends without
    such checks pass."""
    from .backends.registry import get_backend

    check = getattr(get_backend(spec.backend), "preflight", None)
    if check is not None:
        check(spec)


def plan_job(spec: JobSpec, job_id: str | None = None, attempt: int = 0) -> Plan:
    """The plan ``submit`` would execute (what ``--dry-run`` prints). No side effects."""
    from .backends.registry import get_backend

    return get_backend(spec.backend).plan(spec, job_id or new_job_id(), attempt, home())


def create_job(store: Store, spec: JobSpec, plan: Plan, inputs: dict[str, Any] | None = None, **supervisor: Any) -> JobRecord:
    """Record the job (PENDING) and lay out its directory (with the code snapshot). Nothing runs yet."""
    paths = home().job(plan.job_id)
    paths.root.mkdir(parents=True, exist_ok=False)
    paths.output_dir.mkdir()
    if spec.snapshot:
        from .storage.snapshot import snapshot_job

        snapshot_job(spec, paths, home().root)
    if inputs is not None:
        write_json(paths.inputs, inputs)
    home().state_dir(spec.name).mkdir(parents=True, exist_ok=True)
    write_json(paths.spec, spec.to_dict())
    write_atomic(paths.plan, plan.to_json())
    store.insert_job(
        id=plan.job_id,
        name=spec.name,
        backend=spec.backend,
        nnodes=spec.resources.nnodes,
        nproc_per_node=spec.resources.nproc_per_node,
        command=spec.entrypoint.display(),
        job_dir=str(paths.root),
        spec_json=json.dumps(spec.to_dict(), sort_keys=True),
        **supervisor,
    )
    return store.get(plan.job_id)


def clean_state(spec: JobSpec) -> Path | None:
    """``--clean-state``: move the job name's state directory aside (never delete a checkpoint);
    with a state URI, mark the remote copy empty. Returns where the old state went."""
    state = home().state_dir(spec.name)
    moved = None
    if state.exists() and any(state.iterdir()):
        moved = home().root / "state" / ".previous" / f"{state.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        moved.parent.mkdir(parents=True, exist_ok=True)
        os.replace(state, moved)
    if spec.state_uri:
        from .storage.state import StateSync

        StateSync(state, spec.state_uri).reset()
    return moved


def _identity() -> dict[str, Any]:
    import psutil

    return {"supervisor_pid": os.getpid(), "supervisor_started": psutil.Process().create_time()}


def run(spec: JobSpec, out: TextIO | None = None, ranks: set[int] | None = None,
        events: Callable[[str], None] | None = None) -> tuple[JobRecord, int]:
    """Run ``spec`` in the foreground, streaming rank output to ``out``. Blocking.

    Returns the final record and the job's exit code. Ctrl-C (SIGINT) stops the job
    gracefully and records it CANCELLED; SIGTERM from elsewhere records it PREEMPTED.
    """
    check_storage(spec)
    done, inputs = check_done(spec)
    if done is not None:
        _skipped(done, events)
        return done, 0
    preflight(spec)
    store = open_store()
    plan = plan_job(spec)
    record = create_job(store, spec, plan, inputs=inputs, **_identity())
    return _supervise_here(store, record, plan, out, ranks, events)


def _supervise_here(store: Store, record: JobRecord, plan: Plan, out: TextIO | None, ranks: set[int] | None,
                    events: Callable[[str], None] | None) -> tuple[JobRecord, int]:
    from .launch.supervisor import supervise
    from .monitor.tail import follow_attempts

    done = threading.Event()
    streamer = None
    if out is not None:
        paths = JobPaths(Path(record.job_dir))
        prefix = record.nnodes * record.nproc_per_node > 1
        streamer = threading.Thread(
            target=follow_attempts, args=(paths, plan.attempt, ranks, prefix, out, done), daemon=True
        )
        streamer.start()
    try:
        code = supervise(store, home(), record, plan, events=events)
    finally:
        done.set()
        if streamer:
            streamer.join()
    return store.get(record.id), code


def _spawn_supervisor(record: JobRecord, cwd: str) -> dict[str, Any]:
    return _spawn(["phalanx.launch.supervisor", record.id], JobPaths(Path(record.job_dir)).supervisor_log, cwd)


def submit_detached(spec: JobSpec, events: Callable[[str], None] | None = None) -> JobRecord:
    """Start ``spec`` in the background (survives this process and the terminal); returns at once
    (with ``--skip-if-done``, possibly the earlier job that makes this one unnecessary)."""
    check_storage(spec)
    done, inputs = check_done(spec)
    if done is not None:
        _skipped(done, events)
        return done
    preflight(spec)
    store = open_store()
    plan = plan_job(spec)
    record = create_job(store, spec, plan, inputs=inputs)
    store.update(record.id, **_spawn_supervisor(record, spec.workdir))
    return store.get(record.id)


def left_running(record: JobRecord) -> str | None:
    """For a LOST job: what of it a scheduler still runs without a supervisor ("SLURM job 4711"),
    or None. Asks the scheduler once; other states answer None without asking."""
    from .core.state import JobState
    from .launch.supervisor import find_leftover

    if record.state is not JobState.LOST:
        return None
    left = find_leftover(record)
    return left.where if left is not None else None


def resume(ref: str, detach: bool = False, out: TextIO | None = None, ranks: set[int] | None = None,
           events: Callable[[str], None] | None = None) -> tuple[JobRecord, int | None]:
    """Continue a failed, cancelled, preempted or lost job as a new attempt of the same job:
    same id, same state directory (so the script resumes from its last checkpoint). A lost job
    whose scheduler kept its attempt running is watched again instead (``resume_plan``)."""
    from .core.state import can_resume
    from .launch.supervisor import resume_plan

    store = open_store()
    record = get_job(ref, store)
    if not can_resume(record.state):
        hint = "it has finished successfully" if record.state is JobState.SUCCEEDED else "it is still running"
        raise UsageError(f"job {record.id} is {record.state.value}: nothing to resume", f"{hint}; see: phalanx status {record.id}")
    spec = read_spec(record)
    paths = JobPaths(Path(record.job_dir))
    plan = resume_plan(record, home())
    attempt = plan.attempt
    write_atomic(paths.plan, plan.to_json())
    if detach:
        if not store.reopen(record.id, attempt):
            raise PhalanxError(f"job {record.id} changed state meanwhile", "try again")
        store.update(record.id, **_spawn_supervisor(record, spec.workdir))
        return store.get(record.id), None
    if not store.reopen(record.id, attempt, **_identity()):
        raise PhalanxError(f"job {record.id} changed state meanwhile", "try again")
    return _supervise_here(store, store.get(record.id), plan, out, ranks, events)


def reconcile(store: Store, record: JobRecord) -> JobRecord:
    """Mark a job LOST when its supervisor is gone but the store says it runs."""
    if is_terminal(record.state):
        return record
    if record.supervisor_pid is None:
        if time.time() - record.created_at < 60:
            return record
        alive = False
    else:
        alive = _supervisor_alive(record)
    if alive:
        return record
    cause = {"message": f"the supervisor (pid {record.supervisor_pid}) vanished without recording an end", "exitcode": None}
    if store.transition(record.id, JobState.LOST, root_cause=json.dumps(cause)):
        return store.get(record.id)
    return store.get(record.id)


def _supervisor_alive(record: JobRecord) -> bool:
    import psutil

    try:
        proc = psutil.Process(record.supervisor_pid)
        return abs(proc.create_time() - (record.supervisor_started or 0)) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def get_job(ref: str, store: Store | None = None) -> JobRecord:
    store = store or open_store()
    return reconcile(store, store.find(ref))


def list_jobs(all_jobs: bool = False, limit: int | None = None, store: Store | None = None) -> list[JobRecord]:
    store = store or open_store()
    records = [reconcile(store, r) if not is_terminal(r.state) else r for r in store.list(active_only=not all_jobs, limit=limit)]
    return records if all_jobs else [r for r in records if not is_terminal(r.state)]


def stop(ref: str, timeout: float | None = None, events: Callable[[str], None] | None = None) -> JobRecord:
    """Stop a job gracefully: SIGTERM to every rank, the job's grace period, then SIGKILL.

    Idempotent: stopping a finished job returns its record unchanged. A LOST job (its
    supervisor vanished) may have left its scheduler's job running: that is stopped the same
    way, and the job stays LOST. Blocks until the job has ended. ``timeout`` (default grace +
    15 s) bounds the wait for the ranks to stop; once they all have, the supervisor is saving
    the outputs and the state, which takes as long as the upload does: that is waited for as
    long as the supervisor lives, and ``events`` hears about it once.
    """
    store = open_store()
    record = get_job(ref, store)
    if is_terminal(record.state):
        return _stop_leftover(store, record, events)
    spec = JobSpec.from_dict(json.loads(record.spec_json))
    # Mark first: the supervisor reads STOPPING as "the user cancelled" (not a preemption).
    store.transition(record.id, JobState.STOPPING)
    if record.supervisor_pid is None:
        store.transition(record.id, JobState.CANCELLED, exit_code=143)
        return store.get(record.id)
    try:
        os.kill(record.supervisor_pid, signal.SIGTERM)
    except ProcessLookupError:
        return _stop_leftover(store, reconcile(store, record), events)
    limit = timeout if timeout is not None else spec.grace + 15
    deadline = time.monotonic() + limit
    saving = False
    while True:
        record = reconcile(store, store.get(record.id))
        if is_terminal(record.state):
            return _stop_leftover(store, record, events)
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


def _ranks_ended(record: JobRecord) -> bool:
    """Every node of the job's current attempt has reported its end."""
    paths = JobPaths(Path(record.job_dir))
    return all(paths.node_result(record.attempt, n).exists() for n in range(record.nnodes))


def _stop_leftover(store: Store, record: JobRecord, events: Callable[[str], None] | None) -> JobRecord:
    """What a LOST job's scheduler still runs is stopped too (idempotent)."""
    if record.state is not JobState.LOST:
        return record
    from .launch.supervisor import stop_leftover

    stop_leftover(store, record, events)
    return store.get(record.id)


def wait(ref: str, timeout: float | None = None, poll: float = 0.2) -> JobRecord:
    """Block until the job ends; returns its record. Raises PhalanxError on timeout."""
    store = open_store()
    record = get_job(ref, store)
    deadline = None if timeout is None else time.monotonic() + timeout
    while not is_terminal(record.state):
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"job {record.id} still {record.state.value} after {timeout:g}s", "wait longer or check: phalanx status " + record.id)
        time.sleep(poll)
        record = reconcile(store, store.get(record.id))
    return record


class WaitTimeout(PhalanxError):
    exit_code = 124


@dataclass
class RankStatus:
    rank: int
    node_rank: int | None
    host: str | None
    pid: int | None
    exitcode: int | None
    signal: str | None
    state: str


def rank_statuses(record: JobRecord, attempt: int | None = None) -> list[RankStatus]:
    """Per-rank outcome of an attempt, read from the job directory."""
    paths = JobPaths(Path(record.job_dir))
    attempt = record.attempt if attempt is None else attempt
    failures: dict[int, dict[str, Any]] = {}
    node_codes: dict[int, int] = {}
    direct: dict[int, int] = {}
    for node_rank in range(record.nnodes):
        result = read_json(paths.node_result(attempt, node_rank))
        if result is None:
            continue
        node_codes[node_rank] = int(result["exitcode"])
        for f in result.get("failures", []):
            failures[int(f["rank"])] = f
        for rank, info in (result.get("ranks") or {}).items():
            direct[int(rank)] = int(info["exitcode"])
    out = []
    for rank in paths.ranks(attempt):
        proc = read_json(paths.rank_proc(attempt, rank)) or {}
        node = proc.get("node_rank")
        if rank in failures:
            code, sig, state = failures[rank]["exitcode"], failures[rank].get("signal"), "failed"
        elif rank in direct:
            code = direct[rank]
            sig = None
            state = "succeeded" if code == 0 else "stopped"
        elif node is not None and node in node_codes:
            code = 0 if node_codes[node] == 0 else None
            sig = None
            state = "succeeded" if code == 0 else "stopped"
        else:
            code, sig, state = None, None, "running" if not is_terminal(record.state) else "unknown"
        out.append(RankStatus(rank, node, proc.get("host"), proc.get("pid"), code, sig, state))
    return out


def log_paths(record: JobRecord, attempt: int | None = None, rank: int | None = None) -> list[tuple[int, Path]]:
    paths = JobPaths(Path(record.job_dir))
    attempt = record.attempt if attempt is None else attempt
    if attempt not in paths.attempts() and paths.attempts():
        raise UsageError(f"job {record.id} has no attempt {attempt}", f"attempts: {', '.join(map(str, paths.attempts()))}")
    ranks = paths.ranks(attempt)
    if rank is not None:
        if rank not in ranks and ranks:
            raise UsageError(f"job {record.id} has no rank {rank} in attempt {attempt}", f"ranks: 0..{max(ranks)}")
        ranks = [rank]
    return [(r, paths.rank_log(attempt, r)) for r in ranks]


def follow_logs(
    record: JobRecord, emit: Callable[[str], None], attempt: int | None = None, rank: int | None = None,
    follow: bool = False, poll: float = 0.2,
) -> JobRecord:
    """Emit the logs of an attempt (all ranks prefixed, or one rank raw); with ``follow``,
    keep emitting new lines until the job ends. Returns the latest record."""
    from .monitor.tail import RankTailer

    log_paths(record, attempt, rank)  # validates attempt and rank
    paths = JobPaths(Path(record.job_dir))
    latest = attempt is None
    attempt = record.attempt if attempt is None else attempt
    prefix = rank is None and record.nnodes * record.nproc_per_node > 1
    tailer = RankTailer(paths, attempt, {rank} if rank is not None else None, prefix=prefix)
    store = open_store()
    while True:
        record = reconcile(store, store.get(record.id))
        ended = is_terminal(record.state)
        moved_on = latest and follow and record.attempt != tailer.attempt
        lines = tailer.poll(final=ended or not follow or moved_on)
        if lines:
            emit("".join(tailer.format(r, line) + "\n" for r, line in lines))
        if moved_on:
            emit(f"--- attempt {record.attempt} ---\n")
            tailer = RankTailer(paths, record.attempt, tailer.ranks, prefix=prefix)
            continue
        if ended or not follow:
            return record
        time.sleep(poll)


def attempt_history(record: JobRecord) -> list[dict[str, Any]]:
    """One entry per finished attempt (outcome, exit code, retry decision), oldest first."""
    path = JobPaths(Path(record.job_dir)).attempts_log
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def read_spec(record: JobRecord) -> JobSpec:
    return JobSpec.from_dict(json.loads(record.spec_json))


# -- sweeps -------------------------------------------------------------------------


def run_sweep(spec: JobSpec, settings: Any, detach: bool = False, events: Callable[[str], None] | None = None) -> tuple[Any, int | None]:
    """Run a sweep over the search space written in ``spec``'s args; foreground unless ``detach``.

    Returns the sweep record and (foreground) the exit code: 0 when every trial ended."""
    from .sweeps.runner import SweepRunner, create_sweep

    check_storage(spec)
    store = open_store()
    sweep = create_sweep(store, home(), spec, settings)
    if detach:
        store.sweeps.update(sweep.id, **_spawn(["phalanx.sweeps.runner", sweep.id], Path(sweep.sweep_dir) / "runner.log", spec.workdir))
        return store.sweeps.get(sweep.id), None
    code = SweepRunner(store, home(), sweep, events).run()
    return store.sweeps.get(sweep.id), code


def _spawn(module_args: list[str], log_path: Path, cwd: str) -> dict[str, Any]:
    """Start ``python -m MODULE ARGS`` in its own session (survives the terminal)."""
    import psutil

    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", *module_args], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=cwd,
        )
    try:
        started = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess:
        started = time.time()
    return {"supervisor_pid": proc.pid, "supervisor_started": started}


def find_sweep(ref: str, store: Store | None = None) -> Any:
    """A sweep by id, id prefix or name, reconciled like a job; None if ``ref`` names no sweep."""
    store = store or open_store()
    sweep = store.sweeps.find(ref)
    if sweep is None or is_terminal(sweep.state) or sweep.supervisor_pid is None:
        return sweep
    if not _supervisor_alive(sweep):  # type: ignore[arg-type]
        store.sweeps.transition(sweep.id, JobState.LOST)
        return store.sweeps.get(sweep.id)
    return sweep


def list_sweeps(all_sweeps: bool = False, limit: int | None = None, store: Store | None = None) -> list[Any]:
    store = store or open_store()
    out = []
    for sweep in store.sweeps.list(active_only=not all_sweeps, limit=limit):
        if not is_terminal(sweep.state) and sweep.supervisor_pid is not None:
            sweep = find_sweep(sweep.id, store)
        if all_sweeps or not is_terminal(sweep.state):
            out.append(sweep)
    return out


def stop_sweep(sweep: Any, timeout: float | None = None) -> Any:
    """Cancel every running trial of a sweep and the sweep itself. Idempotent; blocks."""
    store = open_store()
    if is_terminal(sweep.state):
        return _stop_lost_trials(store, sweep)
    store.sweeps.transition(sweep.id, JobState.STOPPING)
    if sweep.supervisor_pid is not None:
        try:
            os.kill(sweep.supervisor_pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    spec = JobSpec.from_dict(json.loads(sweep.spec_json))
    deadline = time.monotonic() + (timeout if timeout is not None else spec.grace + 15)
    while time.monotonic() < deadline:
        current = find_sweep(sweep.id, store)
        if is_terminal(current.state):
            return _stop_lost_trials(store, current)
        time.sleep(0.1)
    raise PhalanxError(f"sweep {sweep.id} did not stop in time", f"its runner is pid {sweep.supervisor_pid}; try again")


def _stop_lost_trials(store: Store, sweep: Any) -> Any:
    """A LOST sweep's trials lost their runner too: stop what their scheduler still runs."""
    if sweep.state is JobState.LOST:
        for trial in store.trials(sweep.id):
            _stop_leftover(store, reconcile(store, trial), None)
    return sweep


def resume_sweep(sweep: Any, detach: bool = False, events: Callable[[str], None] | None = None) -> tuple[Any, int | None]:
    """Run what did not finish: unfinished trials continue, untried ones start."""
    from .core.state import can_resume
    from .sweeps.runner import SweepRunner

    store = open_store()
    if not can_resume(sweep.state):
        raise UsageError(f"sweep {sweep.id} is {sweep.state.value}: nothing to resume", f"see: phalanx sweep show {sweep.id}")
    spec = JobSpec.from_dict(json.loads(sweep.spec_json))
    if detach:
        if not store.sweeps.reopen(sweep.id):
            raise PhalanxError(f"sweep {sweep.id} changed state meanwhile", "try again")
        store.sweeps.update(sweep.id, **_spawn(["phalanx.sweeps.runner", sweep.id], Path(sweep.sweep_dir) / "runner.log", spec.workdir))
        return store.sweeps.get(sweep.id), None
    if not store.sweeps.reopen(sweep.id, **_identity()):
        raise PhalanxError(f"sweep {sweep.id} changed state meanwhile", "try again")
    code = SweepRunner(store, home(), store.sweeps.get(sweep.id), events).run()
    return store.sweeps.get(sweep.id), code
