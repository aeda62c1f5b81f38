"""A job or sweep whose supervisor died shows LOST at once, in every read (ps, status, the
dashboard), while no read writes it; the first command that acts on the job records it, and the
history lists the attempt nobody saw end (supervise/liveness.py, api/query.py, supervise/history.py)."""

from __future__ import annotations

import json
import subprocess
import time

import psutil
import pytest
from typer.testing import CliRunner

from phalanx.api import jobs, query, sweepjobs
from phalanx.core.contracts import OutcomeKind, read_attempts
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec
from phalanx.core.state import JobState
from phalanx.store import Store
from phalanx.supervise import history, liveness

SPEC = json.dumps(JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/w/t.py"), name="t").to_dict())


def _dead_identity() -> dict:
    proc = subprocess.Popen(["sleep", "0.2"])
    started = psutil.Process(proc.pid).create_time()
    proc.wait()
    return {"supervisor_pid": proc.pid, "supervisor_started": started}


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A store: a job whose supervisor died mid-attempt, one whose supervisor lives, one never
    picked up, and a sweep whose runner died with one trial running and one done."""
    monkeypatch.setenv("PHALANX_HOME", str(tmp_path))
    home = HomePaths(tmp_path)
    store = Store(home.db)
    dead, alive = _dead_identity(), liveness.identity()

    def job(job_id: str, state: JobState, **extra) -> None:
        paths = home.job(job_id)
        (paths.rank_dir(0, 0)).mkdir(parents=True)
        paths.rank_log(0, 0).write_text("step=1 loss=0.5\n")
        store.insert_job(id=job_id, name=job_id, backend="local", nnodes=1, nproc_per_node=1, command="t.py",
                         job_dir=str(paths.root), spec_json=SPEC, state=state.value, **extra)

    job("orphan", JobState.RUNNING, started_at=time.time(), **dead)
    job("healthy", JobState.RUNNING, started_at=time.time(), **alive)
    job("stuck", JobState.PENDING, created_at=time.time() - 3600)
    store.sweeps.insert(id="sw1", name="sw", strategy="grid", total=2, command="t.py", topology="1x1", spec_json=SPEC,
                        settings_json="{}", sweep_dir=str(home.sweep_dir("sw1")), state=JobState.RUNNING.value, **dead)
    job("trial0", JobState.SUCCEEDED, sweep_id="sw1", trial=0, **dead)
    job("trial1", JobState.RUNNING, sweep_id="sw1", trial=1, **dead)
    return store, home


def _stored(store: Store) -> dict[str, str]:
    rows = {r.id: r.state.value for r in store.list(trials=True)}
    rows.update({s.id: s.state.value for s in store.sweeps.list()})
    return rows


def test_reads_show_lost_at_once_and_write_nothing(world):
    store, home = world
    before = _stored(store)
    assert [r.id for r in query.list_jobs()] == ["healthy"]  # LOST has ended: only ps --all lists it
    assert {r.id: r.state for r in query.list_jobs(all_jobs=True)} == {
        "orphan": JobState.LOST, "healthy": JobState.RUNNING, "stuck": JobState.LOST}
    orphan = query.get_job("orphan")
    assert "vanished" in orphan.root_cause_dict()["message"]
    assert [(a["attempt"], a["outcome"], a["exit_code"]) for a in query.attempt_history(orphan)] == [(0, "lost", None)]
    sweep = query.find_sweep("sw1")
    assert sweep.state is JobState.LOST and [s.state for s in query.list_sweeps(all_sweeps=True)] == [JobState.LOST]
    assert {t.id: t.state for t in query.trials(sweep)} == {"trial0": JobState.SUCCEEDED, "trial1": JobState.LOST}
    assert jobs.wait("orphan", timeout=5).state is JobState.LOST  # waiting ends: the job has
    assert _stored(store) == before, "a read wrote to the store"
    assert not home.job("orphan").attempts_log.exists(), "a read wrote to the job directory"


def test_the_cli_and_the_dashboard_only_look(world):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from phalanx.cli.main import app
    from phalanx.web.app import create_app

    store, _ = world
    before = _stored(store)
    ps = CliRunner().invoke(app, ["ps", "--all", "--json"])
    assert {r["id"]: r["state"] for r in json.loads(ps.output)} == {"orphan": "LOST", "healthy": "RUNNING",
                                                                    "stuck": "LOST", "sw1": "LOST"}
    status = CliRunner().invoke(app, ["status", "orphan"])
    assert "state     LOST" in status.output and "root cause: the supervisor (pid" in status.output
    client = TestClient(create_app(), base_url="http://127.0.0.1:8000")  # the dashboard as `phalanx dashboard` serves it
    assert client.get("/api/jobs/orphan").json()["state"] == "LOST"
    assert {j["id"]: j["state"] for j in client.get("/api/jobs").json()}["orphan"] == "LOST"
    show = CliRunner().invoke(app, ["sweep", "show", "sw1", "--json"])
    assert [t["state"] for t in json.loads(show.output)["trials"]] == ["SUCCEEDED", "LOST"]
    assert _stored(store) == before, "a read wrote to the store"


def test_the_first_command_that_acts_records_lost(world):
    store, home = world
    assert jobs.stop("orphan").state is JobState.LOST  # nothing left running on the local backend
    assert store.get("orphan").state is JobState.LOST and store.get("healthy").state is JobState.RUNNING
    assert sweepjobs.stop_sweep(query.find_sweep("sw1")).state is JobState.LOST
    assert store.sweeps.get("sw1").state is JobState.LOST and store.get("trial1").state is JobState.LOST
    assert store.get("trial0").state is JobState.SUCCEEDED  # terminal states never change


def test_a_new_attempt_records_the_one_nobody_saw_end(world):
    store, home = world
    paths = home.job("orphan")
    assert history.record_lost(paths, before=1) == [0]
    assert history.record_lost(paths, before=1) == []  # once
    (entry,) = read_attempts(paths.attempts_log)
    assert entry.outcome is OutcomeKind.LOST and entry.exit_code is None and entry.started <= entry.ended
