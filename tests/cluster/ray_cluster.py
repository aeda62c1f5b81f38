"""A real Ray cluster for tests: a head and a worker, each a "different machine" in a network
namespace of its own (tests/cluster/netns.py), started with ``ray start --block``.

Why namespaces: a Ray node advertises the machine's external address even when told 127.0.0.1,
and tests may talk only to loopback or to namespaces they made (research: shared/research/
backends.md section 4.3). So the head is 10.200.K.11, the worker 10.200.K.12, and this machine
(phalanx, the Jobs API client) reaches the head's dashboard at http://10.200.K.11:8265.

Each node has a HOME of its own (so its ``~/.phalanx`` and ``~/.ray`` are its own, as on separate
machines: they share this machine's filesystem, but no path is shared), its own ``--temp-dir``,
usage stats off, token authentication on with a token set explicitly (``RAY_AUTH_TOKEN``), and a
PATH without the venv: on a real cluster the ``python`` on PATH is often not the one with Ray.

Stopped by pid: every process in each namespace (``netns.destroy``), never ``ray stop``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster import netns

DASHBOARD_PORT = 8265
GCS_PORT = 6380
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Unavailable(Exception):
    """Ray cannot run here; the message says why (tests skip with it)."""


@dataclass
class RayCluster:
    root: Path
    network: netns.Network
    token: str
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)  # node name -> its `ray start --block`
    # Ray's sessions and sockets: a short path (a unix socket path is limited to 107 bytes).
    temp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pxray-", dir="/tmp")))

    @property
    def head_addr(self) -> str:
        return self.network.node_addrs[0]

    @property
    def worker_addr(self) -> str:
        return self.network.node_addrs[1]

    @property
    def address(self) -> str:
        """The Jobs API address (the head's dashboard)."""
        return f"http://{self.head_addr}:{DASHBOARD_PORT}"

    @property
    def client_env(self) -> dict[str, str]:
        """What a user on this machine sets to reach the cluster."""
        return {"RAY_ADDRESS": self.address, "RAY_AUTH_TOKEN": self.token}

    def home(self, node: str) -> Path:
        return self.root / f"home-{node}"

    def log(self, node: str) -> Path:
        return self.root / f"ray-{node}.log"

    def node_pids(self, node: str) -> list[int]:
        """Every process running on ``node`` ("head" or "worker") now."""
        ns = self.network.node_namespaces[0 if node == "head" else 1]
        return [int(p) for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()]

    def alive_nodes(self) -> list[dict]:
        req = urllib.request.Request(f"{self.address}/nodes?view=summary", headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            summary = json.loads(resp.read())["data"]["summary"]
        return [n for n in summary if n.get("raylet", {}).get("state") == "ALIVE"]

    def job_status(self, submission_id: str) -> str:
        req = urllib.request.Request(f"{self.address}/api/jobs/{submission_id}",
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return str(json.loads(resp.read())["status"])

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-20:])
                         for p in sorted(self.root.glob("ray-*.log")))


def _env(cluster: RayCluster, node: str) -> dict[str, str]:
    home = cluster.home(node)
    home.mkdir(parents=True, exist_ok=True)
    return {
        "HOME": str(home), "PATH": BASE_PATH, "LANG": "C.UTF-8",
        "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": cluster.token,
        "OMP_NUM_THREADS": "1", "TMPDIR": str(home / "tmp"),
        # A dead node is declared dead after ~3 s instead of Ray's default ~15 s (5 missed checks
        # of 3 s): the node-loss test waits for that.
        "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",
    }


def _ray() -> str:
    exe = Path(sys.executable).parent / "ray"
    if not exe.exists():
        raise Unavailable("ray is not installed (pip install -c constraints.txt -e '.[ray]')")
    return str(exe)


def start_node(cluster: RayCluster, node: str) -> None:
    """Start (or start again, after ``kill_node``) the head or the worker, in its namespace."""
    index = 0 if node == "head" else 1
    addr = cluster.network.node_addrs[index]
    temp = cluster.temp / node[0]
    env = _env(cluster, node)
    Path(env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
    argv = [_ray(), "start", "--block", f"--node-ip-address={addr}", "--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats",
            f"--temp-dir={temp}"]
    if node == "head":
        argv += ["--head", f"--port={GCS_PORT}", "--include-dashboard=true", f"--dashboard-host={addr}",
                 f"--dashboard-port={DASHBOARD_PORT}"]
    else:
        argv += [f"--address={cluster.head_addr}:{GCS_PORT}"]
    cluster.procs[node] = netns.spawn(cluster.network.node_namespaces[index], argv, env, hostname=f"ray-{node}",
                                      log=cluster.log(node))


def wait_nodes(cluster: RayCluster, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        for node, proc in cluster.procs.items():
            if proc.poll() is not None:
                raise Unavailable(f"ray start on the {node} exited with {proc.returncode}:\n{cluster.logs()}")
        try:
            if len(cluster.alive_nodes()) >= count:
                return
        except (OSError, ValueError, KeyError) as exc:
            last = exc
        time.sleep(0.5)
    raise Unavailable(f"the Ray cluster did not come up within {timeout:g}s ({last}):\n{cluster.logs()}")


def kill_node(cluster: RayCluster, node: str) -> None:
    """The machine dies: SIGKILL to every process in its namespace (raylet, workers, agents)."""
    pids = cluster.node_pids(node)
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    proc = cluster.procs.pop(node, None)
    if proc is not None:
        proc.wait(timeout=10)


def start(root: Path) -> RayCluster:
    """Head and worker up, both ALIVE; raises Unavailable when that cannot be here."""
    _ray()
    net = netns.create(2)
    cluster = RayCluster(root, net, token=secrets.token_hex(32))
    try:
        names = {"ray-head": net.node_addrs[0], "ray-worker": net.node_addrs[1]}
        for ns in net.node_namespaces:  # the nodes know each other by name, as machines on a LAN do
            netns.set_hosts(net, ns, names)
        start_node(cluster, "head")
        wait_nodes(cluster, 1)
        start_node(cluster, "worker")
        wait_nodes(cluster, 2)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def stop(cluster: RayCluster) -> None:
    """Every process of both nodes, by pid (``netns.destroy``), then the network. Idempotent."""
    for proc in cluster.procs.values():
        netns.stop_group(proc, grace=2)
    netns.destroy(cluster.network)
    shutil.rmtree(cluster.temp, ignore_errors=True)
