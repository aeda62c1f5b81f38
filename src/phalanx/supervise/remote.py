"""``python3 -m phalanx.supervise.remote JOB_ID``: a job's supervisor that runs away from every
phalanx home, its record restored from and written back to an object store by presigned URLs:
the supervisor pod of ``phalanx run --backend k8s --in-cluster -d`` (``backends/kubernetes``:
``supobjects.py`` makes the pod, ``hosted.py`` submits it, ``supervisor.py`` the record's side).

Standard library only (the image holds python3 and the user's framework; phalanx comes from the
bundle in ``/phx/lib``). It

1. restores the job record into ``PHALANX_HOME`` (an emptyDir), as a one-job store;
2. supervises the job as ``python -m phalanx.supervise`` would (``job.JobRun``): attempts,
   retries within ``--max-retries``, preemption re-runs, root cause;
3. when it is a replacement pod (the record says RUNNING), watches the attempt that still runs,
   found by its labels, instead of starting another (``leftover.resume_plan``);
4. writes the record back every few seconds, at the end, and when the pod is deleted (SIGTERM):
   then it leaves the attempt running (a drained node; ``phalanx stop`` stops the attempt itself)
   and exits 143, so the Job controller starts a replacement pod.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from ..backends.kubernetes.supervisor import COLUMNS, Syncer, restore
from ..backends.registry import get_backend
from ..core.paths import HomePaths, write_atomic
from ..core.state import JobState, is_terminal
from ..store import Store
from . import leftover
from .job import JobRun
from .submit import plan_attempt


def main(argv: list[str] | None = None) -> None:

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
