"""The end-to-end test against a REAL cluster: whatever the kubeconfig points to (kind, k3d, a
cloud cluster). Opt in, never in CI:

    PHALANX_K8S_LIVE=1 [PHALANX_K8S_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime] \\
    [PHALANX_K8S_NAMESPACE=default] [PHALANX_K8S_CODE_URI=s3://bucket/prefix] \\
        .venv/bin/python -m pytest -m k8s_live tests/kubernetes/test_k8s_live.py

The image needs python3 and torch (CPU is enough). Without PHALANX_K8S_CODE_URI the code
travels in a ConfigMap. The test leaves nothing in the namespace.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.conftest import EXAMPLES, phalanx

pytestmark = [
    pytest.mark.k8s_live,
    pytest.mark.skipif(os.environ.get("PHALANX_K8S_LIVE") != "1", reason="a real cluster: opt in with PHALANX_K8S_LIVE=1"),
]


def _options() -> list[str]:
    opts = ["--image", os.environ.get("PHALANX_K8S_IMAGE", "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime")]
    if os.environ.get("PHALANX_K8S_NAMESPACE"):
        opts += ["--namespace", os.environ["PHALANX_K8S_NAMESPACE"]]
    if os.environ.get("PHALANX_K8S_CODE_URI"):
        opts += ["--code-uri", os.environ["PHALANX_K8S_CODE_URI"]]
    return opts


def test_k8s_live_two_node_ddp(phx_home):
    from phalanx.backends.kubernetes import kubeconfig, manifests
    from phalanx.backends.kubernetes.client import Client

    proc = phalanx("run", "--backend", "k8s", "-n", "2x1", *_options(), "train_ddp.py", "--epochs", "1",
                   "--steps-per-epoch", "3", "--print-grad-checksum", cwd=EXAMPLES, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    grads = dict(re.findall(r"grad_checksum rank=(\d) value=(\S+)", proc.stdout))
    assert set(grads) == {"0", "1"} and grads["0"] == grads["1"]
    job = json.loads(phalanx("ps", "--all", "--json", check=True).stdout)[0]
    assert "grad_checksum rank=1" in phalanx("logs", job["id"], "--rank", "1", check=True).stdout
    client = Client(kubeconfig.load(None, os.environ.get("PHALANX_K8S_NAMESPACE")))
    left = [o["metadata"]["name"] for kind in ("Job", "Pod", "Service", "ConfigMap", "Secret")
            for o in client.list(kind, labels=manifests.selector(job["id"]))
            if not (o.get("metadata") or {}).get("deletionTimestamp")]
    assert left == [], "phalanx deletes what it created"
