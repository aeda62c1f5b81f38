"""Sweeps with real trial processes."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from tests.conftest import phalanx
from tests.local.test_run import _alive, _wait_for

pytestmark = pytest.mark.local

SCRIPT = """
import argparse, json, os, time
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, required=True)
p.add_argument("--bs", type=int, default=1)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--sleep", type=float, default=0.05)
p.add_argument("--log", required=True)
a = p.parse_args()
with open(a.log, "a") as fh:
    fh.write(json.dumps({"event": "start", "t": time.time(), "trial": os.environ["PHALANX_TRIAL_ID"],
                         "params": json.loads(os.environ["PHALANX_PARAMS"]), "lr": a.lr, "bs": a.bs}) + "\\n")
for step in range(1, a.steps + 1):
    print(f"step={step} loss={a.lr * 10 / step + 1 / a.bs:.6f}", flush=True)
    time.sleep(a.sleep)
with open(a.log, "a") as fh:
    fh.write(json.dumps({"event": "end", "t": time.time(), "trial": os.environ["PHALANX_TRIAL_ID"]}) + "\\n")
"""


@pytest.fixture
def trial_script(tmp_path):
    path = tmp_path / "trial.py"
    path.write_text(SCRIPT)
    return path


def _events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _max_overlap(events: list[dict]) -> int:
    points = sorted((e["t"], 1 if e["event"] == "start" else -1) for e in events)
    running = peak = 0
    for _, delta in points:
        running += delta
        peak = max(peak, running)
    return peak


def test_grid_sweep_runs_every_combination_with_its_params(phx_home, trial_script, tmp_path):
    log = tmp_path / "events.jsonl"
    proc = phalanx("run", "--objective", "loss:min", str(trial_script), "--lr", "[0.1, 0.2, 0.3]",
                   "--bs", "[1, 2]", "--log", str(log), check=True)
    starts = [e for e in _events(log) if e["event"] == "start"]
    got = sorted((e["params"]["lr"], e["params"]["bs"], e["lr"], e["bs"]) for e in starts)
    assert got == sorted((lr, bs, lr, bs) for lr in (0.1, 0.2, 0.3) for bs in (1, 2))
    assert sorted(int(e["trial"]) for e in starts) == list(range(6))
    sweeps = [row for row in json.loads(phalanx("ps", "--all", "--json").stdout) if row.get("kind") == "sweep"]
    assert len(sweeps) == 1 and sweeps[0]["progress"] == "6/6" and sweeps[0]["state"] == "SUCCEEDED"
    assert sweeps[0]["best_params"] == {"lr": 0.1, "bs": 2} and sweeps[0]["best_value"] == pytest.approx(1.0 / 3 * 10 * 0.1 + 0.5)
    show = json.loads(phalanx("sweep", "show", sweeps[0]["id"], "--json", check=True).stdout)
    assert [t["params"] for t in show["trials"]][0] == {"bs": 2, "lr": 0.1}  # best first
    assert "best loss=" in proc.stderr
    assert "[sweep 6/6 done, best loss=" in phalanx("ps", "--all", check=True).stdout


def test_concurrency_never_exceeds_parallel(phx_home, trial_script, tmp_path):
    log = tmp_path / "events.jsonl"
    phalanx("run", "--parallel", "2", str(trial_script), "--lr", "[1, 2, 3, 4, 5, 6]", "--steps", "4",
            "--sleep", "0.1", "--log", str(log), check=True)
    events = _events(log)
    assert len([e for e in events if e["event"] == "start"]) == 6
    assert _max_overlap(events) == 2  # packed: two at a time, never more
    log1 = tmp_path / "one.jsonl"
    phalanx("run", "--parallel", "1", str(trial_script), "--lr", "[1, 2, 3]", "--log", str(log1), check=True)
    assert _max_overlap(_events(log1)) == 1


def test_random_sweep_is_reproducible_with_seed(phx_home, trial_script, tmp_path):
    def params(seed: int, log: Path) -> list:
        phalanx("run", "--strategy", "random", "--trials", "4", "--seed", str(seed), str(trial_script),
                "--lr", "loguniform(1e-3, 1)", "--bs", "range(1, 5)", "--steps", "1", "--log", str(log), check=True)
        return sorted((e["trial"], e["params"]["lr"], e["params"]["bs"]) for e in _events(log) if e["event"] == "start")

    first, again, other = params(0, tmp_path / "a"), params(0, tmp_path / "b"), params(1, tmp_path / "c")
    assert first == again and first != other
    assert all(1e-3 <= lr <= 1 and bs in (1, 2, 3, 4) for _, lr, bs in first)


def test_early_stopping_prunes_bad_trials_before_they_finish(phx_home, trial_script, tmp_path):
    log = tmp_path / "events.jsonl"
    proc = phalanx("run", "--parallel", "1", "--objective", "loss:min", "--early-stop", "median", str(trial_script),
                   "--lr", "[0.1, 0.1, 100, 100]", "--steps", "12", "--sleep", "0.15", "--log", str(log), check=True)
    sweep = [r for r in json.loads(phalanx("ps", "--all", "--json").stdout) if r.get("kind") == "sweep"][0]
    trials = json.loads(phalanx("sweep", "show", sweep["id"], "--json", check=True).stdout)["trials"]
    states = {t["trial"]: t["state"] for t in trials}
    assert states[0] == states[1] == "SUCCEEDED"
    assert states[2] == states[3] == "PRUNED", proc.stderr
    ended = {e["trial"] for e in _events(log) if e["event"] == "end"}
    assert ended == {"0", "1"}  # the pruned ones were stopped before their last step
    assert "pruned at step" in proc.stderr and sweep["pruned"] == 2


def test_interrupted_sweep_resumes_only_unfinished_trials(phx_home, trial_script, tmp_path):
    log = tmp_path / "events.jsonl"
    sweep_id = phalanx("run", "-d", "--parallel", "1", str(trial_script), "--lr", "[1, 2, 3, 4]", "--steps", "8",
                       "--sleep", "0.2", "--log", str(log), check=True).stdout.strip()
    _wait_for(lambda: len([e for e in _events(log) if e["event"] == "end"]) >= 1 and
              len([e for e in _events(log) if e["event"] == "start"]) >= 2, timeout=60, what="one finished trial")
    show = json.loads(phalanx("sweep", "show", sweep_id, "--json", check=True).stdout)
    runner = psutil.Process(show["supervisor_pid"])
    tree = [p.pid for p in runner.children(recursive=True)]
    runner.kill()  # a crash of the sweep itself
    _wait_for(lambda: _alive(tree) == [], timeout=30, what="trials to die with their runner")
    assert json.loads(phalanx("sweep", "show", sweep_id, "--json").stdout)["state"] == "LOST"
    before = {e["trial"] for e in _events(log) if e["event"] == "end"}
    phalanx("resume", "--attach", sweep_id, check=True, timeout=120)  # started with -d: here, to wait for it
    ends = [e["trial"] for e in _events(log) if e["event"] == "end"]
    assert sorted(set(ends)) == ["0", "1", "2", "3"]
    assert all(ends.count(t) == 1 for t in before), "finished trials must not run again"
    final = json.loads(phalanx("sweep", "show", sweep_id, "--json", check=True).stdout)
    assert final["state"] == "SUCCEEDED" and final["progress"] == "4/4"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--lr", "uniform(1, 0)"], "low must be below high"),
        (["--lr", "uniform(0, 1)"], "a random search needs --trials N"),
        (["--lr", "loguniform(1e-5, 1e-1)", "--strategy-x"], None),
    ],
)
def test_bad_sweeps_are_rejected_before_anything_starts(phx_home, trial_script, args, message):
    if message is None:
        proc = phalanx("run", "--strategy", "tpe", "--trials", "3", str(trial_script), "--lr", "loguniform(1e-5, 1e-1)", "--log", "x")
        assert proc.returncode == 2 and "--strategy tpe needs --objective" in proc.stderr
    else:
        proc = phalanx("run", str(trial_script), *args, "--log", "x")
        assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert json.loads(phalanx("ps", "--all", "--json").stdout) == []
    proc = phalanx("run", "--trials", "3", str(trial_script), "--lr", "0.1", "--log", "x")
    assert proc.returncode == 2 and "needs a search space" in proc.stderr
