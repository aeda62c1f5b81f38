"""Processes that write to and read from one store at once (tests/unit/test_store_concurrency.py):

    python -m tests.storeload writer WHERE INDEX COUNT     # COUNT jobs, each: id, insert, RUNNING,
                                                           # metric summary, a counter, a race, the end (7
                                                           # writes), every second one the shared rows (2 more)
    python -m tests.storeload reader WHERE STOP_FILE       # listings and lookups until STOP_FILE exists

A writer prints one JSON line: its jobs' ids, the race jobs it won, and how often the store ran
a transaction again (PostgreSQL's serialization failures and deadlocks, retried inside the store).
Any exception ends it non-zero, its traceback on stderr: nothing may reach a caller.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SHARED_JOB = "5a5a5a5a"  # every writer replaces its tags and metric summary
SHARED_SWEEP = "5eed5eed"  # every writer counts its jobs here
RACE = 50  # jobs every writer tries to end at once: even writers as finished, odd ones as stopped


def race_id(n: int) -> str:
    return f"ace{n:05x}"


def writer(where: str, index: int, count: int) -> None:
    from phalanx.core.state import JobState
    from phalanx.store import Store
    from phalanx.store.listing import save_metrics, set_tags

    store = Store(where)
    mine, won = [], []
    target = JobState.SUCCEEDED if index % 2 == 0 else JobState.CANCELLED
    for i in range(count):
        job_id = store.new_id()
        store.insert_job(id=job_id, name=f"w{index}", backend="local", nnodes=1, nproc_per_node=1, command="t.py",
                         job_dir=f"/tmp/{job_id}", spec_json="{}", user_name=f"user{index}")
        assert store.transition(job_id, JobState.RUNNING)
        save_metrics(store, job_id, {"loss": {"last": 1.0 / (i + 1), "min": 0.0, "max": 1.0, "count": i + 1}})
        if i % 2 == 0:  # one row every writer replaces: transactions that collide (PostgreSQL retries them)
            set_tags(store, SHARED_JOB, {"writer": str(index), "i": str(i)})
            save_metrics(store, SHARED_JOB, {"loss": {"last": i, "min": 0, "max": i, "count": 1},
                                             f"w{index}": {"last": i, "min": 0, "max": i, "count": 1}})
        store.sweeps.count(SHARED_SWEEP, "finished")
        if store.transition(race_id(i % RACE), target, exit_code=index):
            won.append(race_id(i % RACE))
        assert store.transition(job_id, JobState.SUCCEEDED, exit_code=0)
        mine.append(job_id)
    print(json.dumps({"jobs": mine, "won": won, "target": target.value, "retried": getattr(store.engine, "retries", 0)}))


def reader(where: str, stop: Path) -> None:
    from phalanx.store import Store
    from phalanx.store.listing import Filter, Sort, count_jobs, metrics_of, page_jobs

    store = Store(where)
    loops = 0
    while not stop.exists():
        page = page_jobs(store, Filter(), Sort(), 50)
        if page.rows:
            store.get(page.rows[0].id)
            metrics_of(store, [r.id for r in page.rows])
        if page.next:
            page_jobs(store, Filter(), Sort(), 50, page.next)
        count_jobs(store, Filter(states=("RUNNING",)))
        page_jobs(store, Filter(user="user3"), Sort(), 20)
        loops += 1
    print(json.dumps({"loops": loops}))


if __name__ == "__main__":
    role, where = sys.argv[1], sys.argv[2]
    if role == "writer":
        writer(where, int(sys.argv[3]), int(sys.argv[4]))
    else:
        reader(where, Path(sys.argv[3]))
