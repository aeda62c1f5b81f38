"""Sweeps first-class on the command line: ps, status, logs, metrics, wait, stop and resume
given a sweep, sweep show as a table, CSV and JSON; a resumed TPE search keeps its history."""

from __future__ import annotations

import csv
import io
import json

import pytest

from tests.conftest import phalanx
from tests.local.test_run import _wait_for

pytestmark = pytest.mark.local

TRIAL = """
import argparse, json, os, sys, time
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, required=True)
p.add_argument("--depth", type=int, default=2)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--sleep", type=float, default=0.05)
p.add_argument("--fail-above", type=float, default=None)
a = p.parse_args()
for step in range(1, a.steps + 1):
    print(f"step={step} loss={(a.lr - 0.3) ** 2 + a.depth / 100 + 1 / step:.6f} acc={1 - a.lr / 10:.4f}", flush=True)
    time.sleep(a.sleep)
if a.fail_above is not None and a.lr > a.fail_above:
    sys.exit(5)
"""


@pytest.fixture
def trial_script(tmp_path):
    path = tmp_path / "trial.py"
    path.write_text(TRIAL)
    return path


def test_a_sweep_answers_to_every_command(phx_home, trial_script):
    run = phalanx("run", "--name", "grid", "--objective", "loss:min", "--parallel", "2", str(trial_script),
                  "--lr", "[0.1, 0.3, 0.5]", "--depth", "[2, 4]", check=True)
    assert "best loss=" in run.stderr
    sweep = json.loads(phalanx("sweep", "show", "grid", "--json", check=True).stdout)
    best = next(r for r in sweep["table"]["rows"] if r["best"])
    assert best["params"] == {"lr": 0.3, "depth": 2}
    ps = phalanx("ps", "--all", check=True).stdout
    assert f"[sweep 6/6 done, best loss={sweep['best_value']:.4g} (trial {best['trial']})] trial.py" in ps
    trials = phalanx("ps", "--trials", "grid", check=True).stdout.splitlines()
    assert trials[0].split()[:4] == ["TRIAL", "ID", "STATE", "LOSS"] and len(trials) == 7
    assert "lr=0.1 depth=2" in trials[1]
    status = phalanx("status", "grid", check=True).stdout
    assert "6/6 done" in status and "usage     0 GPU-h" in status and "over 6 trial(s)" in status
    table = phalanx("sweep", "show", "grid", check=True).stdout.splitlines()
    head = next(i for i, line in enumerate(table) if line.startswith("TRIAL"))
    assert table[head].split() == ["TRIAL", "JOB", "STATE", "loss", "lr", "depth", "acc", "DURATION"]
    objective = [float(line.split()[3]) for line in table[head + 1:head + 7]]
    assert objective == sorted(objective), "best first"
    rows = list(csv.DictReader(io.StringIO(phalanx("sweep", "show", "grid", "--csv", check=True).stdout)))
    assert len(rows) == 6 and rows[0]["best"] == "True" and float(rows[0]["loss"]) == pytest.approx(sweep["best_value"])
    logs = phalanx("logs", "grid", check=True).stdout
    assert all(f"[trial {n}] step=4 loss=" in logs for n in range(6))
    assert phalanx("logs", "grid", "--trial", "2", "--tail", "1", check=True).stdout.splitlines() == \
        [line for line in logs.splitlines() if line.startswith("[trial 2] step=4")]
    metrics = phalanx("metrics", "grid", check=True).stdout.splitlines()
    assert metrics[0].split() == ["TRIAL", "JOB", "STATE", "loss", "acc"] and len(metrics) == 7
    waited = phalanx("wait", "grid")
    assert waited.returncode == 0 and "SUCCEEDED: 6/6 trials" in waited.stderr


def test_wait_exits_nonzero_when_the_sweep_failed(phx_home, trial_script):
    run = phalanx("run", "--name", "doomed", "--fail-fast", "--parallel", "1", str(trial_script),
                  "--lr", "[0.1, 0.9, 0.2]", "--fail-above", "0.5")
    assert run.returncode != 0
    waited = phalanx("wait", "doomed")
    assert waited.returncode == 1 and "FAILED" in waited.stderr
    assert phalanx("status", "doomed", "--json", check=True).stdout.count('"state": "FAILED"') >= 1


def _params_by_trial(name: str) -> dict[int, dict]:
    rows = json.loads(phalanx("sweep", "show", name, "--json", check=True).stdout)["table"]["rows"]
    return {r["trial"]: r["params"] for r in rows}


def test_a_resumed_tpe_search_keeps_its_samplers_history(phx_home, trial_script):
    """The same TPE search (seed, one trial at a time) run through, and stopped after two
    trials then resumed: the same parameters trial by trial. Rebuilt without the sampler's
    state, the resumed search would draw its first trials' parameters again."""
    args = ["--strategy", "tpe", "--trials", "6", "--seed", "7", "--objective", "loss:min", "--parallel", "1",
            str(trial_script), "--lr", "uniform(0, 1)", "--depth", "[1, 2, 3, 4, 5, 6, 7, 8]", "--sleep", "0.5"]
    phalanx("run", "--name", "through", *args, check=True, timeout=300)
    expected = _params_by_trial("through")
    assert len({json.dumps(p, sort_keys=True) for p in expected.values()}) == 6
    sweep = phalanx("run", "-d", "--name", "interrupted", *args, check=True).stdout.strip()
    _wait_for(lambda: json.loads(phalanx("sweep", "show", sweep, "--json").stdout)["finished"] >= 2,
              timeout=180, what="two trials done")
    stopped = phalanx("stop", sweep, check=True, timeout=120)
    assert "CANCELLED" in stopped.stdout
    shown = json.loads(phalanx("sweep", "show", sweep, "--json", check=True).stdout)
    assert all(r["state"] not in ("RUNNING", "PENDING") for r in shown["table"]["rows"]), "stop stops every trial"
    assert shown["finished"] <= 4, "at least one trial is left to ask the sampler for after the resume"
    phalanx("resume", sweep, check=True, timeout=300)
    assert phalanx("wait", sweep).returncode == 0
    assert _params_by_trial("interrupted") == expected
