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
