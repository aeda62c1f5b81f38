"""Eight processes writing to one store at once, and readers beside them, on each engine: 50
jobs per writer, 8 writes each on average (a new id, the job's row, RUNNING, its metric summary,
a counter every writer adds to, a race to end a job first, the end; every second job the tags
and summary of one job every writer replaces): 400 writes per writer, 3,200 in all. Afterwards: no row lost, no counter short, every race won exactly once, and nothing of
PostgreSQL's serialization failures or deadlocks reached a process (``tests/storeload.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.core.state import JobState
from phalanx.store import Store
from phalanx.store.listing import Filter, count_jobs, metrics_of, tags_of
from tests import storeload

ROOT = Path(__file__).resolve().parents[2]
WRITERS, JOBS, READERS = 8, 50, 2

pytestmark = pytest.mark.slow


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.storeload", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})


def test_eight_writers_and_readers_lose_nothing_and_see_no_conflict(store_at, tmp_path):
    where = str(store_at)
    store = Store(where)
    store.insert_job(id=storeload.SHARED_JOB, name="shared", backend="local", nnodes=1, nproc_per_node=1,
                     command="t.py", job_dir="/tmp/shared", spec_json="{}", state="RUNNING")
    store.sweeps.insert(id=storeload.SHARED_SWEEP, name="sw", strategy="grid", command="t.py", topology="1x1",
                        spec_json="{}", settings_json="{}", sweep_dir="/tmp/s")
    for n in range(storeload.RACE):
        store.insert_job(id=storeload.race_id(n), name="race", backend="local", nnodes=1, nproc_per_node=1,
                         command="t.py", job_dir="/tmp/race", spec_json="{}", state="RUNNING")
    stop = tmp_path / "stop"
    readers = [_spawn("reader", where, str(stop)) for _ in range(READERS)]
    writers = [_spawn("writer", where, str(i), str(JOBS)) for i in range(WRITERS)]
    try:
        outs = [w.communicate(timeout=900) for w in writers]
    finally:
        stop.touch()
        read = [r.communicate(timeout=120) for r in readers]
        for proc in writers + readers:
            if proc.poll() is None:
                proc.kill()
    for proc, (out, err) in zip(writers + readers, outs + read):
        assert proc.returncode == 0, err[-3000:]
        assert "could not serialize" not in err and "deadlock" not in err, err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert all(json.loads(out.strip().splitlines()[-1])["loops"] > 0 for out, _ in read), "the readers read meanwhile"

    mine = [job for r in results for job in r["jobs"]]
    assert len(mine) == len(set(mine)) == WRITERS * JOBS, "every id handed out once"
    assert store.count() == WRITERS * JOBS + storeload.RACE + 1, "no row lost, none extra"
    for job_id in mine[:: 7]:
        assert store.get(job_id).state is JobState.SUCCEEDED
    assert count_jobs(store, Filter(states=("SUCCEEDED",))) == WRITERS * JOBS + _wins(results, "SUCCEEDED")
    assert len(metrics_of(store, mine)) == WRITERS * JOBS, "every job's metric summary is there"
    assert store.sweeps.get(storeload.SHARED_SWEEP).finished == WRITERS * JOBS, "no increment lost"
    shared = metrics_of(store, [storeload.SHARED_JOB])[storeload.SHARED_JOB]
    assert set(shared) == {"loss", f"w{next(iter(shared.keys() - {'loss'}))[1:]}"}, "one writer's summary, whole"
    assert set(tags_of(store, [storeload.SHARED_JOB])[storeload.SHARED_JOB]) == {"writer", "i"}

    won: dict[str, str] = {}
    for result in results:
        for job_id in result["won"]:
            assert job_id not in won, f"{job_id} was ended twice: a stop and a finish both won"
            won[job_id] = result["target"]
    assert len(won) == storeload.RACE, "every race job was ended by exactly one writer"
    for job_id, target in won.items():
        assert store.get(job_id).state.value == target, "the winner's state stands"
    if store.engine.kind == "postgresql":  # the collisions happened, and were mended inside the store
        assert sum(r["retried"] for r in results) > 0, "no transaction collided: the test did not test retries"


def _wins(results: list[dict], target: str) -> int:
    return sum(len(r["won"]) for r in results if r["target"] == target)
