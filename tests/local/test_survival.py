"""Survival with real faults: killed workers, signals to the launcher, killed supervisors, stalls."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import EXAMPLES, ROOT, phalanx
from tests.local.test_run import _alive, _rank_pids, _status, _wait_for

pytestmark = pytest.mark.local

TRAIN = str(EXAMPLES / "train_ddp.py")


def _last_step(log: Path) -> int:
    steps = re.findall(r"step=(\d+) loss", log.read_text()) if log.exists() else []
    return int(steps[-1]) if steps else 0


def test_killed_worker_retries_from_checkpoint_and_matches_uninterrupted_run(phx_home):
    args = ["--epochs", "2", "--steps-per-epoch", "15", "--checkpoint-every", "5", "--sleep", "0.15"]
    job_id = phalanx("run", "-d", "--name", "faulty", "--max-retries", "2", "-n", "2x2", TRAIN, *args,
                     check=True).stdout.strip()
    job_dir = Path(_status(job_id)["job_dir"])
    rank0 = job_dir / "attempt_0" / "rank_0" / "output.log"
    _wait_for(lambda: _last_step(rank0) >= 12, timeout=120, what="training past step 12")
    victim = json.loads((job_dir / "attempt_0" / "rank_3" / "proc.json").read_text())["pid"]
    os.kill(victim, signal.SIGKILL)
    killed_at = _last_step(rank0)
    assert phalanx("wait", job_id, "--timeout", "240").returncode == 0
    final = _status(job_id)
    assert final["state"] == "SUCCEEDED", final
    assert final["attempt"] == 1 and final["retries"] == 1
    attempts = final["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed", "succeeded"]
    assert "SIGKILL" in attempts[0]["message"] or "killed" in attempts[0]["message"]
    log1 = (job_dir / "attempt_1" / "rank_0" / "output.log").read_text()
    resumed = int(re.search(r"resumed from step=(\d+)", log1).group(1))
    # no more than one checkpoint interval of work is repeated
    assert killed_at - 5 <= resumed <= killed_at
    assert "step=30 " in log1
    # A deterministic training ends with the weights of an uninterrupted run: equal up to
    # float32 rounding (gloo's summation order follows which ranks share a node, and c10d
    # assigns node ranks by arrival, so bit-equality is not guaranteed across runs).
    phalanx("run", "--name", "clean", "-n", "2x2", TRAIN, *args, check=True)
    clean = json.loads(phalanx("status", "clean", "--json", check=True).stdout)
    torch = pytest.importorskip("torch")
    a = torch.load(job_dir / "output" / "model.pt")
    b = torch.load(Path(clean["job_dir"]) / "output" / "model.pt")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=0, atol=1e-6), (key, (a[key] - b[key]).abs().max())


def test_sigterm_to_launcher_checkpoints_then_resume_continues(phx_home):
    cli = subprocess.Popen(
        [sys.executable, "-m", "phalanx", "run", "--name", "pre", "--grace", "20", "-n", "2", TRAIN,
         "--epochs", "3", "--steps-per-epoch", "20", "--checkpoint-every", "1000", "--sleep", "0.1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        _wait_for(lambda: any(_last_step(p) >= 3 for p in (phx_home / "jobs").glob("*/attempt_0/rank_0/output.log")),
                  timeout=120, what="training")
        tree = [p.pid for p in psutil.Process(cli.pid).children(recursive=True)]
        cli.send_signal(signal.SIGTERM)  # what a scheduler sends before taking the node
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
    assert cli.returncode == 143, err
    assert "preempted" in err and "phalanx resume" in err
    saved = int(re.search(r"checkpoint saved at step=(\d+)", out).group(1))
    assert _alive(tree) == []
    status = json.loads(phalanx("status", "pre", "--json", check=True).stdout)
    assert status["state"] == "PREEMPTED"
    resumed = phalanx("resume", "pre", check=True)
    assert f"resumed from step={saved}" in resumed.stdout and "[0] done" in resumed.stdout
    status = json.loads(phalanx("status", "pre", "--json", check=True).stdout)
    assert status["state"] == "SUCCEEDED" and status["attempt"] == 1
    assert [a["outcome"] for a in status["attempts"]] == ["preempted", "succeeded"]


def test_kill9_supervisor_is_lost_then_resume_finishes(phx_home):
    job_id = phalanx("run", "-d", "--name", "orphan", "-n", "2", TRAIN, "--epochs", "2", "--steps-per-epoch", "20",
                     "--checkpoint-every", "2", "--sleep", "0.1", check=True).stdout.strip()
    job_dir = Path(_status(job_id)["job_dir"])
    _wait_for(lambda: _last_step(job_dir / "attempt_0" / "rank_0" / "output.log") >= 4, timeout=120, what="training")
    supervisor = psutil.Process(_status(job_id)["supervisor_pid"])
    tree = [p.pid for p in supervisor.children(recursive=True)] + _rank_pids(str(job_dir))
    supervisor.kill()
    _wait_for(lambda: _alive(tree) == [], timeout=30, what="no worker to survive")
    assert _status(job_id)["state"] == "LOST"
    resumed = phalanx("resume", "--attach", job_id, check=True)  # started with -d: here, to watch it
    assert "resumed from step=" in resumed.stdout and "[0] done" in resumed.stdout
    assert _status(job_id)["state"] == "SUCCEEDED"


def test_max_retries_is_exact_and_patterns_stop_retries(phx_home, tmp_path):
    failing = tmp_path / "fail.py"
    failing.write_text("import os, sys\nprint('attempt', os.environ['PHALANX_ATTEMPT'], 'job', os.environ['PHALANX_JOB_ID'])\nsys.exit(1)\n")
    proc = phalanx("run", "--name", "always", "--max-retries", "2", str(failing))
    assert proc.returncode == 1
    assert proc.stderr.count("retrying") == 2
    status = json.loads(phalanx("status", "always", "--json", check=True).stdout)
    assert status["state"] == "FAILED" and status["retries"] == 2
    assert [a["retry"] for a in status["attempts"]] == [True, True, False]
    assert "no retries left (2/2 used)" in status["attempts"][-1]["reason"]
    ids = set(re.findall(r"attempt (\d) job (\w+)", proc.stdout))
    assert ids == {("0", status["id"]), ("1", status["id"]), ("2", status["id"])}

    oom = tmp_path / "oom.py"
    oom.write_text("import sys\nprint('RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB')\nsys.exit(1)\n")
    proc = phalanx("run", "--name", "oom", "--max-retries", "3", str(oom))
    assert proc.returncode == 1 and "retrying" not in proc.stderr
    attempts = json.loads(phalanx("status", "oom", "--json", check=True).stdout)["attempts"]
    assert len(attempts) == 1 and "no-retry-on 'CUDA out of memory'" in attempts[0]["reason"]

    proc = phalanx("run", "--name", "codes", "--max-retries", "3", "--retry-on-exit-codes", "137,143", str(failing))
    assert proc.returncode == 1 and "retrying" not in proc.stderr
    custom = phalanx("run", "--name", "custom", "--max-retries", "1", "--no-retry-on", "attempt 0", str(failing))
    assert "retrying" not in custom.stderr


def test_stalled_rank_is_detected_with_stacks(phx_home, tmp_path):
    script = tmp_path / "stall.py"
    script.write_text(
        "import os, time, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(1)\n"
        "dist.all_reduce(t)\n"
        "print('first all_reduce done', flush=True)\n"
        "if dist.get_rank() == 1:\n"
        "    time.sleep(600)  # a rank that never joins the next collective\n"
        "dist.all_reduce(t)\n"
    )
    start = time.monotonic()
    # The stall clock runs from the attempt's start: the timeout leaves room for the agent's and
    # the ranks' start-up (torch imports) on a loaded machine, so the stall is rank 1's sleep.
    proc = phalanx("run", "--grace", "3", "--stall-timeout", "12", "-n", "2", str(script), timeout=120)
    assert time.monotonic() - start < 90
    assert proc.returncode == 124
    status = json.loads(phalanx("status", "stall", "--json", check=True).stdout)
    assert status["state"] == "FAILED" and "stall-timeout" in status["root_cause"]["message"]
    log1 = Path(status["job_dir"], "attempt_0", "rank_1", "output.log").read_text()
    assert "most recent call first" in log1 and "stall.py" in log1  # faulthandler's stack dump


RESTART_SCRIPT = """
import os, signal, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(10)
for step in range(1, 6):
    dist.all_reduce(t)
    if step == 3 and rank == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
print(f"finished rank={rank} restart={os.environ['TORCHELASTIC_RESTART_COUNT']} attempt={os.environ['PHALANX_ATTEMPT']}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("repeat", range(3))
def test_torchrun_in_place_restart_is_reliable(phx_home, tmp_path, repeat):
    script = tmp_path / "restart.py"
    script.write_text(RESTART_SCRIPT)
    proc = phalanx("run", "--max-restarts", "1", "-n", "2", str(script), timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # recovered in place (torchrun restart 1), not by a job-level retry
    assert sorted(re.findall(r"finished rank=(\d) restart=(\d) attempt=(\d)", proc.stdout)) == [
        ("0", "1", "0"), ("1", "1", "0")]


UNDYING = """
import ctypes, os, signal, time
ctypes.CDLL(None).prctl(1, 0)  # PR_SET_PDEATHSIG 0: this rank would outlive its node agent
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGTERM", flush=True)
time.sleep(600)
"""


def test_ranks_that_would_outlive_their_agent_are_gone_when_the_job_ends(phx_home, tmp_path):
    """A rank that ignores SIGTERM and cleared its death signal (as a daemonising library may)
    survives its node agent's death (here: kill -9): the supervisor kills it by its pid before
    it records the attempt's end, so nothing of an ended job is left running."""
    script = tmp_path / "undying.py"
    script.write_text(UNDYING)
    job_id = phalanx("run", "-d", "--grace", "1", "-n", "2", str(script), check=True).stdout.strip()
    job_dir = _status(job_id)["job_dir"]
    _wait_for(lambda: len(_rank_pids(job_dir)) == 2 and all(
        "ignoring SIGTERM" in p.read_text() for p in Path(job_dir).glob("attempt_0/rank_*/output.log")), timeout=90,
        what="every rank ignoring SIGTERM")
    pids = _rank_pids(job_dir)
    agent = psutil.Process(pids[0]).ppid()  # torch's elastic agent runs in phalanx's node agent
    assert agent == psutil.Process(pids[1]).ppid() and agent != _status(job_id)["supervisor_pid"]
    os.kill(agent, signal.SIGKILL)
    _wait_for(lambda: _status(job_id)["state"] == "FAILED", timeout=60, what="the job's end")
    try:
        assert _alive(pids) == [], "a rank outlived its job"
    finally:
        for pid in _alive(pids):
            os.kill(pid, signal.SIGKILL)
