"""Views of jobs and sweeps: what ``ps``, ``status``, ``logs``, ``metrics`` and the dashboard
show. They never act on a job. One kind of write happens here, and only for jobs whose supervisor
runs in a cluster (k8s ``--in-cluster``): ``find_job`` and ``refresh_hosted`` copy their record
from where they run into this home (the store row, the job's files and its state directory), as any read of them
must.

A job whose supervisor vanished is shown LOST at once (``supervise.liveness.effective``); the
first command that acts on it (``resume``, ``stop``) records that.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from .. import config
from ..core.paths import HomePaths, read_json
from ..core.state import JobState, is_terminal
from ..errors import UsageError
from ..store import JobRecord, Store
from ..supervise.liveness import effective
from ..store import open_store as open_store_at

if TYPE_CHECKING:
    from ..core.contracts import SchedulerRecord
    from ..core.spec import JobSpec
    from ..store.sweeps import SweepRecord
    from .failure import Failure


def home() -> HomePaths:
    return HomePaths(config.home())


def open_store() -> Store:
    return open_store_at(home().db)


# -- jobs and sweeps ----------------------------------------------------------------------------


def get_job(ref: str, store: Store | None = None, projects: Sequence[str] | None = None) -> JobRecord:
    """A job by id, unique id prefix or name (the latest of that name), as it stands now.
    ``projects``: only jobs of these exist for the lookup (``Store.find``)."""
    store = store or open_store()
    return effective(find_job(ref, store, projects))


def supervised_where(record: JobRecord) -> str:
    """Where the supervisor of a job supervised away from here (k8s ``--in-cluster``) runs, in words."""
    from ..backends.registry import get_backend

    return get_backend(record.backend).describe_hosted(record)


def find_job(ref: str, store: Store, projects: Sequence[str] | None = None) -> JobRecord:
    """``store.find``, and jobs whose backend runs their supervisor (k8s ``--in-cluster``): their
    record is brought up to date from there, and a job id this home never saw is looked for
    with every backend that hosts supervisors."""
    from ..backends.builtin import HOSTS_SUPERVISORS
    from ..backends.registry import get_backend
    from ..errors import JobNotFound
    from ..supervise.liveness import elsewhere

    try:
        record = store.find(ref, projects)
    except JobNotFound:
        if projects is not None:  # a job brought from a cluster is checked like any other
            for name in HOSTS_SUPERVISORS:
                found = get_backend(name).find_hosted(ref, store, home())
                if found is not None and found.project in projects:
                    return found
            raise
        for name in HOSTS_SUPERVISORS:
            found = get_backend(name).find_hosted(ref, store, home())
            if found is not None:
                return found
        raise
    if elsewhere(record) and not is_terminal(record.state):
        return get_backend(record.backend).refresh_hosted(store, record, home())
    return record


def refresh_hosted(store: Store, backend: str | None) -> None:
    """Before a listing: with ``backend`` one that hosts supervisors, every job it supervises
    (imported from where it runs, for a machine that never saw them); otherwise this home's
    active jobs supervised away from here, brought up to date."""
    from ..backends.builtin import HOSTS_SUPERVISORS
    from ..backends.registry import get_backend
    from ..supervise.liveness import elsewhere

    if backend in HOSTS_SUPERVISORS:
        get_backend(backend).import_hosted(store, home())
        return
    for record in [r for r in store.iter(active_only=True) if elsewhere(r)]:
        get_backend(record.backend).refresh_hosted(store, record, home())


def list_jobs(all_jobs: bool = False, limit: int | None = None, store: Store | None = None) -> list[JobRecord]:
    """Jobs newest first: those still running, or all of them (at most ``limit``)."""
    return list(iter_jobs(all_jobs, limit, store))


def iter_jobs(all_jobs: bool = False, limit: int | None = None, store: Store | None = None) -> Iterator[JobRecord]:
    """``list_jobs``, read from the store a page at a time (memory stays flat at any length)."""
    store = store or open_store()
    for record in store.iter(active_only=not all_jobs, limit=limit):
        record = effective(record)
        if all_jobs or not is_terminal(record.state):
            yield record


def find_sweep(ref: str, store: Store | None = None, projects: Sequence[str] | None = None) -> SweepRecord | None:
    """A sweep by id, id prefix or name, as it stands now; None if ``ref`` names no sweep
    (``projects``: of these projects)."""
    store = store or open_store()
    sweep = store.sweeps.find(ref, projects)
    return None if sweep is None else effective(sweep)


def list_sweeps(all_sweeps: bool = False, limit: int | None = None, store: Store | None = None) -> list[SweepRecord]:
    store = store or open_store()
    sweeps = [effective(s) for s in store.sweeps.list(active_only=not all_sweeps, limit=limit)]
    return sweeps if all_sweeps else [s for s in sweeps if not is_terminal(s.state)]


def trials(sweep: SweepRecord, store: Store | None = None) -> list[JobRecord]:
    """A sweep's trial jobs in trial order, as they stand now (LOST with their runner)."""
    store = store or open_store()
    return [effective(t) for t in store.trials(sweep.id)]


def read_spec(record: JobRecord) -> "JobSpec":
    return record.spec


def left_running(record: JobRecord) -> str | None:
    """For a LOST job: what of it a scheduler still runs without a supervisor ("SLURM job 4711"),
    or None. Asks the scheduler once; other states answer None without asking."""
    if record.state is not JobState.LOST:
        return None
    from ..supervise import leftover  # asks the backend: only for a LOST job

    left = leftover.find(record)
    return left.where if left is not None else None


def resolve_job_input(uri: str) -> str:
    """``job:NAME_OR_ID[/output|/state]`` -> where that job's results are: its output directory
    (or the uploaded copy), or its state directory. A name means its latest successful run."""
    ref, _, part = uri[len("job:"):].partition("/")
    part = part.strip("/") or "output"
    if not ref or part not in ("output", "state"):
        raise UsageError(f"invalid job reference '{uri}'", "use job:NAME_OR_ID, job:NAME_OR_ID/output or job:NAME_OR_ID/state")
    store = open_store()
    latest = store.latest(ref)
    record = store.latest(ref, JobState.SUCCEEDED) if latest else store.find(ref)
    if record is None:
        assert latest is not None
        raise UsageError(f"'{uri}': no run of '{ref}' has succeeded (the latest, job {latest.id}, is {latest.state.value})",
                         f"run it first; see: phalanx status {latest.id}")
    if record.state is not JobState.SUCCEEDED:
        raise UsageError(f"'{uri}': job {record.id} is {record.state.value}, so its {part} may be incomplete",
                         "refer to a job that succeeded")
    if part == "state":
        return str(home().state_dir(record.spec.state_key))
    from ..storage.outputs import job_output_source

    return job_output_source(record.paths)


def artifacts(record: JobRecord) -> Any:
    """What the job produced (``storage.outputs.Artifacts``): uploaded, or in its job directory."""
    from ..storage.outputs import artifacts as read_artifacts

    return read_artifacts(record.paths)


def trackers(record: JobRecord) -> list[dict[str, Any]]:
    """The job's tracker runs (``--track``): per tracker its run id, link, the points sent,
    waiting and dropped, the last error, and whether its exporter still runs."""
    from ..track.conventions import describe, read_state

    spec = read_spec(record)
    out = []
    for kind in spec.track:
        state = read_state(record.paths, kind)
        alive = _exporter_alive(state.pid)
        out.append({"kind": kind, "run_id": state.run_id, "url": state.url, "sent": state.sent,
                    "waiting": state.waiting, "dropped": state.dropped, "error": state.error,
                    "finished": state.finished, "exporter_running": alive, "line": describe(state, alive)})
    return out


def sweep_tracker(sweep: "SweepRecord") -> str:
    """The link to a sweep's parent MLflow run (created by its first tracked trial), or ''."""
    state = read_json(Path(sweep.sweep_dir) / "track" / "mlflow.json") or {}
    return str(state.get("url") or "")


def _exporter_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"phalanx.supervise.exporter" in fh.read()
    except OSError:
        return False


# -- inside a job -------------------------------------------------------------------------------


def attempt_history(record: JobRecord) -> list[dict[str, Any]]:
    """One entry per ended attempt (outcome, exit code, retry decision), oldest first. An
    attempt that ended unseen (the job is LOST) shows as lost before anyone records it."""
    from ..core.contracts import read_attempts
    from ..supervise import history

    paths = record.paths
    entries = read_attempts(paths.attempts_log)
    if record.state is JobState.LOST and record.attempt not in {e.attempt for e in entries} \
            and paths.attempt(record.attempt).exists():
        entries.append(history.lost_record(paths, record.attempt))
    return [e.to_dict() for e in entries]


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
    from ..core.contracts import read_node_result

    paths = record.paths
    attempt = record.attempt if attempt is None else attempt
    failures: dict[int, tuple[int, str | None]] = {}
    node_codes: dict[int, int] = {}
    direct: dict[int, int] = {}
    for node_rank in range(record.nnodes):
        result = read_node_result(paths.node_result(attempt, node_rank))
        if result is None:
            continue
        node_codes[node_rank] = result.exitcode
        for f in result.failures:
            failures[f.rank] = (f.exitcode, f.signal)
        for rank, info in result.ranks.items():
            direct[rank] = info.exitcode
    out = []
    for rank in paths.ranks(attempt):
        proc = read_json(paths.rank_proc(attempt, rank)) or {}
        node = proc.get("node_rank")
        code: int | None
        sig: str | None = None
        if rank in failures:
            (code, sig), state = failures[rank], "failed"
        elif rank in direct:
            code = direct[rank]
            state = "succeeded" if code == 0 else "stopped"
        elif node is not None and node in node_codes:
            code = 0 if node_codes[node] == 0 else None
            state = "succeeded" if code == 0 else "stopped"
        else:
            code, state = None, "running" if not is_terminal(record.state) else "unknown"
        out.append(RankStatus(rank, node, proc.get("host"), proc.get("pid"), code, sig, state))
    return out


def log_paths(record: JobRecord, attempt: int | None = None, rank: int | None = None) -> list[tuple[int, Path]]:
    paths = record.paths
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
    follow: bool = False, poll: float = 0.2, offsets: dict[int, int] | None = None,
    failed: Failure | None = None,
) -> JobRecord:
    """Emit the logs of an attempt (all ranks prefixed, or one rank raw); with ``follow``,
    keep emitting new lines until the job ends (woken by the files changing, not polling
    them). ``offsets``: where each rank's log is read from (``logs --tail/--since``).
    ``failed``: how the attempt failed (``failure.failure``): its root-cause rank comes first,
    the traces of the ranks that lost their peer are folded. Returns the latest record."""
    from ..monitor.tail import follow_job

    log_paths(record, attempt, rank)  # validates attempt and rank
    latest = attempt is None
    store = open_store()

    def refresh() -> tuple[int, bool]:
        nonlocal record
        record = effective(store.get(record.id))
        return record.attempt, is_terminal(record.state)

    follow_job(record.paths, record.attempt if attempt is None else attempt, {rank} if rank is not None else None,
               rank is None and record.nnodes * record.nproc_per_node > 1, emit, refresh, follow, latest,
               also=[home().db], interval=poll, offsets=offsets,
               order=[failed.rank] if failed is not None else (), folds=failed.folds() if failed is not None else None)
    return record


def log_offsets(record: JobRecord, attempt: int | None, rank: int | None, tail: int | None, since: str | None,
                say: Callable[[str], None]) -> dict[int, int]:
    """Where each rank's log of the attempt is read from for ``--tail N`` / ``--since T``
    (both: the later of the two)."""
    from ..monitor.logindex import parse_since, since_offset, tail_offset

    paths = record.paths
    attempt = record.attempt if attempt is None else attempt
    when = parse_since(since) if since else None
    out: dict[int, int] = {}
    missing = False
    for r in paths.ranks(attempt):
        if rank is not None and r != rank:
            continue
        offset = 0
        if tail is not None:
            offset = tail_offset(paths.rank_log(attempt, r), tail)
        if when is not None:
            found = since_offset(paths, attempt, r, when)
            missing = missing or found is None
            offset = max(offset, found or 0)
        out[r] = offset
    if missing:
        say(f"job {record.id} was recorded without a log index (older phalanx): --since shows its whole log")
    return out


def scheduler_job(record: JobRecord) -> SchedulerRecord | None:
    """The scheduler's record of the job's current attempt (``scheduler.json``: its SLURM or Ray
    job id, where it runs), or None when the backend has none."""
    from ..core.contracts import read_scheduler

    return read_scheduler(record.paths.scheduler_job(record.attempt))


def health(record: JobRecord) -> dict[str, Any]:
    """The job's progress and ETA, its straggler (while it runs), the anomaly that stopped it and
    its stop clocks, as its supervisor last wrote them (``health.json``), with their words."""
    from ..health.progress_file import shown

    return shown(record.paths.health, not is_terminal(record.state))


def platform_state(record: JobRecord) -> str | None:
    """What the platform itself says of a running job, in a word, for ``ps`` (SageMaker's
    secondary status: Starting, Training, ...); None for backends that say nothing more."""
    if record.backend != "sagemaker" or record.exit_code is not None:
        return None
    from ..backends.sagemaker.report import ps_state  # standard library only: no boto3

    return ps_state(record.paths, record.attempt)


def platform_lines(record: JobRecord) -> list[str]:
    """Lines ``status`` adds for a platform that reports more than the job's state (SageMaker:
    its status, failure reason, billable time)."""
    if record.backend != "sagemaker":
        return []
    from ..backends.sagemaker.report import status_lines

    return status_lines(record.paths, record.attempt)
