"""The SLURM backend against a real cluster started by the tests: munged, slurmctld and two
slurmd (nodes n1 on 127.0.0.2 and n2 on 127.0.0.3; see tests/cluster/slurm.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from phalanx.core.paths import JobPaths
from phalanx.core.spec import TEMPLATE_KEYS
from phalanx.monitor.metrics import read_metrics
from phalanx.sweeps.space import parse_space
from tests.conftest import EXAMPLES, phalanx
from tests.local.test_run import _only_job, _status, _wait_for

pytestmark = pytest.mark.cluster

TRAIN = str(EXAMPLES / "train_ddp.py")


def _slurm_job(job: dict, attempt: int = 0) -> str:
    return json.loads(Path(job["job_dir"], f"attempt_{attempt}", "scheduler.json").read_text())["job_id"]


def _processes_of(job: dict) -> list[psutil.Process]:
    """Live processes that belong to the job: its files in their command line, or its id in their env."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(job["job_dir"] in word for word in proc.info["cmdline"] or ()) or \
                    proc.environ().get("PHALANX_JOB_ID") == job["id"]:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_two_node_ddp_through_slurm_synchronises_gradients(slurm_env):
    proc = phalanx("run", "--backend", "slurm", "--time", "10", "--sample-interval", "0.5", "-n", "2x1", TRAIN,
                   "--epochs", "1", "--steps-per-epoch", "3", "--print-grad-checksum", check=True, timeout=300)
    grads = dict(re.findall(r"grad_checksum rank=(\d) value=(\S+)", proc.stdout))
    batches = dict(re.findall(r"local_batch_checksum rank=(\d) value=(\S+)", proc.stdout))
    assert set(grads) == {"0", "1"}, proc.stdout + proc.stderr
    assert grads["0"] == grads["1"], "DDP must all-reduce gradients across the two nodes"
    assert batches["0"] != batches["1"], "each rank must see different data"
    job = _only_job()
    assert job["state"] == "SUCCEEDED" and job["backend"] == "slurm" and job["topology"] == "2x1"
    attempt = Path(job["job_dir"], "attempt_0")
    results = [json.loads((attempt / f"node_{n}" / "result.json").read_text()) for n in (0, 1)]
    # each node learnt its own address from the allocation: n1 hosts the rendezvous
    assert [(r["exitcode"], r["host"]) for r in results] == [(0, "127.0.0.2"), (0, "127.0.0.3")]
    slurm_id = _slurm_job(job)
    assert f"SLURM job {slurm_id} on n[1-2] (127.0.0.2,127.0.0.3)" in (attempt / "batch.log").read_text()
    assert slurm_env.job_state(slurm_id) == "COMPLETED"
    assert [r["state"] for r in _status(job["id"])["ranks"]] == ["succeeded", "succeeded"]
    logs = phalanx("logs", job["id"], "--rank", "1", check=True).stdout
    assert "grad_checksum rank=1" in logs
    # metrics and resource samples as for local jobs: read by the supervisor, sampled on the nodes
    assert "loss" in phalanx("metrics", job["id"], check=True).stdout
    assert all((attempt / f"node_{n}" / "resources.jsonl").stat().st_size > 0 for n in (0, 1))


def test_stop_cancels_the_slurm_job_and_leaves_no_process(slurm_env):
    job_id = phalanx("run", "-d", "--backend", "slurm", "--grace", "10", "-n", "2x1", TRAIN, "--epochs", "1",
                     "--steps-per-epoch", "100000", "--sleep", "0.2", check=True).stdout.strip()
    job = json.loads(phalanx("status", job_id, "--json", check=True).stdout)
    rank0 = Path(job["job_dir"], "attempt_0", "rank_0", "output.log")
    _wait_for(lambda: rank0.exists() and "step=2 " in rank0.read_text(), timeout=180, what="training to start")
    assert len(_processes_of(job)) >= 4  # two agents, two workers
    out = phalanx("stop", job_id, check=True).stdout
    assert out.strip() == f"{job_id} CANCELLED"
    slurm_id = _slurm_job(job)
    _wait_for(lambda: slurm_env.job_state(slurm_id) not in ("RUNNING", "COMPLETING"), timeout=30, what="the SLURM job to end")
    assert _processes_of(job) == []
    assert "SIGTERM" in rank0.read_text() or "checkpoint" in rank0.read_text()


def test_a_slurm_preemption_checkpoints_and_requeues(slurm_env):
    """What SLURM does ahead of a time limit (--signal) or on preemption: SIGTERM to every
    node's agent. The ranks checkpoint; phalanx runs the job again, which resumes."""
    job_id = phalanx("run", "-d", "--backend", "slurm", "--max-retries", "1", "-n", "2x1", TRAIN, "--epochs", "1",
                     "--steps-per-epoch", "40", "--sleep", "0.2", "--checkpoint-every", "2", check=True).stdout.strip()
    job = json.loads(phalanx("status", job_id, "--json", check=True).stdout)
    rank0 = Path(job["job_dir"], "attempt_0", "rank_0", "output.log")
    _wait_for(lambda: rank0.exists() and "step=4 " in rank0.read_text(), timeout=180, what="training to start")
    assert slurm_env.run("scancel", "--signal=TERM", _slurm_job(job)).returncode == 0
    phalanx("wait", job_id, "--timeout", "240", check=True)
    status = _status(job_id)
    assert status["state"] == "SUCCEEDED" and status["attempt"] == 1
    assert [(a["outcome"], a["retry"]) for a in status["attempts"]] == [("preempted", True), ("succeeded", False)]
    resumed = Path(job["job_dir"], "attempt_1", "rank_0", "output.log").read_text()
    assert re.search(r"resumed from step=([1-9]\d*)", resumed), resumed
    assert _slurm_job(job, 1) != _slurm_job(job, 0)


SLEEPER = """import signal, sys, time
def stop(*_):
    print("SIGTERM: checkpointing", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("started", flush=True)
while True:
    time.sleep(0.2)
"""


def test_time_limit_sends_sigterm_ahead_and_records_a_preemption(slurm_env, tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    started = time.monotonic()
    proc = phalanx("run", "--backend", "slurm", "--time", "1", "--signal-lead", "50", str(script), timeout=150)
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert time.monotonic() - started < 58, "SIGTERM must come ahead of the time limit"
    assert "SIGTERM: checkpointing" in proc.stdout
    assert "preempted" in proc.stderr and "phalanx resume" in proc.stderr
    assert _only_job()["state"] == "PREEMPTED"


STEPS = """import signal, sys, time
def stop(*_):
    print("SIGTERM: checkpointing", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
for step in range(int(sys.argv[1])):
    print(f"step={step} loss={1 / (step + 1):.4f}", flush=True)
    time.sleep(0.1)
"""


def _steps(tmp_path: Path) -> str:
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    return str(script)


def _lose_supervisor(job_id: str) -> dict:
    """SIGKILL the job's supervisor (nothing records an end); returns the job as ``status`` shows it: LOST."""
    os.kill(_status(job_id)["supervisor_pid"], signal.SIGKILL)
    _wait_for(lambda: _status(job_id)["state"] == "LOST", timeout=20, what="the job to show LOST")
    return _status(job_id)


def test_queue_time_does_not_count_as_a_stall(slurm_env, tmp_path):
    job_id = phalanx("run", "-d", "--backend", "slurm", "--stall-timeout", "8", "--sbatch=--hold", _steps(tmp_path), "10",
                     check=True).stdout.strip()
    job = _status(job_id)
    _wait_for(lambda: Path(job["job_dir"], "attempt_0", "scheduler.json").exists(), timeout=30, what="the submission")
    slurm_id = _slurm_job(job)
    time.sleep(10)  # held in the queue for longer than the stall timeout
    assert slurm_env.job_state(slurm_id) == "PENDING" and _status(job_id)["state"] == "RUNNING"
    assert slurm_env.run("scontrol", "release", slurm_id).returncode == 0
    phalanx("wait", job_id, "--timeout", "90")
    status = _status(job_id)
    assert status["state"] == "SUCCEEDED", status


def test_resume_of_a_lost_job_watches_its_running_slurm_job(slurm_env, tmp_path):
    job_id = phalanx("run", "-d", "--backend", "slurm", _steps(tmp_path), "150", check=True).stdout.strip()
    job = _status(job_id)
    rank0 = Path(job["job_dir"], "attempt_0", "rank_0", "output.log")
    _wait_for(lambda: rank0.exists() and "step=3 " in rank0.read_text(), timeout=60, what="the job to start")
    _lose_supervisor(job_id)
    slurm_id = _slurm_job(job)
    assert slurm_env.job_state(slurm_id) == "RUNNING", "SLURM runs the job on without its supervisor"
    assert f"left      SLURM job {slurm_id} still runs without a supervisor" in phalanx("status", job_id, check=True).stdout
    phalanx("resume", "-d", job_id, check=True)
    phalanx("wait", job_id, "--timeout", "90", check=True)
    status = _status(job_id)
    assert status["state"] == "SUCCEEDED" and status["attempt"] == 0
    assert [(a["attempt"], a["outcome"]) for a in status["attempts"]] == [(0, "succeeded")]
    assert not Path(job["job_dir"], "attempt_1").exists(), "no second copy was submitted"
    assert slurm_env.job_state(slurm_id) == "COMPLETED"
    assert "still runs as SLURM job " + slurm_id in Path(job["job_dir"], "supervisor.log").read_text()
    metrics = read_metrics(JobPaths(Path(job["job_dir"])), 0, 0)
    assert sorted(m["step"] for m in metrics if m["name"] == "loss") == list(range(150))


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "never-recorded"])
def test_stop_of_a_lost_job_cancels_its_slurm_job(slurm_env, tmp_path, recorded):
    job_id = phalanx("run", "-d", "--backend", "slurm", "--grace", "5", _steps(tmp_path), "100000",
                     check=True).stdout.strip()
    job = _status(job_id)
    rank0 = Path(job["job_dir"], "attempt_0", "rank_0", "output.log")
    _wait_for(lambda: rank0.exists() and "step=3 " in rank0.read_text(), timeout=60, what="the job to start")
    _lose_supervisor(job_id)
    slurm_id = _slurm_job(job)
    if not recorded:  # as if the supervisor died before it wrote down sbatch's answer
        Path(job["job_dir"], "attempt_0", "scheduler.json").unlink()
    assert _processes_of(job), "the job runs on without its supervisor"
    assert phalanx("stop", job_id, check=True).stdout.strip() == f"{job_id} LOST"
    assert slurm_env.job_state(slurm_id) not in ("PENDING", "RUNNING", "COMPLETING")
    assert _processes_of(job) == []
    assert "SIGTERM: checkpointing" in rank0.read_text()
    assert f"phalanx stop stopped SLURM job {slurm_id}" in _status(job_id)["root_cause"]["message"]
    assert phalanx("stop", job_id, check=True).stdout.strip() == f"{job_id} LOST"  # idempotent


def test_sbatch_refusal_is_reported(slurm_env):
    proc = phalanx("run", "--backend", "slurm", "--partition", "nosuch", str(EXAMPLES / "hello.py"), timeout=60)
    assert proc.returncode == 1
    assert "sbatch did not take the job" in proc.stderr and "nosuch" in proc.stderr
    assert _only_job()["state"] == "FAILED"


def test_a_job_slurm_can_never_start_fails_saying_why(slurm_env):
    proc = phalanx("run", "--backend", "slurm", "-n", "3x1", str(EXAMPLES / "hello.py"), timeout=120)
    assert proc.returncode == 1, proc.stderr
    job = _only_job()
    assert job["state"] == "FAILED"
    assert "can never start as asked (PartitionNodeLimit)" in _status(job["id"])["root_cause"]["log_tail"]
    assert slurm_env.job_state(_slurm_job(job)) == "CANCELLED"


ECHO = "import json, sys\nprint('ARGS=' + json.dumps(sys.argv[1:]), flush=True)\n"
ODD = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12) | st.sampled_from(
    ["a b", "'", '"', "$HOME", "$(touch pwned)", "`id`", "; rm -rf x", "a\nb", "\\", "--flag=x y", "*", "&&", "#"])


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(ODD, min_size=1, max_size=4))
def test_odd_arguments_survive_the_trip_through_sbatch(slurm_env, tmp_path, args):
    # a search space would make a sweep, and {node_rank}-style placeholders are filled in: both on purpose
    assume(not any(f"{{{key}}}" in a for a in args for key in TEMPLATE_KEYS))
    assume(parse_space(tuple(args)).args == tuple(args) and not parse_space(tuple(args)).params)
    script = tmp_path / "echo_args.py"
    script.write_text(ECHO)
    proc = phalanx("run", "--backend", "slurm", str(script), *args, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    printed = re.search(r"^ARGS=(.*)$", proc.stdout, re.M)
    assert printed and json.loads(printed.group(1)) == args
    assert not list(tmp_path.glob("pwned")) and not list(Path.cwd().glob("pwned"))



TRIAL = """import argparse
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float)
lr = p.parse_args().lr
for step in range(3):
    print(f"step={step} loss={lr * (3 - step):.3f}", flush=True)
"""


def test_a_sweep_runs_its_trials_as_slurm_jobs(slurm_env, tmp_path):
    script = tmp_path / "trial.py"
    script.write_text(TRIAL)
    proc = phalanx("run", "--backend", "slurm", "--objective", "loss:min", str(script), "--lr", "[0.5, 0.1]",
                   check=True, timeout=240)
    sweep = next(r for r in json.loads(phalanx("ps", "--all", "--json", check=True).stdout) if r.get("kind") == "sweep")
    assert sweep["state"] == "SUCCEEDED" and sweep["progress"] == "2/2", proc.stderr
    assert sweep["best_params"] == {"lr": 0.1} and sweep["best_value"] == pytest.approx(0.1)
    trials = json.loads(phalanx("sweep", "show", sweep["id"], "--json", check=True).stdout)["trials"]
    jobs = [_status(t["id"]) for t in trials]
    assert [(j["backend"], j["state"]) for j in jobs] == [("slurm", "SUCCEEDED")] * 2
    assert all(Path(j["job_dir"], "attempt_0", "scheduler.json").exists() for j in jobs)


def test_a_node_that_fails_its_check_is_excluded_by_slurmctld_from_the_rerun(slurm_env, tmp_path):
    """The check fails on whichever node SLURM gives the first attempt; the job runs again (no
    --max-retries needed: nothing of it ran) as a batch job whose --exclude slurmctld applies."""
    (tmp_path / "where.py").write_text("import os\nprint('ran on', os.environ['SLURMD_NODENAME'], flush=True)\n")
    check = 'test "$PHALANX_ATTEMPT" != 0 || { echo "bad: disk: sick $SLURMD_NODENAME"; exit 4; }'
    proc = phalanx("run", "--backend", "slurm", "--time", "10", "-n", "1x1", "--health-check-cmd", check, "where.py",
                   timeout=300, cwd=tmp_path)
    job = _only_job()
    assert proc.returncode == 0 and job["state"] == "SUCCEEDED" and job["attempt"] == 1, proc.stdout + proc.stderr
    (entry,) = _status(job["id"])["attempts"][0]["left_out"]
    bad = entry["node"]
    assert bad in ("n1", "n2") and entry["left_out"] and f"sick {bad}" in entry["why"]
    first, second = (slurm_env.run("scontrol", "show", "job", "--oneliner", _slurm_job(job, a)).stdout for a in (0, 1))
    assert f" NodeList={bad} " in first and "ExcNodeList=(null)" in first
    assert f" ExcNodeList={bad} " in second and f" NodeList={bad} " not in second, second
    good = {"n1": "n2", "n2": "n1"}[bad]
    assert f"ran on {good}" in proc.stdout
    shown = phalanx("status", job["id"], check=True).stdout
    assert f"{bad} after attempt 0: failed its health check: exit 4: bad: disk: sick {bad} (left out of the next attempt)" in shown


def test_doctor_checks_the_nodes_slurm_allocates(slurm_env, tmp_path):
    proc = phalanx("doctor", "--backend", "slurm", "--time", "10", "-n", "2x1", "--burn", "0.5", "--json",
                   cwd=tmp_path, timeout=300)
    found = json.loads(proc.stdout)
    # the nodes by the names SLURM gave them (the agents' SLURMD_NODENAME), each with its report
    assert sorted(found["names"].values()) == ["n1", "n2"], proc.stdout + proc.stderr
    assert [n["node_rank"] for n in found["nodes"]] == [0, 1]
    assert all(n["devices"][0]["burn_ok"] and n["disk_free"] for n in found["nodes"])
    assert found["links_backend"] == "gloo" and found["links"][0]["bandwidth"] > 0
    assert proc.returncode == (0 if found["healthy"] else 1)


def test_a_secret_reaches_the_ranks_through_sbatchs_environment_not_the_script(slurm_env, tmp_path, monkeypatch):
    """--secret on SLURM: the value travels in the environment of the sbatch phalanx runs (SLURM hands
    it to the batch step and srun to each node's agent); the ranks see it, the batch script, the job
    directory and the store never hold it, what a rank prints of it is masked. Who else can read it:
    slurmctld keeps a batch job's environment with its state (StateSaveLocation, the SlurmUser's),
    as docs/secrets.md says; checked here in the real daemon's state directory."""
    import hashlib
    import sqlite3

    canary = f"slurm-canary-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("PHALANX_SECRETS_FILE", str(tmp_path / "cfg" / "secrets.json"))
    monkeypatch.setenv("PHALANX_SECRETS_STORE", "file")
    from phalanx.secrets.local import open_store

    open_store().set("slurm_db", canary, owner="test")
    (tmp_path / "show.py").write_text(
        "import hashlib, os, sys\nv = os.environ['DB_PASSWORD']\n"
        "print('rank', os.environ['RANK'], 'sha', hashlib.sha256(v.encode()).hexdigest(), flush=True)\n"
        "sys.stdout.write('pw=' + v[:5]); sys.stdout.flush(); sys.stdout.write(v[5:] + '\\n')\n")
    phalanx("run", "--backend", "slurm", "--time", "10", "-n", "2x1", "--secret", "DB_PASSWORD=slurm_db", "show.py",
            check=True, timeout=300, cwd=tmp_path)
    job = _only_job()
    attempt = Path(job["job_dir"], "attempt_0")
    digest = hashlib.sha256(canary.encode()).hexdigest()
    for rank in (0, 1):
        log = (attempt / f"rank_{rank}" / "output.log").read_text()
        assert f"rank {rank} sha {digest}" in log and "pw=********" in log and canary not in log
    script = (attempt / "batch.sh").read_text()
    assert canary not in script and "DB_PASSWORD" not in script
    for path in Path(os.environ["PHALANX_HOME"]).rglob("*"):
        if path.is_file():
            assert canary.encode() not in path.read_bytes(), path
    con = sqlite3.connect(Path(os.environ["PHALANX_HOME"]) / "phalanx.db")
    assert canary not in "\n".join(con.iterdump())
    con.close()
    kept = [p for p in (slurm_env.root / "ctld").rglob("environment*") if canary.encode() in p.read_bytes()]
    assert kept, "slurmctld keeps the batch job's environment in its state directory (docs/secrets.md says so)"


def test_a_warm_pool_never_outlives_the_allocation_that_started_it(slurm_env, tmp_path, tmp_path_factory, monkeypatch):
    """``phalanx run`` (local, warm) inside a batch job starts a warm pool there; SLURM's process
    tracking (here proctrack/linuxproc) does not see the daemonized pool, so the pool itself ends
    once the allocation's slurmstepd has gone, and its log says so."""
    import sys

    from phalanx.launch.warm import plan as warm

    pools = tmp_path_factory.mktemp("pools")  # short: a socket's path has at most 107 bytes
    pools.chmod(0o700)
    monkeypatch.setenv("PHALANX_WARM", "1")
    monkeypatch.setenv("PHALANX_WARM_DIR", str(pools))
    hello = tmp_path / "hello.py"
    hello.write_text("print('hello from the script')\n")
    run = f"{sys.executable} -m phalanx run {hello}"
    batch = tmp_path / "job.sh"
    # The first run starts the pool; the second, once it listens, is forked from it.
    batch.write_text(f"#!/bin/sh\n{run}\nfor i in $(seq 600); do ls {pools}/*.sock >/dev/null 2>&1 && break; "
                     f"sleep 0.1; done\n{run}\n")
    submitted = slurm_env.run("sbatch", "--parsable", f"--chdir={tmp_path}", f"--output={tmp_path}/out.log", str(batch))
    assert submitted.returncode == 0, submitted.stderr
    slurm_id = submitted.stdout.strip().split(";")[0]
    _wait_for(lambda: slurm_env.job_state(slurm_id) not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"),
              timeout=300, what="the batch job to end")
    assert (tmp_path / "out.log").read_text().count("hello from the script") == 2, (tmp_path / "out.log").read_text()
    log = "".join(p.read_text() for p in pools.glob("*.log"))
    assert "holding" in log, log  # a pool did start in the allocation
    _wait_for(lambda: not [p for p in warm.pools(str(pools)) if not p.get("dead")], timeout=60,
              what="the pool to end with the allocation")
    _wait_for(lambda: "the SLURM allocation that started it ended" in "".join(p.read_text() for p in pools.glob("*.log")),
              timeout=30, what="the pool's note")
