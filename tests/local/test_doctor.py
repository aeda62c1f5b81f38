"""``phalanx doctor`` and ``--health-check`` on the local backend, with real processes: two local
nodes (agents that rendezvous over loopback as two machines would), the real probe (torch's
matmul on the CPU, gloo between the nodes), the real CLI.

The checks judge the free disk of the job's working directory (at least 2 GiB): the tests that
expect healthy nodes run the command in a directory with room whatever the machine's disk holds,
a tmpfs mounted in a mount namespace of the command's own (nothing is mounted outside it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import phalanx
from tests.local.test_run import _only_job, _status

pytestmark = pytest.mark.local


def _roomy(tmp_path: Path, *args: str, script: str | None = None) -> subprocess.CompletedProcess[str]:
    """``phalanx ARGS`` run in a working directory with 16 GiB free (a tmpfs; its size is a limit,
    not memory taken), with ``script`` copied there first."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs util-linux's unshare and root (a tmpfs in a mount namespace of its own)")
    roomy = tmp_path / "roomy"
    roomy.mkdir(parents=True)
    mount = 'mount -t tmpfs -o size=16g tmpfs "$0" && { test -z "$1" || cp "$1" "$0"/; } && cd "$0" && shift && exec "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, str(roomy), script or "",
                           sys.executable, "-m", "phalanx", *args], capture_output=True, text=True, timeout=300)


def test_doctor_checks_two_local_nodes_and_says_they_are_healthy(phx_home, tmp_path):
    proc = _roomy(tmp_path, "doctor", "-n", "2x1", "--burn", "0.5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line[:1].isdigit()]
    assert [(r[0], r[1], r[-1]) for r in rows] == [("0", "localhost-0", "ok"), ("1", "localhost-1", "ok")]
    assert all("no GPU (cpu)" in line for line in proc.stdout.splitlines() if line[:1].isdigit())
    assert "links: all-reduce between two nodes (gloo" in proc.stdout
    assert proc.stdout.rstrip().endswith("all 2 node(s) healthy")
    # it ran as a job of its own, which the user can look at
    job = _only_job()
    assert job["name"] == "doctor" and job["state"] == "SUCCEEDED" and job["topology"] == "2x1"
    assert f"job {job['id']}" in proc.stderr

    found = json.loads(_roomy(tmp_path / "again", "doctor", "-n", "2x1", "--burn", "0.5", "--json").stdout)
    assert found["healthy"] and found["bad_nodes"] == [] and found["expected"] == 2
    assert [(n["node_rank"], n["devices"][0]["kind"], n["devices"][0]["burn_ok"]) for n in found["nodes"]] == \
        [(0, "cpu", True), (1, "cpu", True)]
    assert all(n["devices"][0]["gflops"] > 0 and n["disk_free"] > 0 and n["shm_free"] > 0 for n in found["nodes"])
    (link,) = found["links"]
    assert (link["a"], link["b"]) == (0, 1) and link["bandwidth"] > 0 and link["latency"] > 0
    assert found["nodes"][1]["skew"] is not None  # node 1's clock against node 0's (one machine: near 0)


def test_doctor_refuses_what_it_cannot_use(phx_home, tmp_path):
    script = phalanx("doctor", "train.py", cwd=tmp_path)
    assert script.returncode == 2 and "unexpected extra argument" in script.stderr.lower()
    burn = phalanx("doctor", "--burn", "0", cwd=tmp_path)
    assert burn.returncode == 2 and burn.stderr.count("\n") == 1 and "--burn 0 is not a duration" in burn.stderr


def test_health_check_passes_on_healthy_nodes_and_the_job_runs(phx_home, tmp_path):
    (tmp_path / "hello.py").write_text("import os\nprint('hello from rank', os.environ['RANK'], flush=True)\n")
    proc = _roomy(tmp_path, "run", "-n", "2x1", "--health-check", "hello.py", script=str(tmp_path / "hello.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = _only_job()
    for node in (0, 1):
        result = json.loads(Path(job["job_dir"], "attempt_0", f"node_{node}", "result.json").read_text())
        assert result["health"]["ok"] is True and result["health"]["report"]["devices"][0]["burn_ok"]
        assert "the node passed its check" in Path(job["job_dir"], "attempt_0", f"node_{node}", "agent.log").read_text()
    assert "hello from rank 1" in proc.stdout


def test_a_node_failing_its_check_starts_no_rank_and_is_named(phx_home, tmp_path):
    (tmp_path / "hello.py").write_text("print('never', flush=True)\n")
    check = 'test "$PHALANX_NODE_RANK" != 1 || { echo "ECC: 3 uncorrectable errors on GPU 2"; exit 3; }'
    proc = phalanx("run", "-n", "2x1", "--health-check-cmd", check, "hello.py", cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "never" not in proc.stdout
    job = _only_job()
    assert job["state"] == "FAILED"
    status = _status(job["id"])
    assert status["root_cause"]["message"] == \
        "node 1 (localhost-1) failed its health check: exit 3: ECC: 3 uncorrectable errors on GPU 2"
    (entry,) = status["attempts"][0]["left_out"]
    assert entry["node"] == "localhost-1" and not entry["left_out"]  # one machine: nowhere else to go
    shown = phalanx("status", job["id"], check=True).stdout
    assert "localhost-1 after attempt 0: failed its health check: exit 3: ECC: 3 uncorrectable errors on GPU 2 " \
           "(cannot be left out by this backend)" in shown
    assert not list(Path(job["job_dir"], "attempt_0").glob("rank_*/output.log"))
