"""Before a job runs: its checks (storage reachable, ``--skip-if-done``), its plan (facts
gathered, then the pure plan), and its record and directory (PENDING; nothing runs yet)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from .. import config
from ..backends.base import Backend
from ..backends.registry import get_backend
from ..core import disk
from ..core.paths import HomePaths, JobPaths, read_json, write_atomic, write_json
from ..core.plan import Plan
from ..core.spec import JobSpec
from ..core.state import JobState
from ..errors import DiskFull, PhalanxError
from ..storage.statedir import for_job
from ..store import JobRecord, Store, open_store


def new_job_id(home: HomePaths) -> str:
    """A fresh job (or sweep) id, checked against every id the store ever handed out, and
    against the directories of jobs and sweeps a store that was moved aside left behind."""
    disk.need(home.root, disk.START_BYTES, "a new job's files and row")  # before the store is written
    store = open_store(home.db)
    while True:
        job_id = store.new_id()
        if not home.job(job_id).root.exists() and not home.sweep_dir(job_id).exists():
            return job_id


def plan_attempt(backend: Backend, spec: JobSpec, job_id: str, attempt: int, home: HomePaths) -> Plan:
    """Facts (the one impure look-up: free ports, addresses), then the pure plan; its Python
    processes then start from the warm pool where the spec and the backend allow it."""
    plan = backend.plan(spec, job_id, attempt, home, backend.facts(spec))
    if spec.warm and backend.warm_starts:
        from ..launch.warm import plan as warm

        plan = warm.apply(plan, spec, warm.facts())
    return plan


def plan_job(spec: JobSpec, home: HomePaths, job_id: str | None = None, attempt: int = 0) -> Plan:
    """The plan ``submit`` would execute (what ``--dry-run`` prints), with the job's state key
    fixed (``statedir.for_job``) as ``create_job`` records it. Starts nothing."""
    job_id = job_id or new_job_id(home)
    return plan_attempt(get_backend(spec.backend), for_job(spec, job_id), job_id, attempt, home)


def check_storage(spec: JobSpec, home: HomePaths, backend: bool = True) -> None:
    """Reach every store the job names, and let the backend check what it needs from the
    outside world, before anything starts (a typo should not cost a run). ``backend=False``
    (``--dry-run``): the stores only; a dry run plans offline, without the backend's cluster or
    credentials."""
    # every secret exists and may be read (the values are dropped at once)
    get_backend(spec.backend).check_secrets(spec, online=backend)
    if backend:
        get_backend(spec.backend).check(spec)
    if spec.state_uri:
        from ..storage.state import StateSync

        StateSync(home.state_dir(spec.state_key), spec.state_uri).check()
    if spec.channels:
        from ..storage import channels

        channels.check(spec)
    if spec.output_uri:
        from ..storage import outputs

        outputs.check(spec)


def check_done(spec: JobSpec, store: Store, home: HomePaths) -> tuple[JobRecord | None, dict[str, Any] | None]:
    """``--skip-if-done``: the latest successful job of this name when it ran with the same
    inputs (code, command, input data), and the fingerprint of this spec's inputs."""
    if not spec.skip_if_done:
        return None, None
    from ..storage.inputs import fingerprint

    inputs = fingerprint(spec, home)
    last = store.latest(spec.name, JobState.SUCCEEDED)
    if last is not None and (read_json(last.paths.inputs) or {}).get("digest") == inputs["digest"]:
        return last, inputs
    return None, inputs


def create_job(store: Store, home: HomePaths, spec: JobSpec, plan: Plan, inputs: dict[str, Any] | None = None,
               **columns: Any) -> JobRecord:
    """Record the job (PENDING) and lay out its directory (with the code snapshot). Nothing runs yet.
    ``columns``: more of the job's row (the supervisor's identity, a trial's sweep and params,
    who submitted it: ``user_name``, this process's user unless given).

    All or nothing, even when killed: the directory is laid out under ``staging/`` and moved into
    ``jobs/`` inside the transaction that inserts the row, so a crash or a full disk leaves no
    job directory without its row nor the reverse (``clear_staging`` removes what a killed
    submit left in ``staging/``)."""
    from ..core.identity import DEFAULT_PROJECT
    from .admission import needs

    spec = for_job(spec, plan.job_id)
    columns.setdefault("user_name", config.user())
    columns.setdefault("project", spec.project or DEFAULT_PROJECT)
    columns.setdefault("priority", spec.priority)
    columns["gpus"], columns["cpus"] = needs(spec)
    spec_json = json.dumps(spec.to_dict(), sort_keys=True)
    plan_json = plan.to_json()
    needed = disk.RESERVE_BYTES + 2 * len(spec_json) + len(plan_json) + 64 * 1024  # + a few store pages
    disk.need(home.root, needed, f"the files of job {plan.job_id}")
    clear_staging(home)
    final = home.job(plan.job_id)
    staged = JobPaths(home.staging / f"{plan.job_id}.{os.getpid()}")
    try:
        staged.root.mkdir(parents=True)
        final.root.parent.mkdir(parents=True, exist_ok=True)
        staged.output_dir.mkdir()
        if spec.snapshot:
            from ..storage.snapshot import snapshot_job

            snapshot_job(spec, staged, home.root)
        if inputs is not None:
            write_json(staged.inputs, inputs)
        home.state_dir(spec.state_key).mkdir(parents=True, exist_ok=True)
        write_json(staged.spec, spec.to_dict())
        write_atomic(staged.plan, plan_json)
        store.insert_job(
            then=lambda: os.rename(staged.root, final.root),  # fails when the id's directory exists
            undo=lambda: os.rename(final.root, staged.root),  # the commit failed: staged again, removed below
            id=plan.job_id,
            name=spec.name,
            backend=spec.backend,
            nnodes=spec.resources.nnodes,
            nproc_per_node=spec.resources.nproc_per_node,
            command=spec.entrypoint.display(),
            job_dir=str(final.root),
            spec_json=spec_json,
            **columns,
        )
    except BaseException as exc:
        shutil.rmtree(staged.root, ignore_errors=True)
        if disk.is_full(exc):
            raise _full_at_submit(exc, spec, home, needed) from exc
        raise
    if spec.tags:  # issue 16: the job's labels, indexed for ps and the dashboard
        from ..store.listing import set_tags

        set_tags(store, plan.job_id, dict(spec.tags))
    return store.get(plan.job_id)


def _full_at_submit(exc: BaseException, spec: JobSpec, home: HomePaths, needed: int) -> DiskFull:
    """The disk filled while the job was being laid out: what it needed (its code snapshot at
    most, the job files, the reserve) against what is free; nothing of the job is left."""
    code = 0
    if spec.snapshot:
        from ..storage.snapshot import preflight

        try:
            code = preflight(spec, home.root).nbytes
        except PhalanxError:
            code = 0
    full = disk.as_disk_full(exc, None, home.root)
    return DiskFull(full.what, full.where, f": starting the job needs about {disk.size(needed + code)} "
                    f"(code snapshot {disk.size(code)}), {disk.size(disk.free_bytes(home.root))} free; nothing was started")


def clear_staging(home: HomePaths) -> None:
    """Remove what killed submits left in ``staging/`` (their pid is gone)."""
    try:
        names = os.listdir(home.staging)
    except FileNotFoundError:
        return
    for name in names:
        pid = name.rpartition(".")[2]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(home.staging / name, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_state(spec: JobSpec, home: HomePaths) -> Path | None:
    """``--clean-state``: move the job name's state directory aside (never delete a checkpoint);
    with a state URI, mark the remote copy empty. Returns where the old state went. A job's own
    state directory (no ``--name``, no ``--state``) is new and empty: nothing to do."""
    if not spec.state_name:
        return None
    state = home.state_dir(spec.state_key)
    moved = None
    if state.exists() and any(state.iterdir()):
        moved = home.previous_state(spec.state_key, f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}")
        moved.parent.mkdir(parents=True, exist_ok=True)
        os.replace(state, moved)
    if spec.state_uri:
        from ..storage.state import StateSync

        StateSync(state, spec.state_uri).reset()
    return moved
