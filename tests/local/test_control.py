"""The command line keeps up: ps with filters and columns, logs --tail/--since, rm and prune,
top when piped, usage — with real jobs (small scripts, no torch)."""

from __future__ import annotations

import io
import json
import re
import time

import pytest

from tests.conftest import phalanx
from tests.local.test_run import _wait_for

pytestmark = pytest.mark.local

JOB = """
import argparse, os, sys, time
p = argparse.ArgumentParser()
p.add_argument("--x", type=float, default=1.0)
p.add_argument("--lines", type=int, default=10)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--fail", action="store_true")
p.add_argument("--save", default="")
a = p.parse_args()
if a.save:
    open(os.path.join(os.environ["PHALANX_STATE_DIR"], a.save), "w").write("checkpoint")
for step in range(1, a.lines + 1):
    print(f"line {step} step={step} loss={a.x / step:.4f}", flush=True)
    time.sleep(a.sleep)
if a.fail:
    sys.exit(3)
"""


@pytest.fixture
def job_script(tmp_path):
    path = tmp_path / "project" / "job.py"
    path.parent.mkdir()
    path.write_text(JOB)
    return path


def _ids(proc) -> list[str]:
    return proc.stdout.split()


def test_ps_filters_columns_and_short_commands(phx_home, job_script):
    phalanx("run", "--name", "alpha", "--tag", "team=vision", str(job_script), "--x", "2", check=True)
    phalanx("run", "--name", "beta", "--tag", "team=audio", str(job_script), "--x", "0.5", check=True)
    failed = phalanx("run", "--name", "gamma", str(job_script), "--fail")
    assert failed.returncode == 3
    listed = phalanx("ps", "--all", check=True).stdout
    assert "job.py --x 2" in listed and str(job_script.parent) not in listed, "the script's name, not its path"
    assert phalanx("ps", "--state", "failed", "-q", check=True).stdout.split() == _ids(phalanx("ps", "--name", "gamma", "-q"))
    assert len(_ids(phalanx("ps", "--state", "succeeded", "-q", check=True))) == 2
    assert len(_ids(phalanx("ps", "--name", "*a", "-q", check=True))) == 3
    tagged = phalanx("ps", "--tag", "team=vision", "--wide", check=True).stdout
    assert "alpha" in tagged and "beta" not in tagged and "team=vision" in tagged and "CPU-H" in tagged
    assert phalanx("ps", "--since", "1h", "-q", check=True).stdout.count("\n") == 3
    assert phalanx("ps", "--since", "2999-01-01", "-q", check=True).stdout == ""
    assert phalanx("ps", "--all", "--limit", "1", "-q", check=True).stdout.count("\n") == 1
    by_loss = phalanx("ps", "-c", "loss,loss:max", "--sort", "loss", check=True).stdout.splitlines()
    assert by_loss[0].split()[6:9] == ["PROGRESS", "LOSS", "LOSS:MAX"]
    assert [line.split()[1] for line in by_loss[1:]] == ["beta", "gamma", "alpha"]  # last loss 0.05, 0.1, 0.2
    rows = json.loads(phalanx("ps", "--all", "--json", "-c", "loss", check=True).stdout)
    assert {r["name"]: r["columns"]["loss"] for r in rows} == {"alpha": 0.2, "beta": 0.05, "gamma": 0.1}


def test_ps_columns_fit_the_terminal(phx_home, monkeypatch):
    from phalanx.cli.listing import _fit

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", "80")
    out = Terminal()
    row = ["3f2a9c01", "a-rather-long-job-name-for-a-narrow-terminal", "SUCCEEDED", "1x1", "2m ago", "3.1s",
           "train.py --data /a/very/long/path/to/the/dataset --epochs 100 --lr 0.001"]
    _fit([row], ("ID", "NAME", "STATE", "TOPOLOGY", "CREATED", "DURATION", "COMMAND"), out)
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[1].endswith("…") and "train.py --data" in lines[1]
    piped = io.StringIO()
    _fit([row], ("ID", "NAME", "STATE", "TOPOLOGY", "CREATED", "DURATION", "COMMAND"), piped)
    assert "--lr 0.001" in piped.getvalue(), "piped, nothing is cut"


def test_logs_tail_and_since(phx_home, job_script):
    phalanx("run", "--name", "lines", str(job_script), "--lines", "50", check=True)
    tail = phalanx("logs", "lines", "--tail", "3", check=True).stdout
    assert tail.splitlines() == [f"line {i} step={i} loss={1 / i:.4f}" for i in (48, 49, 50)]
    assert phalanx("logs", "lines", "--since", "1h", check=True).stdout.count("\n") == 50
    assert phalanx("logs", "lines", "--since", "2999-01-01", check=True).stdout == ""
    assert phalanx("logs", "lines", "--tail", "0", check=True).stdout == ""


def test_logs_since_a_moment_in_a_running_job(phx_home, job_script):
    job = phalanx("run", "-d", "--name", "slow", str(job_script), "--lines", "40", "--sleep", "0.1", check=True).stdout.strip()
    log = phx_home / "jobs" / job / "attempt_0" / "rank_0" / "output.log"
    _wait_for(lambda: log.exists() and log.read_text().count("\n") >= 10, what="ten lines")
    time.sleep(1.5)  # the supervisor notes the log's length every second
    mark = time.time()
    phalanx("wait", job, check=True)
    later = phalanx("logs", job, "--since", time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(mark + 1)), check=True).stdout
    full = log.read_text()
    assert later and full.endswith(later) and len(later) < len(full) and later.startswith("line ")


def test_rm_and_prune_remove_jobs_with_their_files(phx_home, job_script):
    for _ in range(2):  # two runs of one name share its state directory
        phalanx("run", "--name", "shared", str(job_script), "--save", "ckpt", check=True)
    phalanx("run", "--name", "own", str(job_script), check=True)
    first, second = reversed(_ids(phalanx("ps", "--name", "shared", "-q", check=True)))
    own = phalanx("ps", "--name", "own", "-q", check=True).stdout.strip()
    running = phalanx("run", "-d", "--name", "busy", str(job_script), "--lines", "100000", "--sleep", "0.2", check=True).stdout.strip()
    try:
        refused = phalanx("rm", own, running)
        # PENDING until its supervisor has started it (a loaded machine): refused all the same.
        assert refused.returncode == 2 and re.search(f"job {running} is (PENDING|RUNNING)", refused.stderr), refused.stderr
        assert f"phalanx stop {running}" in refused.stderr
        assert (phx_home / "jobs" / own).is_dir(), "nothing is removed when one of them cannot be"
        state = phx_home / "state" / "shared"
        assert (state / "ckpt").exists()
        gone = phalanx("rm", first, check=True)
        assert "removed 1 job(s)" in gone.stdout and f"kept {state}: another job still names it" in gone.stderr
        assert state.is_dir() and not (phx_home / "jobs" / first).exists()
        objects = phx_home / "cache" / "code" / "objects"
        stored = sorted(objects.rglob("*"))
        assert any(p.is_file() for p in stored), "the snapshots' files are in the content store"
        dry = phalanx("prune", "--older-than", "0s", "--dry-run", check=True).stdout
        assert dry.startswith("would remove 2 job(s), 2 state directories") and "would be freed" in dry
        assert (phx_home / "jobs" / second).is_dir()
        pruned = phalanx("prune", "--older-than", "0s", "--state", "succeeded", check=True).stdout
        assert pruned.startswith("removed 2 job(s), 2 state directories") and "freed" in pruned, pruned
        assert not state.exists() and not (phx_home / "jobs" / own).exists()
        assert phalanx("ps", "--all", "-q", check=True).stdout.split() == [running], "the running job stays"
        # The running job's snapshot still links the script: its object stays.
        left = [p for p in objects.rglob("*") if p.is_file()]
        assert left and all(p.stat().st_nlink == 2 for p in left)
    finally:
        phalanx("stop", running)
    assert "removed 1 job(s)" in phalanx("rm", running, check=True).stdout
    assert [p for p in (phx_home / "cache" / "code" / "objects").rglob("*") if p.is_file()] == [], "no job, no objects"


def test_top_prints_one_snapshot_when_not_on_a_terminal(phx_home, job_script):
    job = phalanx("run", "-d", "--name", "watched", "--sample-interval", "0.5", str(job_script), "--lines", "100000",
                  "--sleep", "0.2", check=True).stdout.strip()
    try:
        _wait_for(lambda: (phx_home / "jobs" / job / "attempt_0" / "node_0" / "resources.jsonl").exists(), what="a sample")
        began = time.monotonic()
        top = phalanx("top", job, timeout=30, check=True)
        assert time.monotonic() - began < 20, "one frame, then it exits"
        assert f"job {job}  RUNNING" in top.stdout and "rank 0" in top.stdout and "\x1b[" not in top.stdout
    finally:
        phalanx("stop", job)


def test_usage_is_recorded_and_added_up(phx_home, job_script):
    env = {"PHALANX_PRICES": "{cpu: 3.6}"}
    for x in ("1", "2"):
        phalanx("run", "--name", "priced", str(job_script), "--x", x, "--lines", "5", "--sleep", "0.1", check=True, env=env)
    status = phalanx("status", "priced", check=True, env=env).stdout
    assert "usage     0 GPU-hours, " in status and "CPU-hours, cost " in status and "(cpu)" in status
    rows = json.loads(phalanx("usage", "--json", check=True, env=env).stdout)
    (row,) = rows
    assert row["group"] == "priced" and row["jobs"] == 2 and row["cpu_hours"] > 0
    assert row["cost"] == pytest.approx(3.6 * row["cpu_hours"], rel=1e-6)
    table = phalanx("usage", "--by", "backend", check=True, env=env).stdout
    assert table.splitlines()[0].split() == ["BACKEND", "JOBS", "GPU-H", "CPU-H", "COST"] and "local" in table
