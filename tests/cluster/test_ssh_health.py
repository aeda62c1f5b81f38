"""Bad nodes found and left out, on three real sshd hosts (127.0.0.2-4, each with its own HOME,
tests/cluster/sshd.py). The middle host, node2, is really short of disk: its sshd runs in a
mount namespace of its own where its HOME (where jobs live on it: ``--remote-home
~/.phalanx/remote``) is a 64 MiB tmpfs, so every process started over ssh there sees 64 MiB free,
as on a machine with a full disk; the other two hosts' HOMEs are 16 GiB tmpfs in namespaces of
their own. Nothing is mounted outside those namespaces.

- ``phalanx doctor`` over the three names node2 and why, and measures the links between them;
- ``--health-check`` with ``-n 2x1`` and three hosts: node2 fails its check, the job runs on
  node1 and node3;
- a rank killed by SIGBUS on node2 (the root cause names the machine): the retry avoids node2.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import phalanx
from tests.local.test_run import _status

pytestmark = pytest.mark.cluster

SMALL = "64m"
ROOMY = "16g"

WHERE = textwrap.dedent("""\
    import os, signal
    node, attempt = os.environ["PHALANX_NODE_RANK"], os.environ["PHALANX_ATTEMPT"]
    print(f"node {node} attempt {attempt} rank {os.environ['RANK']} runs", flush=True)
    if os.environ.get("DIE_ON") == f"{attempt}:{node}":
        print("the memory under this rank went bad", flush=True)
        os.kill(os.getpid(), signal.SIGBUS)
""")


@pytest.fixture(scope="module")
def three_hosts(tmp_path_factory):
    """node1, node2, node3; node2's HOME a small tmpfs in its sshd's own mount namespace."""
    from tests.cluster import sshd

    if shutil.which("unshare") is None:
        pytest.skip("util-linux's unshare is not installed")
    root = tmp_path_factory.mktemp("sshd3")
    # node1's and node3's HOMEs are roomy tmpfs (their size a limit, not memory taken), so that
    # only node2 is short of disk whatever this machine's own disk holds.
    wrap = {i: ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'mount -t tmpfs -o size={size} tmpfs "$0" && exec "$@"', str(root / f"home{i + 1}")]
            for i, size in ((0, ROOMY), (1, SMALL), (2, ROOMY))}
    try:
        hosts = sshd.start(root, count=3, wrap=wrap)
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot start three sshd hosts with a mount namespace here (needs root): {exc}")
    try:
        probe = hosts.ssh("node2", "df -k ~ | tail -1")
        if probe.returncode != 0 or int(probe.stdout.split()[1]) > 100 * 1024:
            pytest.skip(f"node2's small HOME did not take: {probe.stdout} {probe.stderr}")
        yield hosts
    finally:
        sshd.stop(hosts)


def _ssh(hosts, remote: Path) -> list[str]:
    return ["--backend", "ssh", "--ssh-config", str(hosts.config), "--hosts", ",".join(hosts.names),
            "--remote-home", "~/.phalanx/remote" if remote is None else str(remote)]


def _node_hosts(job: dict, attempt: int) -> list[str]:
    attempt_dir = Path(job["job_dir"], f"attempt_{attempt}")
    return [json.loads((attempt_dir / f"node_{n}" / "result.json").read_text())["host"] for n in (0, 1)]


def test_doctor_names_the_host_short_of_disk_and_measures_the_links(phx_home, three_hosts, tmp_path):
    proc = phalanx("doctor", *_ssh(three_hosts, None), "-n", "3x1", "--burn", "0.5", "--json", cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = json.loads(proc.stdout)
    assert found["names"] == {"0": "node1", "1": "node2", "2": "node3"}
    assert 1 in found["bad_nodes"]
    disk = [f for f in found["findings"] if f["check"] == "disk"]
    assert [f["node_rank"] for f in disk] == [1] and "MiB free" in disk[0]["message"]
    assert [n["node_rank"] for n in found["nodes"]] == [0, 1, 2]
    assert found["links_backend"] == "gloo" and len(found["links"]) == 3
    assert all(link["bandwidth"] and link["latency"] for link in found["links"])
    text = phalanx("doctor", *_ssh(three_hosts, None), "-n", "3x1", "--burn", "0.5", cwd=tmp_path, timeout=300)
    assert text.returncode == 1 and "bad: node 1 (node2): disk:" in text.stdout, text.stdout + text.stderr


def test_health_check_leaves_the_bad_host_out_and_runs_on_the_other_two(phx_home, three_hosts, tmp_path):
    (tmp_path / "where.py").write_text(WHERE)
    proc = phalanx("run", *_ssh(three_hosts, None), "-n", "2x1", "--health-check", "where.py", cwd=tmp_path, timeout=300)
    job = json.loads(phalanx("ps", "--all", "--json", check=True).stdout)[0]
    assert proc.returncode == 0 and job["state"] == "SUCCEEDED", proc.stdout + proc.stderr
    assert job["attempt"] == 1 and _node_hosts(job, 1) == ["node1", "node3"]
    status = _status(job["id"])
    (entry,) = status["attempts"][0]["left_out"]
    assert (entry["node"], entry["left_out"]) == ("node2", True) and "disk" in entry["why"]
    assert status["retries"] == 0  # nothing of the job ran on the first attempt: no retry used
    results = [json.loads((Path(job["job_dir"], "attempt_1", f"node_{n}", "result.json")).read_text()) for n in (0, 1)]
    assert all(r["health"]["ok"] for r in results)
    shown = phalanx("status", job["id"], check=True).stdout
    assert "node2 after attempt 0: failed its health check: disk:" in shown


def test_a_rank_killed_by_sigbus_makes_the_retry_avoid_its_host(phx_home, three_hosts, tmp_path):
    (tmp_path / "where.py").write_text(WHERE)
    proc = phalanx("run", *_ssh(three_hosts, None), "-n", "2x1", "--max-retries", "1", "-e", "DIE_ON=0:1", "where.py",
                   cwd=tmp_path, timeout=300)
    job = json.loads(phalanx("ps", "--all", "--json", check=True).stdout)[0]
    assert proc.returncode == 0 and job["state"] == "SUCCEEDED", proc.stdout + proc.stderr
    assert _node_hosts(job, 0) == ["node1", "node2"] and _node_hosts(job, 1) == ["node1", "node3"]
    (entry,) = _status(job["id"])["attempts"][0]["left_out"]
    assert entry["node"] == "node2" and "SIGBUS" in entry["why"]
    assert "leaving out node2 (a rank died of SIGBUS" in proc.stdout + proc.stderr


def test_doctor_names_a_host_that_does_not_answer(phx_home, three_hosts, tmp_path):
    from phalanx.backends.base import free_port

    config = tmp_path / "ssh_config"  # the hosts, and "ghost": an address where no sshd listens
    config.write_text(f"Include {three_hosts.config}\nHost ghost\n  HostName 127.0.0.9\n  Port {free_port('127.0.0.9')}\n")
    proc = phalanx("doctor", "--backend", "ssh", "--ssh-config", str(config), "--hosts", "node1,ghost", "-n", "2x1",
                   "--burn", "0.5", cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "bad: node 1 (ghost): report: no report:" in proc.stdout and "refused" in proc.stdout, proc.stdout
    assert "warn: node 0 (node1): report: not checked: the check could not start" in proc.stdout
    assert "1 of 2 node(s) outside the healthy range: 1 (ghost); 0 healthy, 1 not checked" in proc.stdout
