"""Admission: a job starts only while its project's quota has room (concurrent GPUs, CPUs, jobs);
otherwise it is QUEUED, saying why ("waiting for quota: 8/8 GPUs of project vision in use"), and
starts by itself when capacity frees, higher ``--priority`` first, then in the order jobs were
submitted. A step of the supervisor before a job's first attempt (``JobRun.start``).

- **admit** (a job about to start): in one unit of work, read what the project's admitted jobs
  hold and how many queued jobs come first; admit the job if nothing is ahead and it fits, else
  queue it. A detached supervisor whose job is queued exits (1,000 queued jobs are 1,000 rows,
  not 1,000 processes); a foreground run and a sweep's runner wait for theirs.
- **advance** (capacity freed: a job ended, a quota was raised, a queued job was stopped): walk
  each project's queue in order and admit while the head fits (strict order: a big job at the head
  is never passed by smaller ones, so it cannot starve), then start a supervisor for each admitted
  job nobody waits for. It runs in the process that freed the capacity (the ending job's
  supervisor, the CLI, the server), and a team server also runs it every few seconds.
- A project whose cluster has a queueing engine of its own (a Kueue LocalQueue on Kubernetes, a
  SLURM account or QOS) leaves those jobs to it: they are not admitted here and do not count.

Two passes, or a pass and a new job, never admit on the same stale numbers: each is one write
transaction (``store/tx.py``).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

from ..core.spec import JobSpec
from ..core.state import JobState
from ..store import JobRecord, Store
from ..store import queue as q
from ..store import tx
from ..store.teams import ProjectRecord, ProjectTable
from . import liveness

ENGINES = {"k8s": "kueue_queue", "slurm": ("slurm_account", "slurm_qos")}
_PHALANX_BACKENDS = "local, ssh, ray, skypilot, sagemaker"


@dataclass(frozen=True)
class Use:
    jobs: int = 0
    gpus: int = 0
    cpus: int = 0

    def plus(self, gpus: int, cpus: int) -> Use:
        return Use(self.jobs + 1, self.gpus + gpus, self.cpus + cpus)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    admitted: bool
    reason: str = ""  # why it waits (or why it never can start)
    place: int = 0  # 1: next to start
    never: bool = False  # it can never start as asked (over the quota itself, its project gone)


# -- what a job asks for ---------------------------------------------------------------------------


def needs(spec: JobSpec) -> tuple[int, int]:
    """(GPUs, CPUs) a job holds while it runs: the GPUs its backend options declare per node
    (SLURM/Kubernetes/Ray ``--gpus-per-node``, SkyPilot ``--gpus``, a SageMaker instance type);
    else one per process, as phalanx packs them (on this machine at most as many as it has); one
    CPU per process (Ray: ``--cpus-per-node``)."""
    import math

    from ..launch.host import gpu_count
    from ..monitor.accounting import declared_gpus

    res = spec.resources
    options = dict(spec.backend_options or {})
    declared, _ = declared_gpus(spec.backend, options)
    if declared is None and options.get("gpus_per_node") is not None:
        declared = int(options["gpus_per_node"])
    if declared is not None:
        gpus = declared * res.nnodes
    elif spec.backend == "local":
        gpus = res.nnodes * min(res.nproc_per_node, gpu_count(os.environ))
    else:
        gpus = res.world_size
    if spec.backend == "ray" and options.get("cpus_per_node") is not None:
        cpus = res.nnodes * int(math.ceil(float(options["cpus_per_node"])))
    else:
        cpus = res.world_size
    return gpus, cpus


def engine_backends(project: ProjectRecord) -> tuple[str, ...]:
    """The backends whose jobs of this project another queueing engine admits."""
    out = []
    if project.kueue_queue:
        out.append("k8s")
    if project.slurm_account or project.slurm_qos:
        out.append("slurm")
    return tuple(out)


def applies(project: ProjectRecord | None, backend: str) -> bool:
    return project is not None and project.has_quota and backend not in engine_backends(project)


def enforcement(project: ProjectRecord) -> list[str]:
    """Which engine enforces what, in words (``server project set`` prints it)."""
    limits = [f"{n} {what}" for n, what in ((project.max_gpus, "GPUs"), (project.max_cpus, "CPUs"),
                                            (project.max_jobs, "jobs")) if n is not None]
    quota = ", ".join(limits) if limits else "no concurrency limit"
    engines = engine_backends(project)
    lines = [f"{quota}: phalanx's admission on {_PHALANX_BACKENDS}"
             + ("" if "k8s" in engines else ", kubernetes") + ("" if "slurm" in engines else ", slurm")]
    if project.kueue_queue:
        lines.append(f"kubernetes: Kueue LocalQueue {project.kueue_queue} (its ClusterQueue's quota; "
                     "phalanx shows Kueue's admission state)")
    if project.slurm_account or project.slurm_qos:
        what = " and ".join(x for x in (f"account {project.slurm_account}" if project.slurm_account else "",
                                        f"QOS {project.slurm_qos}" if project.slurm_qos else "") if x)
        lines.append(f"slurm: {what} (SLURM's limits; phalanx shows its pending reason)")
    if project.budget is not None:
        lines.append(f"budget {project.budget:g} {project.budget_unit} per calendar month: phalanx, when a job is "
                     "submitted (no scheduler knows it); running jobs are never stopped by it")
    return lines


def _limits(project: ProjectRecord, use: Use, gpus: int, cpus: int) -> Iterable[tuple[int | None, int, int, str]]:
    return ((project.max_gpus, use.gpus, gpus, "GPUs"), (project.max_cpus, use.cpus, cpus, "CPUs"),
            (project.max_jobs, use.jobs, 1, "jobs"))


def too_big(project: ProjectRecord, gpus: int, cpus: int) -> str:
    """Why a job can never start in this project's quota, even alone ('': it can)."""
    for limit, _, want, what in _limits(project, Use(), gpus, cpus):
        if limit is not None and want > limit:
            return f"the job needs {want} {what} and project {project.name} allows at most {limit} at once"
    return ""


def blocked(project: ProjectRecord, use: Use, gpus: int, cpus: int) -> str:
    """Why a job asking for ``gpus``/``cpus`` cannot start next to ``use`` ('': it fits)."""
    for limit, used, want, what in _limits(project, use, gpus, cpus):
        if limit is not None and used + want > limit:
            return f"waiting for quota: {used}/{limit} {what} of project {project.name} in use" + \
                (f" (it needs {want})" if want > 1 else "")
    return ""


# -- decisions ------------------------------------------------------------------------------------


def _use(t: tx.Tx, project: ProjectRecord) -> Use:
    """What the project's admitted jobs hold; one whose supervisor vanished is recorded LOST
    first (it holds nothing any more)."""
    use = Use()
    for record in q.holders(t, project.name, engine_backends(project)):
        if liveness.is_lost(record):
            t.execute("UPDATE jobs SET state = ?, ended_at = ?, root_cause = ? WHERE id = ? AND state = ?",
                      [JobState.LOST.value, time.time(), liveness.lost_cause(record), record.id, record.state.value])
            continue
        use = use.plus(record.gpus, record.cpus)
    return use


def admit(store: Store, record: JobRecord, waiter: dict[str, Any] | None = None) -> Decision:
    """Admit ``record`` (PENDING, or QUEUED with a waiter asking again) or queue it. ``waiter``:
    the identity of the process that will wait for it (None: nobody, it exits)."""
    project = store.projects.get(record.project)
    if project is None:
        return Decision(False, f"its project '{record.project}' does not exist", never=True)
    if not applies(project, record.backend):
        return Decision(True)

    def unit(t: tx.Tx) -> Decision:
        now = q.job(t, record.id)
        current = ProjectTable.read(t, record.project)
        if now is None or current is None:
            return Decision(False, f"its project '{record.project}' does not exist", never=True)
        if now.admitted_at is not None:
            return Decision(True)
        if too_big(current, now.gpus, now.cpus):
            return Decision(False, too_big(current, now.gpus, now.cpus), never=True)
        before = q.ahead(t, current.name, now.priority, now.created_at, now.id)
        why = blocked(current, _use(t, current), now.gpus, now.cpus)
        if before == 0 and not why:
            q.admit(t, now.id, time.time())
            return Decision(True)
        if now.state is JobState.PENDING:
            q.enqueue(t, now.id, waiter or {})
        return Decision(False, why or f"waiting for {before} job(s) of project {current.name} ahead of it", before + 1)

    return tx.atomic(store, unit)


def advance(store: Store, projects: Iterable[str] | None = None) -> list[str]:
    """Admit what now fits, in each project's queue order, and start a supervisor for each
    admitted job nobody waits for. Returns the ids admitted."""
    names = list(projects) if projects is not None else None

    def unit(t: tx.Tx) -> list[q.Queued]:
        admitted: list[q.Queued] = []
        for name in names if names is not None else q.projects_waiting(t):
            project = ProjectTable.read(t, name)
            if project is None or not project.has_quota:
                continue
            use = _use(t, project)
            for job in q.waiting(t, name, engine_backends(project)):
                waiter_gone = liveness.gone_here(job)
                if job.sweep_id is not None and waiter_gone:
                    # its sweep's runner vanished: the sweep's resume picks the trial up again
                    q.end_queued(t, job.id, JobState.LOST, "its sweep's runner vanished while it was queued", None)
                    continue
                big = too_big(project, job.gpus, job.cpus)
                if big:  # a quota lowered under it: it would block the queue for ever
                    q.end_queued(t, job.id, JobState.FAILED, f"could not start: {big}", 1)
                    continue
                if blocked(project, use, job.gpus, job.cpus):
                    break
                if q.admit(t, job.id, time.time()):
                    use = use.plus(job.gpus, job.cpus)
                    admitted.append(job)
        return admitted

    if names is not None and not any(_quota(store, n) for n in names):
        return []
    admitted = tx.atomic(store, unit)
    for job in admitted:
        if liveness.gone_here(job):  # a waiter on another machine sees its admission itself
            _start_supervisor(store, job.id)
    return [job.id for job in admitted]


def _quota(store: Store, name: str) -> bool:
    found = store.projects.get(name)
    return found is not None and found.has_quota


def _start_supervisor(store: Store, job_id: str) -> None:
    """A detached supervisor for an admitted job whose own exited while it was queued."""
    from .detached import spawn_supervisor

    record = store.get(job_id)
    store.update(job_id, **spawn_supervisor(record, record.spec.workdir))


def cancel_queued(store: Store, project: str, why: str) -> list[str]:
    """Every queued job of ``project`` CANCELLED with ``why`` (its project was removed)."""
    def unit(t: tx.Tx) -> list[str]:
        ids = q.queued_ids(t, project)
        return [i for i in ids if q.end_queued(t, i, JobState.CANCELLED, f"cancelled while queued: {why}", 143)]

    return tx.atomic(store, unit)


def stop_queued(store: Store, record: JobRecord, who: str) -> bool:
    """``phalanx stop`` of a job that waits in its queue: CANCELLED at once (nothing of it runs);
    the queue behind it moves up. False: it was admitted or ended meanwhile."""
    done = tx.atomic(store, lambda t: q.end_queued(t, record.id, JobState.CANCELLED,
                                                    f"stopped by {who} while queued", 143)
                     if (q.job(t, record.id) or record).admitted_at is None else False)
    if done:
        advance(store, [record.project])
    return done


# -- views ----------------------------------------------------------------------------------------


def in_use(store: Store, project: str) -> Use:
    found = store.projects.get(project)
    skip = engine_backends(found) if found is not None else ()
    use = Use()
    for record in _holders(store, project, skip):
        if not liveness.is_lost(record):
            use = use.plus(record.gpus, record.cpus)
    return use


def _holders(store: Store, project: str, skip: Sequence[str]) -> list[JobRecord]:
    from ..store.records import COLUMNS, from_row

    extra = f" AND backend NOT IN ({', '.join('?' for _ in skip)})" if skip else ""
    sql = f"SELECT {', '.join(COLUMNS)} FROM jobs WHERE project = ? AND {q.HOLDS}{extra}"
    return [from_row(r) for r in tx.rows(store, sql, [project, *skip])]


def queued_count(store: Store, project: str) -> int:
    found = tx.rows(store, f"SELECT COUNT(*) FROM jobs WHERE project = ? AND {q.WAITS}", [project])
    return int(found[0][0])


def places(store: Store, projects: Iterable[str]) -> dict[str, tuple[int, int]]:
    """job id -> (its place in its project's queue, the queue's length), for the given projects."""
    out: dict[str, tuple[int, int]] = {}
    for name in projects:
        found = store.projects.get(name)
        skip = engine_backends(found) if found is not None else ()
        waiting = [r[0] for r in tx.rows(
            store, f"SELECT id FROM jobs WHERE project = ? AND {q.WAITS}"
            + (f" AND backend NOT IN ({', '.join('?' for _ in skip)})" if skip else "")
            + " ORDER BY priority DESC, created_at, id", [name, *skip])]
        out.update({job_id: (i + 1, len(waiting)) for i, job_id in enumerate(waiting)})
    return out


def waiting_line(store: Store, record: JobRecord) -> str | None:
    """Why a QUEUED job waits and its place, as ``status`` shows it (None: it does not wait)."""
    if record.state is not JobState.QUEUED:
        return None
    if record.admitted_at is not None:
        return "admitted: its supervisor is starting"
    project = store.projects.get(record.project)
    if project is None:
        return f"its project '{record.project}' no longer exists"
    place = places(store, [record.project]).get(record.id, (0, 0))
    why = blocked(project, in_use(store, project.name), record.gpus, record.cpus)
    if not why:
        why = f"waiting behind {place[0] - 1} job(s) of project {project.name}" if place[0] > 1 else \
            "waiting for the queue to admit it"
    return f"{why}; place {place[0]} of {place[1]}"
