"""Real daemons started by the tests themselves, on 127.0.0.1 only, stopped by PID."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """An S3-compatible server (moto_server) on a free loopback port; yields its endpoint URL."""
    exe = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    if not os.path.exists(exe):
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    from phalanx.backends.base import free_port  # not one a port-0 listener beside us can take first

    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("moto_server did not start")
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """Standard AWS configuration pointing at the test server, plus a fresh bucket."""
    env = {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    import s3fs

    bucket = f"phx-{os.getpid()}-{time.monotonic_ns()}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    return bucket


@pytest.fixture(scope="session")
def ssh_hosts(tmp_path_factory):
    """Two sshd hosts (node1, node2) on 127.0.0.2 and 127.0.0.3; yields SshHosts."""
    from tests.cluster import sshd

    root = tmp_path_factory.mktemp("sshd")
    try:
        hosts = sshd.start(root)
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot start sshd here: {exc}")
    try:
        probe = hosts.ssh("node1", "true")
        if probe.returncode != 0:
            pytest.skip(f"sshd started but ssh fails: {probe.stderr.strip()}")
        yield hosts
    finally:
        sshd.stop(hosts)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """munged + slurmctld + two slurmd (n1 on 127.0.0.2, n2 on 127.0.0.3); yields SlurmCluster."""
    from tests.cluster import slurm

    try:
        cluster = slurm.start(tmp_path_factory.mktemp("slurm"))
    except slurm.Unavailable as exc:
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        slurm.stop(cluster)


@pytest.fixture
def slurm_env(slurm_cluster, phx_home, monkeypatch):
    """Client commands (and so phalanx) talk to the test cluster; jobs live in a fresh home."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    return slurm_cluster


@pytest.fixture(scope="session")
def netns_hosts(tmp_path_factory):
    """Two sshd hosts (nodeA, nodeB) on "different machines": each in its own network namespace,
    with its own address (10.200.K.11, .12) and hostname; yields netns.NetnsHosts."""
    from tests.cluster import netns

    try:
        hosts = netns.start(tmp_path_factory.mktemp("netns"))
    except (netns.Unavailable, OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot run hosts in network namespaces here (needs root, iproute2, util-linux, openssh-server): {exc}")
    try:
        probe = hosts.ssh(hosts.names[0], "true")
        if probe.returncode != 0:
            pytest.skip(f"sshd started in a namespace but ssh fails: {probe.stderr.strip()}")
        yield hosts
    finally:
        netns.stop(hosts)


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A real Ray cluster: head and worker, each in its own network namespace with its own home;
    one per test session (bring-up costs ~10-15 s); yields ray_cluster.RayCluster."""
    from tests.cluster import netns, ray_cluster

    try:
        cluster = ray_cluster.start(tmp_path_factory.mktemp("ray"))
    except (ray_cluster.Unavailable, netns.Unavailable, OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot run a Ray cluster here (needs root, iproute2 and the ray extra): {exc}")
    try:
        yield cluster
    finally:
        ray_cluster.stop(cluster)


@pytest.fixture
def ray_env(ray_cluster, phx_home, monkeypatch):
    """This machine as a user of the cluster: RAY_ADDRESS and RAY_AUTH_TOKEN set, a fresh home."""
    for key, value in ray_cluster.client_env.items():
        monkeypatch.setenv(key, value)
    return ray_cluster
