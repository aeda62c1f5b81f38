"""Stopping a job that is stopping already: a second ``phalanx stop`` (a person pressing twice, the
dashboard and the CLI) changes nothing, the ranks keep their grace period; ``--now`` alone cuts it
short. Real jobs whose ranks checkpoint in their SIGTERM handler."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from tests.conftest import ROOT, phalanx
from tests.local.test_run import _wait_for

pytestmark = pytest.mark.local

# Saving goes on until the test lets it finish (the file RELEASE appears), within the grace period.
CHECKPOINTS = """
import os, signal, sys, time

def on_term(signum, frame):
    print("SIGTERM: saving", flush=True)
    deadline = time.monotonic() + 50
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("checkpoint saved", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, on_term)
print("training", flush=True)
time.sleep(600)
"""


def _start(tmp_path, nproc: int = 1) -> tuple[str, object]:
    script = tmp_path / "train.py"
    script.write_text(CHECKPOINTS)
    release = tmp_path / "release"
    topology = ["-n", str(nproc)] if nproc > 1 else []
    job = phalanx("run", "-d", "--cold", "--grace", "60", *topology, str(script), str(release), check=True).stdout.strip()
    _wait_for(lambda: phalanx("logs", job).stdout.count("training") == nproc, timeout=120, what="the ranks to run")
    return job, release


def _said(stop: subprocess.Popen, words: str) -> str:
    """What ``stop`` printed on stderr until it said ``words`` (or ended)."""
    assert stop.stderr is not None
    seen = ""
    while words not in seen and (line := stop.stderr.readline()):
        seen += line
    return seen


def _stop(job: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "phalanx", "stop", job, *extra], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _saving(job: str) -> bool:
    return "SIGTERM: saving" in phalanx("logs", job).stdout


def _state(job: str) -> str:
    return json.loads(phalanx("status", job, "--json", check=True).stdout)["state"]


@pytest.mark.parametrize("nproc", [1, 2], ids=["lone", "torchrun"])
def test_a_second_stop_keeps_the_grace_period(phx_home, tmp_path, nproc):
    job, release = _start(tmp_path, nproc)
    first = _stop(job)
    _wait_for(lambda: phalanx("logs", job).stdout.count("SIGTERM: saving") == nproc, timeout=60,
              what="the ranks to get SIGTERM")
    second = _stop(job)  # while the ranks save their checkpoint
    said = _said(second, "already stopping")
    release.touch()
    outs = [p.communicate(timeout=120) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    logs = phalanx("logs", job).stdout
    assert logs.count("checkpoint saved") == nproc, logs  # not killed by the second stop
    assert "already stopping" in said and "of grace left" in said, said
    assert _state(job) == "CANCELLED"


def test_stops_at_the_same_moment_keep_the_grace_period(phx_home, tmp_path):
    job, release = _start(tmp_path)
    stops = [_stop(job) for _ in range(3)]
    said: list[list[str]] = [[], [], []]

    def read(i: int) -> None:
        assert stops[i].stderr is not None
        said[i].extend(iter(stops[i].stderr.readline, ""))

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(3)]
    for reader in readers:
        reader.start()

    def stopping() -> int:
        return sum(any("already stopping" in line for line in lines) for lines in said)

    # The stop that marks the job signals it and says nothing; the two others say so, and wait.
    _wait_for(lambda: stopping() == 2 or all(stop.poll() is not None for stop in stops), timeout=120,
              what="two stops to find the job stopping")
    release.touch()
    for stop, reader in zip(stops, readers):
        stop.wait(timeout=120)
        reader.join(timeout=60)
    assert all(p.returncode == 0 for p in stops), said
    assert "checkpoint saved" in phalanx("logs", job).stdout
    assert stopping() == 2, said
    assert _state(job) == "CANCELLED"


def test_stop_now_cuts_the_grace_period_short(phx_home, tmp_path):
    job, _release = _start(tmp_path)  # never released: only a kill ends the saving
    first = _stop(job)
    _wait_for(lambda: _saving(job), timeout=60, what="the rank to get SIGTERM")
    now = _stop(job, "--now")
    outs = [p.communicate(timeout=120) for p in (first, now)]
    assert [p.returncode for p in (first, now)] == [0, 0], outs
    assert "checkpoint saved" not in phalanx("logs", job).stdout  # killed while saving
    assert _state(job) == "CANCELLED"
