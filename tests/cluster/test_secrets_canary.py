"""The canary (docs/secrets.md): one secret, jobs that print it every way a script might on the
local, ssh (real sshd hosts) and Kubernetes backends (a FAKE API server whose pods run as real
processes in network namespaces: tests/kubernetes/podsim.py), a sweep, a retry on kept agents and a
failure with a notification; then the canary's bytes are searched everywhere phalanx writes or
answers: every file under the phalanx home (job directories, manifests, the store) and the hosts'
remote homes and the pods' volumes, a dump of the store, every ``--dry-run``, ``status --json``,
``ps --json``, ``logs``, the dashboard's API answers and pages, the webhook's bodies, and what the
commands printed. Zero hits outside the masked form; and every rank did get the value (it prints
its digest)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import ssh_hosts  # noqa: F401 - the session's sshd hosts
from tests.conftest import phalanx
from tests.kubernetes.test_k8s_inpod_netns import podnet  # noqa: F401 - the fake API server's pods in namespaces

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CANARY = "phx-canary-" + hashlib.sha256(str(time.time_ns()).encode()).hexdigest()[:24]
DIGEST = hashlib.sha256(CANARY.encode()).hexdigest()
MASK = "********"
SCRIPT = r'''
import hashlib, os, subprocess, sys, time
v = os.environ["CANARY_TOKEN"]
print("sha", hashlib.sha256(v.encode()).hexdigest(), "rank", os.environ.get("RANK", "0"), flush=True)
print("whole:", v, flush=True)
sys.stdout.write("split:" + v[:9]); sys.stdout.flush(); time.sleep(0.05); sys.stdout.write(v[9:] + "\n"); sys.stdout.flush()
for i in range(1, len(v), 7):
    sys.stdout.write("\rbar " + v[:i]); sys.stdout.flush()
sys.stdout.write("\rbar " + v + " 100%\n"); sys.stdout.flush()
print("err:", v, file=sys.stderr, flush=True)
subprocess.run([sys.executable, "-c", "import os; print('child:', os.environ['CANARY_TOKEN'], flush=True)"], check=True)
if os.environ.get("FAIL_ATTEMPT") == os.environ.get("PHALANX_ATTEMPT"):
    # Every rank has printed all of the above before any fails: a failed rank ends the others.
    mark = os.path.join(os.environ["DONE_DIR"], os.environ["PHALANX_JOB_ID"] + "-" + os.environ["PHALANX_ATTEMPT"])
    open(mark + "-" + os.environ.get("RANK", "0"), "w").close()
    for _ in range(1200):
        if len([f for f in os.listdir(os.environ["DONE_DIR"]) if f.startswith(os.path.basename(mark) + "-")]) >= int(os.environ.get("WORLD_SIZE", "1")):
            break
        time.sleep(0.05)
    raise RuntimeError("token rejected: " + v)
'''


def test_the_canary_is_nowhere_but_in_the_ranks(phx_home, ssh_hosts, podnet, tmp_path, monkeypatch):  # noqa: F811
    from tests.unit.test_notify import Webhook

    work = tmp_path / "work"
    work.mkdir()
    (work / "canary.py").write_text(SCRIPT)
    monkeypatch.setenv("PHALANX_SECRETS_FILE", str(tmp_path / "config" / "secrets.json"))
    monkeypatch.setenv("PHALANX_SECRETS_STORE", "file")
    put = subprocess.run([sys.executable, "-m", "phalanx", "secret", "set", "CANARY_TOKEN"], input=CANARY, text=True,
                         capture_output=True, timeout=60)
    assert put.returncode == 0, put.stderr
    said: list[str] = [put.stdout, put.stderr]
    hook = Webhook()
    ssh = ["--backend", "ssh", "--ssh-config", str(ssh_hosts.config), "--hosts", ",".join(ssh_hosts.names)]
    podnet.cluster.reset()
    k8s_env = {"KUBECONFIG": str(podnet.cluster.api.kubeconfig(tmp_path / "kubeconfig")), "AWS_ENDPOINT_URL": podnet.s3,
               "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}

    def run(*args: str, code: int = 0, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        proc = phalanx("run", "--secret", "CANARY_TOKEN", *args, cwd=work, env=env, timeout=timeout)
        said.extend([proc.stdout, proc.stderr])
        assert proc.returncode == code, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    try:
        lone = run("canary.py")  # foreground, the lent relay
        assert f"sha {DIGEST}" in lone.stdout and MASK in lone.stdout
        done = tmp_path / "done"
        done.mkdir()
        fail = ["-e", "FAIL_ATTEMPT=0", "-e", f"DONE_DIR={done}"]
        run("-n", "2", "--max-retries", "1", *fail, "canary.py")  # a retry on the kept agents
        run("-n", "2", *fail, "--notify", hook.url, "canary.py", code=1)  # a failure, notified
        detached = run("-d", "canary.py").stdout.strip()
        run("canary.py", "--lr", "[1, 2]")  # a sweep of two trials
        run(*ssh, "-n", "2x1", "canary.py", timeout=400)
        run("--backend", "k8s", "-n", "1x1", "--grace", "5", "canary.py", env=k8s_env, timeout=400)
        assert phalanx("wait", detached, timeout=120).returncode == 0
        for args, env in (([], None), (ssh, None), (["--backend", "k8s"], k8s_env)):
            dry = run("--dry-run", *args, "-n", "2", "canary.py", env=env).stdout
            assert "CANARY_TOKEN=<secret>" in dry, dry
    finally:
        hook.close()

    rows = json.loads(phalanx("ps", "--all", "--json", check=True).stdout)
    said.append(json.dumps(rows))
    jobs = [r for r in rows if r.get("kind") != "sweep"]
    sweeps = [r["id"] for r in rows if r.get("kind") == "sweep"]
    assert {j["backend"] for j in jobs} == {"local", "ssh", "k8s"} and len(jobs) >= 6 and len(sweeps) == 1, rows
    every = [j["id"] for j in jobs] + _trials(sweeps)
    assert len(every) == len(jobs) + 2
    for job_id in every:
        status = phalanx("status", job_id, "--json", check=True).stdout
        said.extend([status, phalanx("logs", job_id).stdout, phalanx("logs", job_id, "--attempt", "0").stdout])
        job_dir = Path(json.loads(status)["job_dir"])
        logs = list(job_dir.glob("attempt_*/rank_*/output.log"))
        assert logs, f"job {job_id} has no rank log"
        for log in logs:
            text = log.read_text()
            assert f"sha {DIGEST}" in text and text.count(MASK) >= 5, log  # the rank got it; each print masked
    assert hook.received and all(MASK in json.dumps(r) or "token rejected" not in json.dumps(r) for r in hook.received)
    said.extend(json.dumps(r) for r in hook.received)
    said.extend(_dashboard(every))

    hits = [i for i, text in enumerate(said) if CANARY in text]
    assert not hits, [said[i][:500] for i in hits]
    places = [Path(os.environ["PHALANX_HOME"]), *ssh_hosts.homes, podnet.root]
    found = [str(p) for place in places for p in _files(place) if CANARY.encode() in _read(p)]
    assert not found, found
    con = sqlite3.connect(Path(os.environ["PHALANX_HOME"]) / "phalanx.db")
    try:
        assert CANARY not in "\n".join(con.iterdump())
    finally:
        con.close()


def _trials(sweeps: list[str]) -> list[str]:
    out = []
    for sweep in sweeps:
        shown = phalanx("sweep", "show", sweep, "--json", check=True).stdout
        out += [t["id"] for t in json.loads(shown)["trials"]]
    return out


def _dashboard(job_ids: list[str]) -> list[str]:
    """Every answer of the dashboard's API and pages about these jobs (in-process client)."""
    from starlette.testclient import TestClient

    from phalanx.web.app import create_app

    client = TestClient(create_app(token=None, loopback=True), base_url="http://127.0.0.1:8000")
    answers = [client.get(path).text for path in ("/", "/api/jobs", "/api/sweeps", "/api/meta", "/?view=sweeps")]
    for sweep in json.loads(answers[2]) if answers[2].startswith("[") else []:
        answers += [client.get(f"/api/sweeps/{sweep['id']}").text, client.get(f"/sweeps/{sweep['id']}").text]
    for job_id in job_ids:
        detail = client.get(f"/api/jobs/{job_id}")
        assert detail.status_code == 200, detail.text
        answers += [detail.text, client.get(f"/jobs/{job_id}").text, client.get(f"/api/jobs/{job_id}/artifacts").text,
                    client.get(f"/api/jobs/{job_id}/metrics").text]
        for attempt in range(int(detail.json().get("attempt") or 0) + 1):
            for rank in range(2):
                logs = client.get(f"/api/jobs/{job_id}/logs", params={"rank": rank, "attempt": attempt})
                answers.append(logs.text)
    return answers


def _files(root: Path):
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                yield path
        except OSError:
            continue


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
