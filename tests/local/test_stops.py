"""Stopping a job that is stopping already: a second ``phalanx stop`` (a person pressing twice, the
dashboard and the CLI) changes nothing, the ranks keep their grace period; ``--now`` alone cuts it
short. Real jobs whose ranks checkpoint in their SIGTERM handler."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, phalanx
from tests.local.test_run import _wait_for

pytestmark = pytest.mark.local

# Saving takes 2 s of the 4 s grace period; then it exits 0.
CHECKPOINTS = """
import signal, sys, time

def on_term(signum, frame):
    print("SIGTERM: saving", flush=True)
    time.sleep(2)
    print("checkpoint saved", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, on_term)
print("training", flush=True)
time.sleep(600)
"""


def _start(tmp_path, nproc: int = 1) -> str:
    script = tmp_path / "train.py"
    script.write_text(CHECKPOINTS)
    topology = ["-n", str(nproc)] if nproc > 1 else []
    job = phalanx("run", "-d", "--cold", "--grace", "4", *topology, str(script), check=True).stdout.strip()
    _wait_for(lambda: phalanx("logs", job).stdout.count("training") == nproc, timeout=120, what="the ranks to run")
    return job


def _stop(job: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "phalanx", "stop", job, *extra], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _saving(job: str) -> bool:
    return "SIGTERM: saving" in phalanx("logs", job).stdout


def _state(job: str) -> str:
    return json.loads(phalanx("status", job, "--json", check=True).stdout)["state"]


@pytest.mark.parametrize("nproc", [1, 2], ids=["lone", "torchrun"])
def test_a_second_stop_keeps_the_grace_period(phx_home, tmp_path, nproc):
    job = _start(tmp_path, nproc)
    first = _stop(job)
    _wait_for(lambda: _saving(job), timeout=60, what="the ranks to get SIGTERM")
    second = _stop(job)  # while the ranks save their checkpoint
    outs = [p.communicate(timeout=120) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    logs = phalanx("logs", job).stdout
    assert logs.count("checkpoint saved") == logs.count("SIGTERM: saving") == nproc, logs
    assert "already stopping" in outs[1][1] and "of grace left" in outs[1][1], outs[1]
    assert _state(job) == "CANCELLED"


def test_stops_at_the_same_moment_keep_the_grace_period(phx_home, tmp_path):
    job = _start(tmp_path)
    stops = [_stop(job) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in stops]
    assert all(p.returncode == 0 for p in stops), outs
    assert "checkpoint saved" in phalanx("logs", job).stdout
    assert sum("already stopping" in err for _out, err in outs) == 2, outs
    assert _state(job) == "CANCELLED"


def test_stop_now_cuts_the_grace_period_short(phx_home, tmp_path):
    job = _start(tmp_path)
    first = _stop(job)
    _wait_for(lambda: _saving(job), timeout=60, what="the rank to get SIGTERM")
    now = _stop(job, "--now")
    outs = [p.communicate(timeout=120) for p in (first, now)]
    assert [p.returncode for p in (first, now)] == [0, 0], outs
    assert "checkpoint saved" not in phalanx("logs", job).stdout  # killed while saving
    assert _state(job) == "CANCELLED"
