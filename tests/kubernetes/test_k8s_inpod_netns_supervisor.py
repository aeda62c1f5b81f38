"""``phalanx run --backend k8s --in-cluster -d``: the supervisor runs in a pod, and the machine
that submitted may go. The supervisor pod is REAL: ``python3 -m phalanx.supervise.remote``
from the fetched bundle, in a network namespace (podsim.py), with an image of python3 + torch only,
talking to the FAKE API server over HTTPS with the in-cluster credentials a kubelet gives a pod
(``KUBERNETES_SERVICE_HOST/PORT``, the service account's token and CA), and to an S3-compatible
server by presigned URLs. The API server listens on the address of the bridge the test creates
(``netns.Network.driver_addr``), which the namespaces reach; nothing leaves the machine.

What stands in: the API server and its controllers (fakeapi.py, fakecluster.py: the Job
controller replaces a failed supervisor pod within ``backoffLimit``), the kubelet (podsim.py).
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, phalanx

# The pods' helpers: what is left of a job in the fake API and in the pods' namespaces, a bounded wait.
from .test_k8s_inpod_netns import TRAIN, _left, _pod_processes, _wait

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@dataclass
class SupNet:
    cluster: object
    kubelet: object
    net: object
    s3: str
    token: str
    ca: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _pki(d: Path, addr: str) -> None:
    """A cluster CA and the API server's certificate for ``addr``."""
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=fake-cluster-ca", cwd=d)
    (d / "san.cnf").write_text(f"subjectAltName=IP:{addr}\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={addr}", cwd=d)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.crt",
             "-days", "2", "-extfile", "san.cnf", cwd=d)


@pytest.fixture(scope="module")
def supnet(tmp_path_factory):
    from tests.cluster import netns

    from .fakecluster import Cluster
    from .podsim import NetnsKubelet, ServiceAccount, make_image
    from .test_k8s_inpod_netns import serving

    if os.geteuid() != 0:
        pytest.skip("pods as processes need network and mount namespaces: run as root")
    moto = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    if not os.path.exists(moto) or shutil.which("openssl") is None:
        pytest.skip("needs moto_server (pip install 'moto[server]') and openssl")
    root = tmp_path_factory.mktemp("suppod")
    try:
        net = netns.create(3)
    except (netns.Unavailable, OSError) as exc:
        pytest.skip(f"cannot create network namespaces here: {exc}")
    _pki(root / "pki", net.driver_addr)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(root / "pki" / "server.crt", root / "pki" / "server.key")
    kubelet = NetnsKubelet(root, net, make_image(root / "image"))
    cluster = Cluster(root / "api", kubelet, host=net.driver_addr, tls=tls)
    token = "sa-" + secrets.token_hex(8)
    sa = root / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(token)
    shutil.copy(root / "pki" / "ca.crt", sa / "ca.crt")
    (sa / "namespace").write_text("default")
    kubelet.service = ServiceAccount(net.driver_addr, cluster.api.httpd.server_address[1], sa)
    with serving(moto, root, net, cluster, kubelet) as s3:
        yield SupNet(cluster, kubelet, net, s3, token, root / "pki" / "ca.crt")


def _home(supnet, tmp_path: Path, name: str, bucket: str) -> dict[str, str]:
    """A machine: its own PHALANX_HOME and a kubeconfig (HTTPS, the cluster's CA, a user token)."""
    config = tmp_path / f"kubeconfig-{name}"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": supnet.cluster.api.url,
                                                  "certificate-authority-data": base64.b64encode(supnet.ca.read_bytes()).decode()}}],
        "users": [{"name": "me", "user": {"token": f"user-{name}"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me", "namespace": "default"}}]}))
    return {"AWS_ENDPOINT_URL": supnet.s3, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1", "PHALANX_HOME": str(tmp_path / f"home-{name}"), "KUBECONFIG": str(config),
            "OMP_NUM_THREADS": "1", "BUCKET": bucket}


@pytest.fixture
def machines(supnet, tmp_path):
    """Two machines with the same kubeconfig: the laptop that submits, another that looks."""
    supnet.cluster.reset()
    bucket = f"phx-{os.getpid()}-{time.monotonic_ns()}"
    import s3fs

    s3fs.S3FileSystem(key="test", secret="test", client_kwargs={"endpoint_url": supnet.s3}).mkdir(bucket)
    return _home(supnet, tmp_path, "laptop", bucket), _home(supnet, tmp_path, "other", bucket)


def _submit(env, *train_args: str, retries: int = 0) -> str:
    out = phalanx("run", "-d", "--backend", "k8s", "--in-cluster", "-n", "1x1", "--grace", "5", "--max-retries", str(retries),
                  "--code-uri", f"s3://{env['BUCKET']}/phalanx", TRAIN, "--epochs", "1", *train_args,
                  env=env, cwd=EXAMPLES, check=True, timeout=120)
    return out.stdout.strip().splitlines()[-1]


def _attempt_log(supnet, attempt: int) -> str:
    """The node container's log of ``attempt``'s pod, as the (fake) kubelet keeps it."""
    store = supnet.cluster.store
    for pod in store.list("pods", None, f"phalanx.dev/attempt={attempt}"):
        log = store.logs.get(("default", pod["metadata"]["name"], "node"))
        if log is not None and log.path.exists():
            return log.path.read_text(errors="replace")
    return ""


def _supervisor_pods(supnet) -> list[dict]:
    return supnet.cluster.store.list("pods", None, "phalanx.dev/role=supervisor")


def _supervisor_logs(supnet) -> str:
    """Every supervisor pod's log, for failure messages."""
    store = supnet.cluster.store
    return "\n".join(f"--- {pod['metadata']['name']}\n" + log.path.read_text(errors="replace")
                     for pod in _supervisor_pods(supnet)
                     if (log := store.logs.get(("default", pod["metadata"]["name"], "supervisor"))) and log.path.exists())


def _status(env, job_id: str) -> dict:
    return json.loads(phalanx("status", job_id, "--json", env=env, check=True).stdout)


def _phalanx_here(home: str) -> list[int]:
    """Processes of this machine (outside the pods) whose PHALANX_HOME is ``home``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"PHALANX_HOME={home}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_k8s_inpod_netns_supervisor_pod_retries_an_evicted_attempt_without_the_laptop(supnet, machines):
    """Submit with -d --in-cluster: the CLI exits and nothing of phalanx runs on the laptop;
    the supervisor pod (in-cluster credentials) starts attempt 0, which is evicted; it starts
    attempt 1 from the checkpoint that came back; the job SUCCEEDS, and another machine with
    only the kubeconfig lists it, shows its attempts and reads its logs."""
    laptop, other = machines
    job_id = _submit(laptop, "--steps-per-epoch", "8", "--sleep", "0.5", "--checkpoint-every", "2", retries=1)
    assert _phalanx_here(laptop["PHALANX_HOME"]) == [], "no supervisor process on the laptop"
    rbac = Path(laptop["PHALANX_HOME"], "jobs", job_id, "supervisor-rbac.yaml").read_text()
    assert "kind: Role" in rbac and "pods/log" in rbac
    _wait(lambda: "step=2 " in _attempt_log(supnet, 0), 300, "attempt 0 to train")
    pod = supnet.cluster.store.list("pods", None, "phalanx.dev/attempt=0")[0]
    supnet.kubelet.take(supnet.cluster, pod["metadata"]["name"], "TerminationByKubelet",
                        "The node was low on resource: memory.", evicted=True)
    status = _wait(lambda: (s := _status(other, job_id))["state"] in ("SUCCEEDED", "FAILED", "LOST") and s, 400,
                   "the job to end, seen from the other machine")
    assert status["state"] == "SUCCEEDED", status
    assert [(a["outcome"], a["retry"]) for a in status["attempts"]] == [("preempted", True), ("succeeded", False)]
    logs = phalanx("logs", job_id, "--rank", "0", env=other, check=True).stdout
    assert re.search(r"resumed from step=([2-9])", logs), logs
    third = other | {"PHALANX_HOME": other["PHALANX_HOME"] + "-3"}  # a machine that never looked before
    listed = json.loads(phalanx("ps", "--backend", "k8s", "--json", env=third, check=True).stdout)
    assert [(j["id"], j["state"]) for j in listed] == [(job_id, "SUCCEEDED")]
    assert f"Bearer {supnet.token}" in supnet.cluster.store.auth, "the supervisor pod used its service account"
    attempt_jobs = [o["metadata"]["name"] for o in supnet.cluster.store.list("jobs", None, "!phalanx.dev/role")]
    _wait(lambda: not [o for o in supnet.cluster.store.list("jobs", None, "!phalanx.dev/role")], 60,
          f"the attempts' Jobs to be deleted ({attempt_jobs})")
    _wait(lambda: not _pod_processes(supnet), 60, "every pod's processes to end")


def test_k8s_inpod_netns_supervisor_pod_killed_is_replaced_and_reattaches(supnet, machines):
    """The supervisor pod's processes are killed mid-run: the Job controller starts another
    supervisor pod, which restores the record and watches the running attempt (found by its
    labels) instead of starting a second one; the job SUCCEEDS with one attempt."""
    laptop, other = machines
    job_id = _submit(laptop, "--steps-per-epoch", "30", "--sleep", "0.3")
    _wait(lambda: "step=3 " in _attempt_log(supnet, 0), 300, "attempt 0 to train")
    time.sleep(6)  # one record sync (every 5 s) after the attempt started
    first = _supervisor_pods(supnet)[0]["metadata"]["name"]
    run = next(r for r in supnet.kubelet.runs.values() if r.name == first)
    supnet.kubelet._kill_all(run)  # as an OOM kill of its container, or its node vanishing
    waited = phalanx("wait", job_id, "--timeout", "400", env=laptop, timeout=420)  # the laptop's own copy, refreshed
    assert waited.returncode == 0, waited.stdout + waited.stderr + _supervisor_logs(supnet)
    status = _status(other, job_id)
    assert status["state"] == "SUCCEEDED", status
    assert [(a["outcome"], a["retry"]) for a in status["attempts"]] == [("succeeded", False)], _supervisor_logs(supnet)
    sups = _supervisor_pods(supnet)
    assert len(sups) == 2 and sups[0]["status"]["phase"] != sups[1]["status"]["phase"], [p["status"].get("phase") for p in sups]
    created = [path for method, path in supnet.cluster.store.requests if method == "POST" and path.endswith("/jobs")]
    assert len(created) == 2, f"the supervisor Job and one attempt, never a second attempt: {created}"
    assert "step=29 " in phalanx("logs", job_id, "--rank", "0", env=other, check=True).stdout


def test_k8s_inpod_netns_stop_from_another_machine_leaves_nothing(supnet, machines):
    laptop, other = machines
    job_id = _submit(laptop, "--steps-per-epoch", "1000", "--sleep", "0.3")
    _wait(lambda: "step=2 " in _attempt_log(supnet, 0), 300, "attempt 0 to train")
    pod = supnet.cluster.store.list("pods", None, "phalanx.dev/attempt=0")[0]["metadata"]["name"]
    out = phalanx("stop", job_id, env=other, timeout=180, check=True).stdout
    assert out.strip() == f"{job_id} CANCELLED"
    log = supnet.cluster.store.logs[("default", pod, "node")].path.read_text()
    assert "stopping: checkpoint saved at step=" in log, "the ranks got SIGTERM and the grace period"
    assert "stopping: checkpoint saved" in phalanx("logs", job_id, "--rank", "0", env=other, check=True).stdout
    _wait(lambda: not _left(supnet) and not _pod_processes(supnet), 90, "every object and process to go")
    assert _status(other, job_id)["state"] == "CANCELLED"
