"""The ssh backend between "different machines": sshd in network namespaces, each host with its
own address and hostname (tests/cluster/netns.py). Loopback aliases hide mistakes that only
show when the hosts' networks differ, such as a rank binding to ``lo``."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, phalanx
from tests.local.test_run import _status

pytestmark = pytest.mark.cluster

TRAIN = str(EXAMPLES / "train_ddp.py")

# Each rank reports where it runs and what it was told, and the ranks exchange hostnames over
# gloo: that can only work if each one advertised an address the other namespace can reach.
PROBE = textwrap.dedent("""\
    import datetime, os, socket
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    names = [None] * dist.get_world_size()
    dist.all_gather_object(names, socket.gethostname())
    print("probe " + " ".join(f"{k}={v}" for k, v in {
        "rank": dist.get_rank(), "host": socket.gethostname(), "master": os.environ["MASTER_ADDR"],
        "ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "gathered": ",".join(names)}.items()), flush=True)
    dist.barrier()
    dist.destroy_process_group()
""")


def _run(hosts, remote_home: Path, *args: str, cwd: Path | None = None, timeout: float = 90) -> tuple[dict, str]:
    """Run a job detached on the namespace hosts and wait for it; returns (status, every rank's output)."""
    extra = {"cwd": cwd} if cwd else {}
    job_id = phalanx("run", "-d", "--grace", "3", "--backend", "ssh", "--ssh-config", str(hosts.config),
                     "--hosts", ",".join(hosts.names), "--remote-home", str(remote_home), *args,
                     check=True, **extra).stdout.strip()
    waited = phalanx("wait", job_id, "--timeout", str(timeout), timeout=timeout + 30)
    if waited.returncode == 124:
        phalanx("stop", job_id, timeout=60)
    logs = phalanx("logs", job_id).stdout
    status = _status(job_id)
    assert waited.returncode == 0 and status["state"] == "SUCCEEDED", f"{status}\n{logs}"
    return status, logs


def _launch(status: dict, node: int) -> dict:
    """The node's launch.json as the remote end wrote it (its env after choosing the interface)."""
    return json.loads(Path(status["job_dir"], "attempt_0", f"node_{node}", "launch.json").read_text())


def test_ddp_between_namespaces_synchronises_gradients(phx_home, netns_hosts):
    status, logs = _run(netns_hosts, phx_home.parent / "remote", "--shared-fs", "-n", "2x1", TRAIN,
                        "--epochs", "1", "--steps-per-epoch", "3", "--print-grad-checksum")
    grads = dict(re.findall(r"grad_checksum rank=(\d) value=(\S+)", logs))
    batches = dict(re.findall(r"local_batch_checksum rank=(\d) value=(\S+)", logs))
    assert set(grads) == {"0", "1"}, logs
    assert grads["0"] == grads["1"] and batches["0"] != batches["1"]
    # each rank ran on its own "machine", not on this one
    assert {r["rank"]: r["host"] for r in status["ranks"]} == {0: netns_hosts.hostnames[0], 1: netns_hosts.hostnames[1]}
    for node in (0, 1):
        launch = _launch(status, node)
        assert f"--rdzv-endpoint={netns_hosts.addrs[0]}:" in " ".join(launch["node"]["torchrun_argv"])
        # Node 0 routes to its own address over lo, yet must bind where node 1 can reach it. Asserted
        # directly: with these 10.x addresses gloo happens to survive node 0 on lo (in each pair the
        # side with the larger address connects, and 127.0.0.1 > 10.x), NCCL's bootstrap would not.
        assert launch["node"]["env"]["GLOO_SOCKET_IFNAME"] == "eth0", f"node {node}: {launch['node']['env']}"


def test_code_is_shipped_to_namespace_hosts_without_shared_fs(phx_home, netns_hosts, tmp_path):
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "probe.py").write_text(PROBE)
    remote_home = tmp_path / "remote"
    status, logs = _run(netns_hosts, remote_home, "-n", "2x1", "probe.py", cwd=workdir)
    probes = {int(m["rank"]): m for m in (dict(re.findall(r"(\w+)=(\S+)", line)) for line in logs.splitlines() if "probe " in line)}
    assert set(probes) == {0, 1}, logs
    for rank, probe in probes.items():
        assert probe["host"] == netns_hosts.hostnames[rank]
        assert probe["master"] == netns_hosts.addrs[0]  # the node-0 namespace, not 127.0.0.1
        assert probe["ifname"] == "eth0"
        assert probe["gathered"] == ",".join(netns_hosts.hostnames)
    # the script ran from the copy shipped into the remote home, not from the working directory
    assert (remote_home / "jobs" / status["id"] / "code" / "probe.py").read_text() == PROBE
