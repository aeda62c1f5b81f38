"""The ssh backend against real sshd daemons on loopback addresses (started by the tests).

Each test host has a HOME of its own (tests/cluster/sshd.py), so without --shared-fs the
default remote home ``~/.phalanx/remote`` differs per host, as on separate machines.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
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
    return ["--backend", "ssh", "--ssh-config", str(hosts.config), "--hosts", ",".join(hosts.names), *args]


def _remote_home(hosts, index: int) -> Path:
    """Where host ``index`` keeps its jobs (the default --remote-home under its own HOME)."""
    return hosts.homes[index] / ".phalanx" / "remote"


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
        # The agents under this test's sshd daemons (other runs on the machine have agents of their own).
        remote_side = [p.pid for sshd in ssh_hosts.pids for p in psutil.Process(sshd).children(recursive=True)
                       if "phalanx.launch.remote" in " ".join(p.cmdline())]
        assert phalanx("stop", job_id, check=True).stdout.strip().endswith("CANCELLED")
        _wait_for(lambda: _alive(pids + tree + remote_side) == [], timeout=30, what="every remote process to end")
        assert _alive([bystander_pid]) == [bystander_pid], "another user's process on the host must survive"
    finally:
        psutil.Process(bystander_pid).kill()


def test_lost_host_fails_fast_and_retry_resumes_from_state(phx_home, ssh_hosts):
    # No shared filesystem: the retry resumes from the checkpoint node 1 mirrored back, pushed out again.
    job_id = phalanx("run", "-d", "--grace", "5", "--max-retries", "1", "--name", "sshretry",
                     *_ssh(ssh_hosts, "-n", "2x1"), TRAIN, "--epochs", "2", "--steps-per-epoch", "10",
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
    assert (phx_home / "state" / "sshretry" / "checkpoint.pt").is_file()


def test_state_and_outputs_come_back_from_the_hosts_and_go_out_again(phx_home, ssh_hosts, tmp_path):
    name = "sshstate"

    def train(epochs: int) -> list[str]:
        return [TRAIN, "--epochs", str(epochs), "--steps-per-epoch", "4", "--checkpoint-every", "2"]

    store, uploads = tmp_path / "state-store", tmp_path / "uploads"
    phalanx("run", "--name", name, "--state", str(store), "--output", str(uploads), *_ssh(ssh_hosts, "-n", "2x1"),
            *train(1), check=True, timeout=240)
    local_state = phx_home / "state" / name
    assert (local_state / "checkpoint.pt").is_file()
    job = json.loads(phalanx("ps", "--all", "--json", check=True).stdout)[0]
    assert (Path(job["job_dir"]) / "output" / "model.pt").is_file()
    # the final files arrived before the supervisor's last state push and its outputs upload
    assert "checkpoint.pt" in json.loads((store / "_phalanx_manifest.json").read_text())["files"]
    assert (uploads / f"{name}-{job['id']}" / "output" / "model.pt").is_file()
    # the hosts share nothing: rank 0 wrote the checkpoint on its host only
    remote_states = [_remote_home(ssh_hosts, i) / "state" / name for i in range(2)]
    assert sorted((state / "checkpoint.pt").exists() for state in remote_states) == [False, True]

    # fresh hosts: the run resumes from the local state, pushed to them
    for state in remote_states:
        shutil.rmtree(state, ignore_errors=True)
    proc = phalanx("run", "--name", name, *_ssh(ssh_hosts, "-n", "2x1"), *train(2), check=True, timeout=240)
    assert "resumed from step=4" in proc.stdout, proc.stdout + proc.stderr

    # --clean-state empties the hosts' state too (rank 0's host has the checkpoint of step 8)
    proc = phalanx("run", "--name", name, "--clean-state", *_ssh(ssh_hosts, "-n", "2x1"), *train(1), check=True, timeout=240)
    assert "resumed from step=" not in proc.stdout, proc.stdout


def test_an_input_channel_reaches_every_host_once(phx_home, ssh_hosts, tmp_path):
    from phalanx.backends.ssh import Shipment, SshBackend, channel_copy
    from phalanx.core.paths import HomePaths
    from phalanx.core.spec import Channel

    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "hello.txt").write_text("hello from the data")
    (tmp_path / "elsewhere.txt").write_text("linked")
    (data / "linked.txt").symlink_to(tmp_path / "elsewhere.txt")
    script = tmp_path / "read_channel.py"
    script.write_text(
        "import os, pathlib\n"
        "root = pathlib.Path(os.environ['PHALANX_CHANNEL_DATA'])\n"
        "text = (root / 'sub' / 'hello.txt').read_text()\n"
        "print(f\"node={os.environ['PHALANX_NODE_RANK']} channel={root} read={text}\", flush=True)\n"
        "out = pathlib.Path(os.environ['PHALANX_OUTPUT_DIR'])\n"
        "out.mkdir(parents=True, exist_ok=True)\n"
        "(out / f\"from_rank{os.environ['RANK']}.txt\").write_text(text)\n"
    )
    proc = phalanx("run", "--input", f"data={data}", *_ssh(ssh_hosts, "-n", "2x1"), str(script), check=True, timeout=180)
    seen = dict(re.findall(r"node=(\d) channel=(\S+) read=hello from the data", proc.stdout))
    assert set(seen) == {"0", "1"}, proc.stdout + proc.stderr
    assert seen["1"].startswith(str(_remote_home(ssh_hosts, 1)))  # node 1 read its own copy
    job = json.loads(phalanx("ps", "--all", "--json", check=True).stdout)[0]
    # every node's outputs came back, not only node 0's
    assert sorted(p.name for p in Path(job["job_dir"], "output").iterdir()) == ["from_rank0.txt", "from_rank1.txt"]

    # sent again only when the local files changed
    backend, opts = SshBackend(), {"ssh_config": str(ssh_hosts.config)}
    cache, _ = channel_copy(HomePaths(Path("~/.phalanx/remote")), Channel("data", str(data), str(data)))
    item = Shipment("input 'data'", data, str(cache.data), marker=str(cache.manifest), follow_links=True)
    copies = [Path(str(cache.data).replace("~", str(home), 1)) for home in ssh_hosts.homes]
    for copy in copies:
        assert not (copy / "linked.txt").is_symlink() and (copy / "linked.txt").read_text() == "linked"
        (copy / "sentinel").write_text("still the first copy")
    backend.ship(opts, ssh_hosts.names, [item])
    assert all((copy / "sentinel").exists() for copy in copies)
    (data / "sub" / "more.txt").write_text("more")
    backend.ship(opts, ssh_hosts.names, [item])
    for copy in copies:
        assert not (copy / "sentinel").exists() and (copy / "sub" / "more.txt").read_text() == "more"


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
