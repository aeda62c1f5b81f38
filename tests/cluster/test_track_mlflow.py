"""``--track mlflow`` against a real MLflow tracking server (the ``mlflow`` package, SQLite, on
loopback, started here once for the file), read back through MLflow's REST API: the series equal
phalanx's own point for point, one run per job across a retry, a sweep as a parent with one child
per trial, a script's own MLflow calls in the same run, and a server that is stopped (or never
there) costing the job nothing and losing no point."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from tests.cluster.mlflow_server import MlflowServer, free_port, params, tags
from tests.conftest import phalanx
from tests.local.test_track_files import finished, wandb_records

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# Prints a step, a loss and an accuracy per step (rank-dependent); resumes from its checkpoint in
# the state directory; attempt 0 kills itself after KILL_AT; writes the tracker ids it was handed.
SCRIPT = '''
import os, sys, time
rank = int(os.environ.get("RANK", "0"))
steps = int(os.environ.get("STEPS", "12"))
ckpt = os.path.join(os.environ["PHALANX_STATE_DIR"], f"ckpt{rank}")
start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
attempt = int(os.environ["PHALANX_ATTEMPT"])
names = ("MLFLOW_RUN_ID", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_RUN_GROUP")
with open(os.path.join(os.environ["PHALANX_OUTPUT_DIR"], f"ids-{attempt}-{rank}.json"), "w") as f:
    f.write(__import__("json").dumps({k: os.environ.get(k) for k in names}))
if os.environ.get("OWN_MLFLOW"):
    import mlflow
    mlflow.log_metric("own_metric", 42.0, step=7)
for step in range(start, steps):
    print(f"step {step} loss={(rank + 1) / (step + 1):.6f} acc={step / steps:.4f}", flush=True)
    with open(ckpt, "w") as f:
        f.write(str(step + 1))
    if step == int(os.environ.get("KILL_AT", "-1")) and attempt == 0:
        os.kill(os.getpid(), 9)
    time.sleep(float(os.environ.get("DELAY", "0.05")))
'''


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def _env(server: MlflowServer, experiment: str, **more: str) -> dict[str, str]:
    return {"MLFLOW_TRACKING_URI": server.uri, "MLFLOW_EXPERIMENT_NAME": experiment, **more}


def _job(name: str) -> dict:
    return json.loads(phalanx("status", name, "--json", check=True).stdout)


def _finished(job_dir: str, kind: str = "mlflow") -> dict:
    """The exporter's state once it has closed the run (it runs beside the job, a moment longer)."""
    return finished(job_dir, kind, timeout=240.0)


def _series(name: str, rank: int) -> dict[str, list[tuple[int, float, int]]]:
    """phalanx's own series of a rank: (step, value, time in ms) per metric, in order."""
    out: dict[str, list[tuple[int, float, int]]] = {}
    lines = phalanx("metrics", name, "--jsonl", "--rank", str(rank), check=True).stdout.splitlines()
    for r in map(json.loads, lines):
        out.setdefault(r["name"], []).append((r["step"], r["value"], int(round(r["time"] * 1000))))
    return out


def _history(server: MlflowServer, run_id: str, key: str) -> list[tuple[int, float, int]]:
    points = server.history(run_id, key)
    return sorted(((m["step"], m["value"], m["timestamp"]) for m in points), key=lambda p: (p[0], p[2]))


def test_two_rank_job_series_params_tags_and_link(phx_home, mlflow_server, script):
    env = _env(mlflow_server, "two-ranks", STEPS="15")
    phalanx("run", "--name", "two", "--track", "mlflow", "--track-ranks", "all", "--track-artifacts", "-n", "2",
            "--tag", "team=vision", str(script), "--lr", "0.01", "--amp", env=env, check=True)
    job = _job("two")
    state = _finished(job["job_dir"])
    run = mlflow_server.run(state["run_id"])
    # every point of both ranks, as phalanx has them: step, value and wall time
    for rank, prefix in ((0, ""), (1, "rank1/")):
        ours = _series("two", rank)
        assert set(ours) == {"loss", "acc"}
        for name, points in ours.items():
            assert _history(mlflow_server, state["run_id"], prefix + name) == sorted(points), (rank, name)
    assert len(ours["loss"]) == 15
    keys = {m["key"] for m in run["data"]["metrics"]}
    assert "sys/cpu_percent" in keys and "sys/mem_used" in keys
    p = params(run)
    assert p["lr"] == "0.01" and p["amp"] == "true"
    assert p["phalanx.job_id"] == job["id"] and p["phalanx.backend"] == "local"
    assert (p["phalanx.nnodes"], p["phalanx.nproc_per_node"]) == ("1", "2")
    assert len(p["phalanx.code_digest"]) == 64
    t = tags(run)
    assert t["phalanx.job_name"] == "two" and t["mlflow.runName"] == "two" and t["team"] == "vision"
    assert t["phalanx.outcome"] == "succeeded" and t["phalanx.user"]
    assert run["info"]["status"] == "FINISHED"
    assert len(mlflow_server.runs("two-ranks")) == 1
    # status prints the link to the run, and the script was handed the run
    link = f"{mlflow_server.uri}/#/experiments/{run['info']['experiment_id']}/runs/{state['run_id']}"
    assert link in phalanx("status", "two", check=True).stdout
    from starlette.testclient import TestClient

    from phalanx.web.app import create_app

    detail = TestClient(create_app(), base_url="http://127.0.0.1:8000").get("/api/jobs/two").json()
    assert [(t["kind"], t["url"], t["waiting"]) for t in detail["trackers"]] == [("mlflow", link, 0)]
    ids = json.loads((Path(job["job_dir"]) / "output" / "ids-0-1.json").read_text())
    assert ids["MLFLOW_RUN_ID"] == state["run_id"]
    # --track-artifacts: the outputs and every rank's log, in the run's artifacts (served by MLflow)
    listed = {a["path"] for d in ("outputs", "logs/attempt_0")
              for a in mlflow_server.get("artifacts/list", run_id=state["run_id"], path=d).get("files", [])}
    assert {"outputs/ids-0-0.json", "outputs/ids-0-1.json", "logs/attempt_0/rank_0.log",
            "logs/attempt_0/rank_1.log"} <= listed
    stored = mlflow_server.root / "artifacts" / run["info"]["experiment_id"] / state["run_id"] / "artifacts"
    assert json.loads((stored / "outputs" / "ids-0-1.json").read_text()) == ids


def test_killed_and_retried_job_is_one_run_in_every_tracker(phx_home, mlflow_server, script, tmp_path):
    """One run across the retry, steps continuing: MLflow, TensorBoard and W&B (offline) at once."""
    env = _env(mlflow_server, "retried", STEPS="10", KILL_AT="4", WANDB_MODE="offline", WANDB_PROJECT="phx-test")
    done = phalanx("run", "--name", "retried", "--max-retries", "1", "--track", "mlflow", "--track", "tensorboard",
                   "--track", "wandb", str(script), env=env)
    assert done.returncode == 0, done.stderr
    job = _job("retried")
    assert job["retries"] == 1
    state = _finished(job["job_dir"])
    assert len(mlflow_server.runs("retried")) == 1  # ONE run
    history = _history(mlflow_server, state["run_id"], "loss")
    assert [s for s, _, _ in history] == list(range(10))  # steps continue, none twice
    assert [v for _, v, _ in history] == [round(1 / (s + 1), 6) for s in range(10)]
    out = Path(job["job_dir"]) / "output"
    first, second = (json.loads((out / f"ids-{a}-0.json").read_text()) for a in (0, 1))
    assert first == second  # the script's own tracker code would continue the same runs
    assert first["MLFLOW_RUN_ID"] == state["run_id"]
    assert first["WANDB_RUN_ID"] == f"phalanx-{job['id']}" and first["WANDB_RESUME"] == "allow"
    assert first["WANDB_RUN_GROUP"] == job["id"]
    # TensorBoard: one log directory (the job's), read with TensorBoard's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _finished(job["job_dir"], "tensorboard")
    events = EventAccumulator(job["job_dir"])
    events.Reload()
    scalars = [(e.step, e.value) for e in events.Scalars("loss")]
    assert scalars == [(s, _f32(1 / (s + 1))) for s in range(10)]
    # W&B: the same run id, its history continuing
    wb = _finished(job["job_dir"], "wandb")
    assert wb["run_id"] == f"phalanx-{job['id']}"
    records = wandb_records(Path(wb["url"]))
    steps = [int(r["_step"]) for r in records["history"] if "loss" in r]
    assert steps == list(range(10))
    assert records["run_ids"] == {f"phalanx-{job['id']}"}


def _f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", round(value, 6)))[0]


def test_sweep_is_a_parent_run_with_a_child_per_trial(phx_home, mlflow_server, script):
    env = _env(mlflow_server, "sweep", STEPS="3")
    phalanx("run", "--name", "sw", "--track", "mlflow", str(script), "--lr", "[0.1, 0.2, 0.3]", env=env, check=True)
    trials = [d for d in (phx_home / "jobs").iterdir() if json.loads((d / "spec.json").read_text())["name"].startswith("sw-")]
    assert len(trials) == 3
    states = [_finished(str(d)) for d in trials]
    runs = {r["info"]["run_id"]: r for r in mlflow_server.runs("sweep")}
    assert len(runs) == 4
    parents = [r for r in runs.values() if "mlflow.parentRunId" not in tags(r)]
    assert len(parents) == 1
    parent = parents[0]["info"]["run_id"]
    assert tags(parents[0])["phalanx.sweep_id"] == tags(runs[states[0]["run_id"]])["phalanx.sweep_id"]
    children = [runs[s["run_id"]] for s in states]
    assert all(tags(c)["mlflow.parentRunId"] == parent for c in children)
    assert sorted(params(c)["lr"] for c in children) == ["0.1", "0.2", "0.3"]
    deadline = time.monotonic() + 60  # the runner closes the parent as the sweep ends
    while mlflow_server.run(parent)["info"]["status"] != "FINISHED" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert mlflow_server.run(parent)["info"]["status"] == "FINISHED"
    assert f"/runs/{parent}  (the sweep's run" in phalanx("status", "sw", check=True).stdout


def test_script_that_logs_to_mlflow_itself_lands_in_the_same_run(phx_home, mlflow_server, script):
    env = _env(mlflow_server, "own", STEPS="4", OWN_MLFLOW="1")
    phalanx("run", "--name", "own", "--track", "mlflow", str(script), env=env, check=True)
    state = _finished(_job("own")["job_dir"])
    assert len(mlflow_server.runs("own")) == 1
    assert [(s, v) for s, v, _ in _history(mlflow_server, state["run_id"], "own_metric")] == [(7, 42.0)]
    assert len(_history(mlflow_server, state["run_id"], "loss")) == 4


def _started_and_sending(name: str, script: Path, env: dict[str, str]) -> dict:
    """A detached tracked job, once MLflow has taken its first points."""
    phalanx("run", "-d", "--name", name, "--track", "mlflow", str(script), env=env, check=True)
    job = _job(name)
    path = Path(job["job_dir"]) / "track" / "mlflow.json"
    deadline = time.monotonic() + 120
    while not (path.exists() and json.loads(path.read_text()).get("sent", 0) > 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    return job


def test_server_stopped_mid_job_then_back_every_point_once_in_order(phx_home, mlflow_server, script):
    env = _env(mlflow_server, "outage", STEPS="60", DELAY="0.1", PHALANX_TRACK_LINGER="600")
    job = _started_and_sending("outage", script, env)
    mlflow_server.stop()  # mid-job
    try:
        assert phalanx("wait", "outage", timeout=300).returncode == 0  # the job does not care
        waiting = json.loads(phalanx("status", "outage", "--json", check=True).stdout)["trackers"][0]
        assert waiting["waiting"] > 0 and waiting["error"]
        assert "waiting" in phalanx("status", "outage", check=True).stdout
    finally:
        mlflow_server.start()
    state = _finished(job["job_dir"])
    history = _history(mlflow_server, state["run_id"], "loss")
    assert [s for s, _, _ in history] == list(range(60))
    assert [(s, v) for s, v, _ in history] == [(s, v) for s, v, _ in sorted(_series("outage", 0)["loss"])]
    assert mlflow_server.run(state["run_id"])["info"]["status"] == "FINISHED"
    from phalanx.core.paths import JobPaths
    from phalanx.monitor.stream import JobStream

    everything = JobStream(JobPaths(Path(job["job_dir"])), all_ranks=False).take(10**6)
    assert state["sent"] == len(everything) and state["dropped"] == 0  # each point sent once


def test_supervisor_killed_then_resumed_is_still_one_run(phx_home, mlflow_server, script):
    """A supervisor that vanished (the job LOST) and ``phalanx resume``: a new exporter goes on
    from the cursor in the same run, the steps continuing."""
    import os
    import signal

    env = _env(mlflow_server, "resumed", STEPS="40", DELAY="0.1")
    job = _started_and_sending("resumed", script, env)
    path = Path(job["job_dir"]) / "track" / "mlflow.json"
    deadline = time.monotonic() + 120
    os.kill(_job("resumed")["supervisor_pid"], signal.SIGKILL)
    while _job("resumed")["state"] != "LOST" and time.monotonic() < deadline:
        time.sleep(0.2)
    first = json.loads(path.read_text())["run_id"]
    assert phalanx("resume", "--attach", "resumed", env=env, timeout=300).returncode == 0
    state = _finished(job["job_dir"])
    assert state["run_id"] == first and len(mlflow_server.runs("resumed")) == 1
    steps = [s for s, _, _ in _history(mlflow_server, first, "loss")]
    ours = sorted(s for s, _, _ in _series("resumed", 0)["loss"])
    assert steps == ours and len(set(steps)) == len(steps) and steps[-1] == 39  # continued, none twice
    assert len(_job("resumed")["attempts"]) == 2
    assert mlflow_server.run(first)["info"]["status"] == "FINISHED"


def test_server_never_there_job_succeeds_and_status_says_points_wait(phx_home, script):
    dead = f"http://127.0.0.1:{free_port()}"
    env = {"MLFLOW_TRACKING_URI": dead, "STEPS": "5", "PHALANX_TRACK_LINGER": "1"}
    done = phalanx("run", "--name", "nowhere", "--track", "mlflow", str(script), env=env)
    assert done.returncode == 0, done.stderr
    assert "MLflow run not created yet" in done.stderr
    job = _job("nowhere")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the exporter gives up after track_linger
        tracker = json.loads(phalanx("status", "nowhere", "--json", check=True).stdout)["trackers"][0]
        if not tracker["exporter_running"]:
            break
        time.sleep(0.3)
    assert tracker["waiting"] >= 5 and tracker["sent"] == 0 and "did not answer" in tracker["error"]
    out = phalanx("status", "nowhere", check=True).stdout
    assert "waiting (exporter stopped; they stay on disk)" in out
    ids = json.loads((Path(job["job_dir"]) / "output" / "ids-0-0.json").read_text())
    assert ids["MLFLOW_RUN_ID"] is None
