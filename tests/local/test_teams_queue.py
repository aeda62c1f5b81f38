"""A project's quota on this machine's own store, with real jobs: a foreground run waits in the
queue and starts when capacity frees (Ctrl-C while it waits cancels it, nothing ran), and a
sweep counts trial by trial (4 trials in a 1-job quota run one at a time, though this machine has
slots for 2)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT, phalanx

pytestmark = pytest.mark.local

JOB = "import sys, time\nprint('started', sys.argv[1:], flush=True)\ntime.sleep(float(sys.argv[1]))\nprint('step=1 loss=0.5')\n"


@pytest.fixture
def quota(phx_home, tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    phalanx("server", "project", "set", "default", "--max-jobs", "1", check=True)
    return tmp_path


def state(ref: str) -> dict:
    return json.loads(phalanx("status", ref, "--json", check=True).stdout)


def test_a_foreground_run_waits_for_capacity_and_ctrl_c_cancels_it_while_queued(quota):
    first = phalanx("run", "-d", "--cold", str(quota / "job.py"), "600", check=True).stdout.strip()
    proc = subprocess.Popen([sys.executable, "-m", "phalanx", "run", "--cold", str(quota / "job.py"), "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "queued:" in line:
            break
    assert line.strip().endswith("queued: waiting for quota: 1/1 jobs of project default in use (place 1); "
                                 "it starts by itself when capacity frees"), line
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "started" not in out, (out, err)
    queued = [r for r in json.loads(phalanx("ps", "--all", "--json").stdout) if r["id"] != first][0]
    assert queued["state"] == "CANCELLED" and queued["started_at"] is None
    assert queued["root_cause"]["message"] == "cancelled while queued (SIGINT)"
    assert state(first)["state"] == "RUNNING", "the job holding the quota runs on"
    phalanx("stop", first, check=True)


def test_a_foreground_run_starts_by_itself_when_capacity_frees(quota):
    first = phalanx("run", "-d", "--cold", str(quota / "job.py"), "3", check=True).stdout.strip()
    done = phalanx("run", "--cold", str(quota / "job.py"), "0")
    assert done.returncode == 0, done.stderr
    assert "queued: waiting for quota" in done.stderr and "admitted: starting" in done.stderr
    assert done.stdout.startswith("started ['0']")
    mine = [r for r in json.loads(phalanx("ps", "--all", "--json").stdout) if r["id"] != first][0]
    assert mine["started_at"] >= state(first)["ended_at"] - 0.5, "it started once the first ended"


def test_a_sweep_counts_trial_by_trial(quota):
    swept = phalanx("run", "--cold", "--parallel", "2", str(quota / "job.py"), "[0.5, 0.6, 0.7, 0.8]")
    assert swept.returncode == 0, swept.stderr
    trials = [r for r in json.loads(phalanx("ps", "--all", "--json").stdout) if r.get("kind") == "sweep"]
    rows = json.loads(phalanx("ps", "--trials", trials[0]["id"], "--json").stdout)
    assert len(rows) == 4 and all(r["state"] == "SUCCEEDED" for r in rows)
    spans = sorted((r["started_at"], r["ended_at"]) for r in rows)
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), f"one at a time: {spans}"
    assert "queued: waiting for quota: 1/1 jobs of project default in use" in swept.stderr, swept.stderr
