"""Bad input for the k8s backend, through the real CLI against a FAKE API server: one line
naming the problem and the fix, exit 2, no traceback, and nothing created (no job recorded, no
object in the cluster); or, when the cluster refuses an object midway, everything created so
far deleted again."""

from __future__ import annotations

import json
import os

import pytest

from phalanx.core.state import JobState
from tests.conftest import phalanx

from .fakeapi import status


def _run(k8s, *args: str, env: dict | None = None):
    return phalanx("run", "--backend", "k8s", "-n", "2x1", *args, "train.py", cwd=k8s.workdir, env=env, timeout=120)


def _nothing_created(k8s, proc) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("phalanx: error: ")
    store = k8s.cluster.store
    assert [(m, p) for m, p in store.requests if m in ("POST", "PATCH", "DELETE") and "selfsubjectaccessreviews" not in p] == []
    assert json.loads(phalanx("ps", "--all", "--json", check=True).stdout) == []


@pytest.mark.parametrize("args, env, message", [
    ((), {"KUBECONFIG": "/nonexistent/kubeconfig"},
     "no Kubernetes configuration: the files in KUBECONFIG do not exist; point KUBECONFIG at your cluster's kubeconfig"),
    (("--context", "prod"), None, "context 'prod' is not in the kubeconfig"),
    (("--namespace", "team-b"), None,
     "namespace 'team-b' does not exist (context fake); create it (kubectl create namespace team-b) or pick another with "
     "--namespace"),
    (("--image", "PyTorch:latest"), None, "invalid --image 'PyTorch:latest'; use an image reference"),
    (("--k8s-kind", "pytorchjob"), None,
     "the cluster does not serve PyTorchJob (kubeflow.org/v1): its operator is not installed; install it, or use the "
     "default --k8s-kind job"),
    (("--k8s-kind", "trainjob"), None, "the cluster does not serve TrainJob (trainer.kubeflow.org/v1alpha1)"),
    (("--in-cluster",), None, "--in-cluster runs the job's supervisor in the cluster, so the job runs detached; add -d"),
    (("-d", "--in-cluster"), None, "--in-cluster keeps the job record in an object store; none is configured; give one "
                                   "with --code-uri s3://BUCKET/PREFIX"),
    (("-d", "--in-cluster", "--code-uri", "gs://bucket/phalanx"), None,
     "--in-cluster keeps the job record in an s3:// store; gs://bucket/phalanx is not one; give --code-uri s3://BUCKET/PREFIX"),
])
def test_k8s_fakeapi_bad_input_is_one_line_exit_2_nothing_created(k8s, args, env, message):
    proc = _run(k8s, *args, env=env)
    _nothing_created(k8s, proc)
    assert message in proc.stderr, proc.stderr


def test_k8s_fakeapi_rbac_refusal_names_the_verbs_and_resources(k8s):
    k8s.cluster.store.forbidden |= {("create", "jobs.batch", "default"), ("get", "pods/log", "default")}
    proc = _run(k8s)
    _nothing_created(k8s, proc)
    assert "not allowed in namespace 'default' (RBAC): create jobs.batch, get pods/log; ask the cluster's admins" \
        in proc.stderr, proc.stderr


def test_k8s_fakeapi_gpus_no_node_offers_are_refused(k8s):
    k8s.cluster.add_nodes(2, gpus=4)
    proc = _run(k8s, "--gpus-per-node", "8")
    _nothing_created(k8s, proc)
    assert "no node offers 8 nvidia.com/gpu (the most any of 2 node(s) offers is 4)" in proc.stderr, proc.stderr
    assert "--pending-timeout" in proc.stderr


def test_k8s_fakeapi_a_bundle_too_big_for_a_configmap_is_refused(k8s):
    (k8s.workdir / "weights.bin").write_bytes(os.urandom(2 << 20))
    (k8s.workdir / ".phalanxignore").write_text("!weights.bin\n")  # large data is frozen only when asked for
    proc = _run(k8s)
    _nothing_created(k8s, proc)
    assert "the code bundle is" in proc.stderr and "more than the 960 KiB a ConfigMap can carry" in proc.stderr
    assert "--code-uri s3://BUCKET/PREFIX" in proc.stderr


def test_k8s_fakeapi_a_shared_state_too_big_for_a_configmap_is_refused(k8s, tmp_path):
    """The state directory travels with the code: a named run whose shared state directory is too
    big for the ConfigMap is refused before anything is created; a run of the same script without
    a name gets its own, empty one, so another run's state is no reason to refuse it."""
    state = tmp_path / "home" / "state" / "big"
    state.mkdir(parents=True)
    (state / "checkpoint.pt").write_bytes(os.urandom(1 << 20))
    proc = _run(k8s, "--name", "big")
    _nothing_created(k8s, proc)
    assert "and the state directory" in proc.stderr and "more than the 960 KiB a ConfigMap can carry" in proc.stderr

    (tmp_path / "home" / "state" / "train").mkdir()
    (tmp_path / "home" / "state" / "train" / "checkpoint.pt").write_bytes(os.urandom(1 << 20))
    k8s.kubelet.choose = lambda pod: "succeed"
    proc = _run(k8s)  # named 'train' after its script, but with its own state directory
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_k8s_fakeapi_a_refusal_midway_deletes_what_was_created(k8s):
    """The cluster takes the ConfigMap, then refuses the Service (a quota): the job fails at
    once saying so, and the ConfigMap is gone again."""
    k8s.cluster.store.refuse[("create", "services")] = status(
        403, "Forbidden", 'services "x" is forbidden: exceeded quota: objects, requested: services=1, used: services=10, '
                          "limited: services=10")
    proc = _run(k8s)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = json.loads(phalanx("ps", "--all", "--json", check=True).stdout)[0]
    assert record["state"] == JobState.FAILED.value
    cause = json.loads(phalanx("status", record["id"], "--json", check=True).stdout)["root_cause"]
    cause = cause if isinstance(cause, dict) else json.loads(cause)
    assert cause["message"].startswith("could not start: the cluster refused creating the Service: services \"x\" is "
                                       "forbidden: exceeded quota")
    created = [p for m, p in k8s.cluster.store.requests if m == "POST" and "configmaps" in p]
    deleted = [p for m, p in k8s.cluster.store.requests if m == "DELETE" and "configmaps" in p]
    assert created and deleted and not k8s.cluster.store.list("configmaps", None)
