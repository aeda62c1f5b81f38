"""``phalanx run --backend k8s`` end to end, with the in-pod half for real: the FAKE API server's
pods run as processes in network namespaces (podsim.py), made from the manifests phalanx
generated, with an image holding only python3 and torch. The code bundle is fetched for real
(from an S3-compatible server on the namespaces' bridge, by presigned URL, or from the ConfigMap),
the node agents rendezvous for real (torchrun, gloo) across the namespaces, signals and grace
periods are real. What stands in: the API server and its controllers (fakeapi.py,
fakecluster.py), the kubelet and the container runtime (podsim.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from phalanx.backends.base import free_port
from tests.conftest import EXAMPLES, phalanx

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRAIN = str(EXAMPLES / "train_ddp.py")
OBJECTS = ("jobs", "pods", "services", "configmaps", "secrets")


@dataclass
class PodNet:
    cluster: object
    kubelet: object
    net: object
    s3: str
    root: Path


@pytest.fixture(scope="module")
def podnet(tmp_path_factory):
    """Three pod slots (network namespaces), the image, a FAKE API server on 127.0.0.1 whose
    kubelet runs pods in the slots, and an S3-compatible server on the bridge the pods reach."""
    from tests.cluster import netns

    from .fakecluster import Cluster
    from .podsim import NetnsKubelet, make_image

    if os.geteuid() != 0:
        pytest.skip("pods as processes need network and mount namespaces: run as root")
    moto = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    if not os.path.exists(moto):
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    root = tmp_path_factory.mktemp("podsim")
    try:
        net = netns.create(3)
    except (netns.Unavailable, OSError) as exc:
        pytest.skip(f"cannot create network namespaces here: {exc}")
    kubelet = NetnsKubelet(root, net, make_image(root / "image"))
    cluster = Cluster(root / "api", kubelet)
    with serving(moto, root, net, cluster, kubelet) as s3:
        yield PodNet(cluster, kubelet, net, s3, root)


@contextlib.contextmanager
def serving(moto: str, root: Path, net, cluster, kubelet):
    """An S3-compatible server on the bridge the pods reach (its URL); at the end it, the fake API
    server, the kubelet's pods and the namespaces go."""
    from tests.cluster import netns

    port = free_port(net.driver_addr)
    log = open(root / "moto.log", "wb")
    server = subprocess.Popen([moto, "-H", net.driver_addr, "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        cluster.wait_for(lambda: _connects(net.driver_addr, port), timeout=30, text="moto_server")
        yield f"http://{net.driver_addr}:{port}"
    finally:
        server.terminate()
        server.wait(10)
        log.close()
        cluster.close()
        kubelet.close()
        netns.destroy(net)


def _connects(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.fixture
def env(podnet, tmp_path):
    """The environment of a `phalanx` command talking to the fake cluster and the bucket."""
    podnet.cluster.reset()
    bucket = f"phx-{os.getpid()}-{time.monotonic_ns()}"
    aws = {"AWS_ENDPOINT_URL": podnet.s3, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1"}
    import s3fs

    s3fs.S3FileSystem(key="test", secret="test", client_kwargs={"endpoint_url": podnet.s3}).mkdir(bucket)
    home = tmp_path / "home"
    return {**aws, "PHALANX_HOME": str(home), "KUBECONFIG": str(podnet.cluster.api.kubeconfig(tmp_path / "kubeconfig")),
            "OMP_NUM_THREADS": "1", "BUCKET": bucket}


def _job(env) -> dict:
    out = phalanx("ps", "--all", "--json", env=env, check=True).stdout
    return json.loads(out)[0]


def _left(podnet) -> list[str]:
    return [f"{p}/{o['metadata']['name']}" for p in OBJECTS for o in podnet.cluster.store.list(p, None)]


def _pod_processes(podnet) -> list[int]:
    return [int(p) for ns in podnet.net.node_namespaces
            for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()]


def _wait(what, timeout: float, text: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {text}")


def test_k8s_inpod_netns_two_node_ddp_with_node0_dns_late(podnet, env):
    """2-node gloo DDP through the fake API server: the code fetched by presigned URL, node 1
    waiting for node 0's name until node 0 is scheduled, every rank's log in the job directory,
    and nothing left behind."""
    from .fakecluster import UNSCHEDULABLE

    podnet.cluster.holds[0] = UNSCHEDULABLE
    proc = subprocess.Popen(
        [sys.executable, "-m", "phalanx", "run", "--backend", "k8s", "-n", "2x1", "--grace", "5",
         "--code-uri", f"s3://{env['BUCKET']}/phalanx", TRAIN, "--epochs", "1", "--steps-per-epoch", "3",
         "--print-grad-checksum"],
        env={**os.environ, **env}, cwd=EXAMPLES, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        home = Path(env["PHALANX_HOME"])
        agent_log = lambda: next(iter(home.glob("jobs/*/attempt_0/node_1/agent.log")), None)  # noqa: E731
        _wait(lambda: agent_log() and "waiting for node 0's name" in agent_log().read_text(), 180, "node 1 to wait for node 0")
        del podnet.cluster.holds[0]
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    grads = dict(re.findall(r"grad_checksum rank=(\d) value=(\S+)", out))
    assert set(grads) == {"0", "1"} and grads["0"] == grads["1"], out
    job = _job(env)
    assert job["state"] == "SUCCEEDED" and job["backend"] == "k8s"
    attempt = Path(job["job_dir"], "attempt_0")
    assert "resolves now" in (attempt / "node_1" / "agent.log").read_text()
    results = [json.loads((attempt / f"node_{n}" / "result.json").read_text()) for n in (0, 1)]
    assert [r["exitcode"] for r in results] == [0, 0]
    assert [r["host"] for r in results] == [f"phx-{job['id']}-a0-{n}.phx-{job['id']}-a0" for n in (0, 1)]
    assert not (attempt / "node_0" / "resources.jsonl").exists(), "the image has no psutil: no samples, no crash"
    assert (Path(job["job_dir"]) / "output" / "model.pt").stat().st_size > 0, "PHALANX_OUTPUT_DIR came back"
    state = Path(env["PHALANX_HOME"]) / "state" / f"train_ddp-{job['id']}"  # an unnamed job's own (storage/statedir.py)
    assert (state / "checkpoint.pt").stat().st_size > 0, "and the state"
    _wait(lambda: not _left(podnet), 30, "every object to be deleted")
    logs = phalanx("logs", job["id"], "--rank", "1", env=env, check=True).stdout  # the pods are gone
    assert "grad_checksum rank=1" in logs
    assert _pod_processes(podnet) == []


def test_k8s_inpod_netns_rank_failure_root_cause_and_termination_message(podnet, env):
    """The code in the ConfigMap (no object store); rank 1 raises: the root cause names it, the
    failed pod stays (--keep-failed) and its termination message holds the node's result."""
    proc = phalanx("run", "--backend", "k8s", "-n", "2x1", "--grace", "5", "--keep-failed", TRAIN, "--epochs", "1",
                   "--steps-per-epoch", "4", "--fail-at-step", "2", "--fail-rank", "1", env=env, timeout=300, cwd=EXAMPLES)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    job = _job(env)
    status = json.loads(phalanx("status", job["id"], "--json", env=env, check=True).stdout)
    cause = status["root_cause"] if isinstance(status["root_cause"], dict) else json.loads(status["root_cause"])
    assert (cause["rank"], cause["node_rank"], cause["type"]) == (1, 1, "RuntimeError"), cause
    assert "injected failure at step 2" in cause["message"]
    pods = podnet.cluster.store.list("pods", None)
    failed = [p for p in pods if p["status"]["phase"] == "Failed" and p["metadata"]["labels"][
        "batch.kubernetes.io/job-completion-index"] == "1"]
    assert failed, [p["status"].get("phase") for p in pods]
    told = json.loads(failed[0]["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    assert told["exitcode"] == 1 and told["failures"][0]["rank"] == 1
    assert podnet.cluster.store.list("configmaps", None)[0]["binaryData"]["bundle.tar.gz"]
    for name in ("jobs", "configmaps"):  # kept for debugging; delete them here
        for obj in podnet.cluster.store.list(name, None):
            podnet.cluster.store.delete(name, "default", obj["metadata"]["name"], "Foreground", 0)
    _wait(lambda: not _left(podnet) and not _pod_processes(podnet), 30, "the kept objects to go")


def test_k8s_inpod_netns_preempted_pod_is_retried(podnet, env):
    """The scheduler preempts node 1's pod (DisruptionTarget, SIGTERM, grace): the attempt
    is PREEMPTED, not failed, and --max-retries runs a new Job, whose pods get the checkpoint
    that came back from the first one and resume from it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "phalanx", "run", "--backend", "k8s", "-n", "2x1", "--grace", "5", "--max-retries", "1",
         TRAIN, "--epochs", "1", "--steps-per-epoch", "8", "--sleep", "0.5", "--checkpoint-every", "2"],
        env={**os.environ, **env}, cwd=EXAMPLES, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        home = Path(env["PHALANX_HOME"])
        rank0 = lambda: next(iter(home.glob("jobs/*/attempt_0/rank_0/output.log")), None)  # noqa: E731
        _wait(lambda: rank0() and "step=2 " in rank0().read_text(), 240, "training to start")
        pod = next(p for p in podnet.cluster.store.list("pods", None)
                   if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
        podnet.kubelet.take(podnet.cluster, pod["metadata"]["name"], "PreemptionByScheduler",
                            "default-scheduler: preempting to accommodate a higher priority pod")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    status = json.loads(phalanx("status", _job(env)["id"], "--json", env=env, check=True).stdout)
    assert [(a["outcome"], a["retry"]) for a in status["attempts"]] == [("preempted", True), ("succeeded", False)]
    resumed = Path(status["job_dir"], "attempt_1", "rank_0", "output.log").read_text()
    assert re.search(r"resumed from step=([2-9])", resumed), resumed
    _wait(lambda: not _left(podnet) and not _pod_processes(podnet), 30, "every object and process to go")


def test_k8s_inpod_netns_stop_gives_the_grace_period_and_leaves_nothing(podnet, env):
    job_id = phalanx("run", "-d", "--backend", "k8s", "-n", "2x1", "--grace", "10", "--code-uri",
                     f"s3://{env['BUCKET']}/phalanx", TRAIN, "--epochs", "1", "--steps-per-epoch", "1000", "--sleep", "0.3",
                     env=env, check=True, cwd=EXAMPLES).stdout.strip()
    job = json.loads(phalanx("status", job_id, "--json", env=env, check=True).stdout)
    rank0 = Path(job["job_dir"], "attempt_0", "rank_0", "output.log")
    _wait(lambda: rank0.exists() and "step=2 " in rank0.read_text(), 240, "training to start")
    assert podnet.cluster.store.list("secrets", None), "the bundle's URL travels in a Secret"
    out = phalanx("stop", job_id, env=env, timeout=120, check=True).stdout
    assert out.strip() == f"{job_id} CANCELLED"
    assert "stopping: checkpoint saved at step=" in rank0.read_text(), "SIGTERM reached the ranks, with time to save"
    _wait(lambda: not _left(podnet) and not _pod_processes(podnet), 60, "every object and process to go")
