"""``python3 -m phalanx.backends.kubernetes.supervisor JOB_ID``: a job's supervisor, inside the
supervisor pod (``--in-cluster``; ``supobjects.py`` makes the pod, ``hosted.py`` submits it).

Standard library only (the image holds python3 and the user's framework; phalanx comes from
the bundle in ``/phx/lib``). It

1. restores the job record from the object store (``record.py``, presigned URLs in its env)
   into ``PHALANX_HOME`` (an emptyDir), as a one-job store;
2. supervises the job as ``python -m phalanx.supervise`` would (``supervise.job.JobRun``):
   attempts, retries within ``--max-retries``, preemption re-runs, root cause. An attempt's
   state directory travels to its pods through the object store (``pod_values``), the bundle is
   the one this pod was started from;
3. when it is a replacement pod (the record says RUNNING), watches the attempt that still runs,
   found by its labels, instead of starting another (``supervise/leftover.py``);
4. writes the record back every ``SYNC`` seconds, at the end, and when the pod is deleted
   (SIGTERM): then it leaves the attempt running (a drained node; ``phalanx stop`` stops the
   attempt itself) and exits 143, so the Job controller starts a replacement pod.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import record as rec
from .manifests import BUNDLE_SHA256, BUNDLE_URL, STATE_BYTES, STATE_SHA256, STATE_URL

SYNC = float(os.environ.get("PHX_SYNC_SECONDS") or 5.0)
# The store columns the record carries; the rest (job_dir, supervisor identity) is per machine.
COLUMNS = ("name", "backend", "nnodes", "nproc_per_node", "command", "spec_json", "created_at", "started_at", "ended_at",
           "exit_code", "attempt", "root_cause", "state_synced_at", "retries", "gpu_hours", "cpu_hours", "cost")


def active() -> bool:
    """Whether this process is a supervisor pod's (its record's URLs in the environment)."""
    return bool(os.environ.get("PHX_RECORD_PUT"))


def urls() -> rec.Urls:
    e = os.environ
    return rec.Urls(e["PHX_RECORD_GET"], e["PHX_RECORD_PUT"], e["PHX_STATE_GET"], e["PHX_STATE_PUT"])


def pod_values(state_dir: Path | None) -> dict[str, str | None]:
    """The placeholders of an attempt's manifests, in the supervisor pod: the bundle this pod
    was started from, and the state directory uploaded to the job's state object."""
    values: dict[str, str | None] = {BUNDLE_URL: os.environ["PHX_BUNDLE_URL"], BUNDLE_SHA256: os.environ["PHX_BUNDLE_SHA256"],
                                     STATE_URL: "", STATE_SHA256: "", STATE_BYTES: None}
    data = rec.pack_dir(state_dir) if state_dir is not None else None
    if data is not None:
        rec.put(urls().state_put, data)
        values[STATE_URL], values[STATE_SHA256] = urls().state_get, hashlib.sha256(data).hexdigest()
    return values


def row_of(record: Any) -> dict[str, Any]:
    row = {c: getattr(record, c) for c in COLUMNS}
    row.update(id=record.id, state=record.state.value)
    return row


def restore(home: Path, job_id: str) -> dict[str, Any]:
    """The record from the object store into ``home``; the archived row."""
    data = rec.get(urls().record_get)
    if data is None:
        raise SystemExit(f"phalanx: the record of job {job_id} is not in the object store (its URL: {urls().record_get[:80]}...)")
    row = rec.unpack(data, home, job_id)
    # This pod reaches the API server with its service account: no kubeconfig context.
    spec = json.loads(row["spec_json"])
    spec.get("backend_options", {}).pop("context", None)
    row["spec_json"] = json.dumps(spec, sort_keys=True)
    (home / "jobs" / job_id / "spec.json").write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    return row


class Syncer(threading.Thread):
    """Writes the record to the object store every SYNC seconds, and once more on ``flush``."""

    def __init__(self, home: Path, job_id: str, state_key: str | None) -> None:
        super().__init__(name="record-sync", daemon=True)
        self.home, self.job_id, self.state_key = home, job_id, state_key
        self.lock = threading.Lock()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(SYNC):
            self.flush()

    def flush(self) -> None:
        from ...store import Store

        with self.lock:
            try:
                row = row_of(Store(_db(self.home)).get(self.job_id))
                rec.put(urls().record_put, rec.pack(self.home, self.job_id, row, self.state_key))
            except Exception as exc:  # noqa: BLE001 - the next sync tries again; the pod must not die of it
                print(f"phalanx: writing the job record failed: {exc}", flush=True)


def _db(home: Path) -> Path:
    from ...core.paths import HomePaths

    return HomePaths(home).db


def main(argv: list[str] | None = None) -> None:
    from ...backends.registry import get_backend
    from ...core.paths import HomePaths, write_atomic
    from ...core.state import JobState, is_terminal
    from ...store import Store
    from ...supervise import leftover
    from ...supervise.job import JobRun
    from ...supervise.submit import plan_attempt

    job_id = (sys.argv[1:] if argv is None else argv)[0]
    home = HomePaths(Path(os.environ["PHALANX_HOME"]))
    home.root.mkdir(parents=True, exist_ok=True)
    row = restore(home.root, job_id)
    store = Store(home.db)
    store.insert_job(id=job_id, job_dir=str(home.job(job_id).root), state=JobState.PENDING.value,
                     **{c: row[c] for c in COLUMNS if row.get(c) is not None})
    record = store.get(job_id)
    syncer = Syncer(home.root, job_id, record.spec.state_key)
    state = JobState(row["state"])

    def say(text: str) -> None:
        print(f"phalanx: {text}", flush=True)

    if is_terminal(state):  # a replacement pod after the end was recorded
        store.transition(job_id, state, exit_code=row.get("exit_code"), root_cause=row.get("root_cause"))
        say(f"job {job_id} already ended ({state.value})")
        syncer.flush()
        os._exit(0)
    backend = get_backend(record.backend)
    if state is JobState.PENDING:
        plan = plan_attempt(backend, record.spec, job_id, int(row.get("attempt") or 0), home)
    else:  # this pod replaces one that vanished: the attempt it started still runs, found by its labels
        say(f"job {job_id} was {state.value} under a supervisor pod that is gone; looking for its attempt")
        plan = leftover.resume_plan(record, home)
    write_atomic(record.paths.plan, plan.to_json())
    store.update(job_id, attempt=plan.attempt)
    run = JobRun(store, home, store.get(job_id), plan, say)
    run.retries = int(row.get("retries") or 0)
    deleted = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: deleted.set())
    run.start({"supervisor_pid": os.getpid(), "supervisor_started": time.time()})
    syncer.start()
    while not run.done and not deleted.is_set():
        run.tick()
        if not run.done:
            deleted.wait(min(max(run.wait_hint(), 0.05), 1.0))
    syncer.done.set()
    syncer.flush()
    if not run.done:
        say("the supervisor pod is being deleted: the record is saved; the attempt runs on")
        os._exit(128 + signal.SIGTERM)
    say(f"job {job_id} ended: {store.get(job_id).state.value}")
    os._exit(0)  # the supervisor's work is done whatever the job's outcome: no replacement pod


if __name__ == "__main__":
    main()
