"""The ssh backend against real sshd daemons on loopback addresses (started by the tests)."""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import EXAMPLES, phalanx
from tests.local.test_run import _alive, _status, _wait_for

pytestmark = pytest.mark.cluster

TRAIN = str(EXAMPLES / "train_ddp.py")


def _ssh(hosts, *args: str) -> list[str]:
    import os

    remote = Path(os.environ["PHALANX_HOME"]).parent / "remote"  # per test, like a fresh host
    return ["--backend", "ssh", "--ssh-config", str(hosts.config), "--hosts", ",".join(hosts.names),
            "--remote-home", str(remote), *args]


def test_two_node_ddp_over_ssh_synchronises_gradients(phx_home, ssh_hosts):
    proc = phalanx("run", *_ssh(ssh_hosts, "-n", "2x1"), TRAIN, "--epochs", "1", "--steps-per-epoch", "3",
                   "--print-grad-checksum", check=True, timeout=240)
    grads = dict(re.findall(r"grad_checksum rank=(\d) value=(\S+)", proc.stdout))
    batches = dict(re.findall(r"local_batch_checksum rank=(\d) value=(\S+)", proc.stdout))
    assert set(grads) == {"0", "1"}, proc.stdout + proc.stderr
    assert grads["0"] == grads["1"] and batches["0"] != batches["1"]
    job = json.loads(phalanx("ps", "--all", "--json", check=True).stdout)[0]
    status = _status(job["id"])
    assert status["state"] == "SUCCEEDED"
    assert {r["node_rank"] for r in status["ranks"]} == {0, 1}
    # each node's files were mirrored back into the local job directory
    for node in (0, 1):
        assert json.loads(Path(job["job_dir"], "attempt_0", f"node_{node}", "result.json").read_text())["exitcode"] == 0
    assert "done" in phalanx("logs", job["id"], "--rank", "0", check=True).stdout


def test_stop_kills_exactly_the_job_on_every_host(phx_home, ssh_hosts):
    bystander = ssh_hosts.ssh("node1", "setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $!")
    bystander_pid = int(bystander.stdout.strip())
    try:
        job_id = phalanx("run", "-d", "--grace", "5", *_ssh(ssh_hosts, "-n", "2x1"), TRAIN, "--epochs", "100",
                         "--sleep", "0.2", check=True).stdout.strip()
        job_dir = _status(job_id)["job_dir"]
        _wait_for(lambda: "step=" in phalanx("logs", job_id, "--rank", "0").stdout, timeout=120, what="training")
        pids = [json.loads(p.read_text())["pid"] for p in Path(job_dir).glob("attempt_0/rank_*/proc.json")]
        assert len(pids) == 2 and _alive(pids) == pids
        supervisor = psutil.Process(_status(job_id)["supervisor_pid"])
        tree = [p.pid for p in supervisor.children(recursive=True)]
        remote_side = [p.pid for p in psutil.process_iter(["cmdline"])
                       if "phalanx.launch.remote" in " ".join(p.info["cmdline"] or [])]
        assert phalanx("stop", job_id, check=True).stdout.strip().endswith("CANCELLED")
        _wait_for(lambda: _alive(pids + tree + remote_side) == [], timeout=30, what="every remote process to end")
        assert _alive([bystander_pid]) == [bystander_pid], "another user's process on the host must survive"
    finally:
        psutil.Process(bystander_pid).kill()


def test_lost_host_fails_fast_and_retry_resumes_from_state(phx_home, ssh_hosts):
    job_id = phalanx("run", "-d", "--grace", "5", "--max-retries", "1", "--name", "sshretry",
                     *_ssh(ssh_hosts, "-n", "2x1", "--shared-fs"), TRAIN, "--epochs", "2", "--steps-per-epoch", "10",
                     "--checkpoint-every", "2", "--sleep", "0.2", check=True).stdout.strip()
    job_dir = Path(_status(job_id)["job_dir"])
    log0 = job_dir / "attempt_0" / "rank_0" / "output.log"
    _wait_for(lambda: log0.exists() and len(re.findall(r"step=\d+ loss", log0.read_text())) >= 4, timeout=120, what="training")
    supervisor = psutil.Process(_status(job_id)["supervisor_pid"])
    link = [p for p in supervisor.children() if "node2" in " ".join(p.cmdline())]
    assert len(link) == 1
    start = time.monotonic()
    link[0].kill()  # the connection to node2 dies: as if the host vanished
    assert phalanx("wait", job_id, "--timeout", "240").returncode == 0
    status = _status(job_id)
    assert status["attempts"][0]["outcome"] == "failed" and status["attempt"] == 1
    assert status["attempts"][0]["ended"] - status["attempts"][0]["started"] < (time.time() - start) + 60
    assert "resumed from step=" in (job_dir / "attempt_1" / "rank_0" / "output.log").read_text()


def test_preflight_names_the_failing_host(phx_home, ssh_hosts, tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(ssh_hosts.config.read_text() + "Host ghost\n  HostName 127.0.0.9\n  Port 9\n")
    proc = phalanx("run", "--backend", "ssh", "--ssh-config", str(config), "--hosts", "node1,ghost", "-n", "2x1",
                   str(EXAMPLES / "hello.py"))
    assert proc.returncode == 1
    assert "preflight failed: ghost:" in proc.stderr and "node1" not in proc.stderr.split("preflight failed:")[1].split(";")[0]
    proc = phalanx("run", *_ssh(ssh_hosts, "-n", "2x1", "--remote-python", "/no/such/python"), str(EXAMPLES / "hello.py"))
    assert proc.returncode == 1 and "preflight failed: node1:" in proc.stderr and "node2:" in proc.stderr
    proc = phalanx("run", "--backend", "ssh", "-n", "2x1", str(EXAMPLES / "hello.py"))
    assert proc.returncode == 2 and "needs hosts" in proc.stderr


ODD = st.text(alphabet=st.sampled_from(list("ab $;'\"\\`|&*?{}()<>!#~\t")), min_size=0, max_size=12)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(ODD, min_size=1, max_size=4))
def test_odd_arguments_survive_the_trip_through_ssh(phx_home, ssh_hosts, args):
    script = Path(phx_home).parent / "argv.py"
    script.write_text("import json, sys\nprint('ARGV ' + json.dumps(sys.argv[1:]))\n")
    proc = phalanx("run", *_ssh(ssh_hosts, "-n", "1x1", "--shared-fs"), str(script), "--", *args, check=True, timeout=120)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("ARGV "))
    assert json.loads(line[5:]) == ["--", *args], shlex.join(args)
