"""The rough edges a new user hits first (issue 21), with real jobs (small scripts, no torch):
`-d` says how to follow the job, `resume` keeps a detached job detached, `rm NAME` never picks one
of several jobs of that name silently."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.conftest import phalanx
from tests.terminal.term import Tty

pytestmark = pytest.mark.local

FAILS_FIRST = """
import os, sys, time
print("attempt", os.environ["PHALANX_ATTEMPT"], "pid", os.getpid(), "sid", os.getsid(0), flush=True)
time.sleep(float(os.environ.get("NAP", "0")))
sys.exit(3 if os.environ["PHALANX_ATTEMPT"] == "0" else 0)
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    where = tmp_path / "project"
    where.mkdir()
    (where / "job.py").write_text(FAILS_FIRST)
    (where / "ok.py").write_text("print('loss=1.0')\n")
    return where


def test_detach_prints_the_id_and_one_hint_line(phx_home, project):
    started = phalanx("run", "-d", "job.py", cwd=project, check=True)
    job = started.stdout.strip()
    assert started.stdout == f"{job}\n", "stdout holds the id alone (for $(phalanx run -d ...))"
    hint = [line for line in started.stderr.splitlines() if line.startswith("phalanx: ")]
    assert hint == [f"phalanx: job {job} runs in the background; follow it: phalanx logs -f {job}; "
                    f"stop it: phalanx stop {job}"], started.stderr
    assert phalanx("wait", job).returncode == 3
    quiet = phalanx("run", "-d", "-q", "ok.py", cwd=project, check=True)
    assert quiet.stderr == "" and len(quiet.stdout.split()) == 1
    phalanx("wait", quiet.stdout.strip(), check=True)


def test_resume_keeps_a_detached_job_detached_unless_told(phx_home, project):
    job = phalanx("run", "-d", "job.py", cwd=project, env={"NAP": "0"}, check=True).stdout.strip()
    assert phalanx("wait", job).returncode == 3
    # Started with -d: resumed in the background, returning at once with the id and the hint, while
    # the attempt runs on (it naps 30 s; a foreground resume would hold the terminal that long).
    resumed = phalanx("resume", job, env={"NAP": "30"}, timeout=60, check=True)
    assert resumed.stdout == f"{job}\n"
    assert f"follow it: phalanx logs -f {job}" in resumed.stderr
    status = phalanx("status", job, check=True).stdout
    assert "RUNNING" in status or "PENDING" in status, status
    phalanx("stop", job, check=True)
    # --attach: here, in the foreground, with the job's output and its end line.
    attached = phalanx("resume", "--attach", job, env={"NAP": "0"}, check=True)
    assert "attempt 2" in attached.stdout and f"job {job} (job) succeeded" in attached.stderr
    # A job started in the foreground resumes in the foreground; -d sends it to the background.
    fg = phalanx("run", "job.py", cwd=project, env={"NAP": "0"})
    assert fg.returncode == 3
    fg_id = phalanx("ps", "--all", "-q", "--limit", "1", check=True).stdout.strip()
    again = phalanx("resume", fg_id, env={"NAP": "0"}, check=True)
    assert "attempt 1" in again.stdout and "succeeded" in again.stderr
    both = phalanx("resume", "-d", "--attach", fg_id)
    assert both.returncode == 2 and "-d and --attach both given" in both.stderr


def _three_named_ok(project: Path) -> list[str]:
    for _ in range(3):
        phalanx("run", "-q", "ok.py", cwd=project, check=True)
    return phalanx("ps", "--all", "-q", "--name", "ok", check=True).stdout.split()


def test_rm_of_a_name_several_jobs_carry_refuses_with_the_list(phx_home, project):
    ids = _three_named_ok(project)
    assert len(ids) == 3
    refused = phalanx("rm", "ok")
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"phalanx: error: 3 jobs are named 'ok' ({', '.join(ids)})")
    assert "phalanx rm --all-named ok" in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert phalanx("ps", "--all", "-q", check=True).stdout.split() == ids, "nothing was removed"
    gone = phalanx("rm", "--all-named", "ok", check=True)
    assert gone.stdout.startswith("removed 3 job(s)")
    assert phalanx("ps", "--all", "-q", check=True).stdout.split() == []


def test_rm_of_a_name_a_sweep_and_a_job_carry_refuses_too(phx_home, project):
    """A sweep's name used to win silently: `rm NAME` removed the newest sweep of that name and kept
    the job (and the older sweeps) of the same name."""
    phalanx("run", "-q", "ok.py", cwd=project, check=True)
    job = phalanx("ps", "--all", "-q", check=True).stdout.split()[0]
    phalanx("run", "ok.py", "--x", "[1, 2]", cwd=project, check=True)
    sweep = phalanx("ps", "--all", "-q", check=True).stdout.split()[0]
    assert sweep != job
    refused = phalanx("rm", "ok")
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"phalanx: error: 1 sweep and 1 job are named 'ok' ({sweep}, {job})"), refused.stderr
    assert "phalanx rm --all-named ok" in refused.stderr
    assert phalanx("ps", "--all", "-q", check=True).stdout.split() == [sweep, job], "nothing was removed"
    gone = phalanx("rm", "--all-named", "ok", check=True)
    assert gone.stdout.startswith("removed 3 job(s) and 1 sweep(s)"), gone.stdout  # the job and the 2 trials
    assert phalanx("ps", "--all", "-q", check=True).stdout.split() == []
    assert phalanx("rm", sweep).returncode != 0, "gone: an id no longer names anything"


def test_rm_of_a_name_several_jobs_carry_asks_at_a_terminal(phx_home, project):
    ids = _three_named_ok(project)
    tty = Tty([sys.executable, "-m", "phalanx", "rm", "ok"], str(project), dict(os.environ))
    tty.expect("remove which\\? numbers")
    shown = tty.text()
    assert "3 jobs are named 'ok'" in shown and all(i in shown for i in ids)
    tty.send(b"2\n")
    assert tty.wait() == 0
    assert "removed 1 job(s)" in tty.text()
    assert phalanx("ps", "--all", "-q", check=True).stdout.split() == [ids[0], ids[2]]


# Prints `loss=` only when asked (never, here), so the objective passes the check before the sweep
# and no trial reports it: what a name the script builds at run time, or a library prints, can do.
SOMETIMES_LOSS = """
import argparse, os
p = argparse.ArgumentParser(); p.add_argument("--lr", type=float); a = p.parse_args()
if os.environ.get("PRINT_LOSS"):
    print(f"loss={a.lr}")
print(f"lr={a.lr}")  # the parameter, printed back: shown once, as the parameter
for step in range(1, 4):
    print(f"step={step} val_loss={1 / a.lr + 1 / step:.4f}", flush=True)
"""


def test_a_sweep_whose_objective_no_trial_reports_fails_and_says_so(phx_home, project):
    (project / "sweep.py").write_text(SOMETIMES_LOSS)
    run = phalanx("run", "--name", "lrs", "--objective", "loss:min", "--parallel", "1", "sweep.py",
                  "--lr", "[0.5, 0.1, 0.2]", cwd=project)
    reason = "no trial reported 'loss'; metrics seen: val_loss"
    assert run.returncode == 1, run.stderr
    assert f"failed: 3/3 trials (0 failed, 0 pruned); {reason}" in run.stderr
    sweep = phalanx("ps", "--all", "-q", check=True).stdout.split()[0]
    listed = phalanx("ps", "--all", check=True).stdout
    assert "FAILED" in listed and reason in listed
    waited = phalanx("wait", sweep)
    assert waited.returncode == 1 and reason in waited.stderr
    shown = phalanx("sweep", "show", sweep, check=True).stdout
    assert reason in shown
    header = next(line for line in shown.splitlines() if line.startswith("TRIAL"))
    assert header.split() == ["TRIAL", "JOB", "STATE", "loss", "lr", "val_loss", "DURATION"]
    from starlette.testclient import TestClient

    from phalanx.web.app import create_app

    shown = TestClient(create_app(), base_url="http://127.0.0.1:8000").get("/api/sweeps").json()
    assert [(s["id"], s["state"]) for s in shown] == [(sweep, "FAILED")] and reason in shown[0]["progress_text"]

    # Sorting and columns work on the trials' metrics; val_loss = 1/lr + 1/3 at the end.
    trials = phalanx("ps", "--trials", sweep, "--sort", "val_loss", "-c", "val_loss:max", check=True).stdout.splitlines()
    assert trials[0].split()[:5] == ["TRIAL", "ID", "STATE", "LOSS", "VAL_LOSS:MAX"]
    assert [row.split()[0] for row in trials[1:]] == ["0", "2", "1"]  # lr 0.5, 0.2, 0.1
    assert [row.split()[4] for row in trials[1:]] == ["3", "6", "11"]  # 1/lr + 1 at step 1
    backwards = phalanx("ps", "--trials", sweep, "--sort", "-val_loss", "-q", check=True).stdout.split()
    assert backwards == [line.split()[1] for line in reversed(trials[1:])]
    # Outside --trials, a metric only trials have says where it is instead of "no jobs yet".
    only_trials = phalanx("ps", "--all", "--sort", "val_loss")
    assert only_trials.returncode == 2
    assert f"only sweep trials have a metric 'val_loss' (sweep {sweep}); list them: phalanx ps --trials {sweep} " \
           "--sort val_loss" in only_trials.stderr


# Writes its result into --output_dir and holds the file open a while, as a checkpoint save does.
WRITES = """
import argparse, os, time
p = argparse.ArgumentParser(); p.add_argument("--lr"); p.add_argument("--output_dir", default="out"); a = p.parse_args()
os.makedirs(a.output_dir, exist_ok=True)
with open(os.path.join(a.output_dir, "result.txt"), "w") as f:
    f.write(f"lr={a.lr} job={os.environ['PHALANX_JOB_ID']}\\n")
    f.flush()
    time.sleep(4)
print(f"loss={a.lr}")
"""


def test_trials_side_by_side_are_warned_of_one_file_and_kept_apart_by_trial(phx_home, project):
    (project / "writes.py").write_text(WRITES)
    clash = phalanx("run", "--parallel", "2", "writes.py", "--lr", "[1, 2]", cwd=project, check=True)
    shared = project / "out" / "result.txt"
    warned = [line for line in clash.stderr.splitlines() if "write the same file" in line]
    assert warned == [f"phalanx: warning: trials 0, 1 of this sweep write the same file {shared}; give each trial a "
                      "place of its own, e.g. --output_dir out/{trial} ({trial}, {job_id}, {output_dir} are filled "
                      "in per trial)"], clash.stderr
    apart = phalanx("run", "--parallel", "2", "writes.py", "--lr", "[1, 2]", "--output_dir", "apart/{trial}",
                    cwd=project, check=True)
    assert "write the same file" not in apart.stderr
    assert (project / "apart" / "0" / "result.txt").read_text().startswith("lr=1 ")
    assert (project / "apart" / "1" / "result.txt").read_text().startswith("lr=2 ")
    # {output_dir}: the trial's own output directory, and {job_id} its job's id.
    own = phalanx("run", "--parallel", "2", "writes.py", "--lr", "[3, 4]", "--output_dir", "{output_dir}",
                  cwd=project, check=True)
    assert "write the same file" not in own.stderr
    sweep = phalanx("ps", "--all", "-q", "--limit", "1", check=True).stdout.strip()
    for trial in phalanx("ps", "--trials", sweep, "-q", check=True).stdout.split():
        written = (phx_home / "jobs" / trial / "output" / "result.txt").read_text()
        assert written.endswith(f"job={trial}\n")
