"""Fixtures for the Kubernetes backend's tests: a FAKE API server with a scripted kubelet
(``fake``), and a workdir with a script, a kubeconfig and a phalanx home (``k8s``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources

from .fakecluster import Cluster
from .scripted import ScriptedKubelet


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """One FAKE API server + controllers + scripted kubelet per module (reset per test)."""
    kubelet = ScriptedKubelet()
    cluster = Cluster(tmp_path_factory.mktemp("fakeapi"), kubelet)
    try:
        yield cluster
    finally:
        cluster.close()


@dataclass
class K8s:
    cluster: Cluster
    kubelet: ScriptedKubelet
    workdir: Path
    kubeconfig: Path

    def spec(self, nodes: int = 2, **options) -> JobSpec:
        return JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(self.workdir / "train.py")), Resources(nodes, 1), name="train",
                       backend="k8s", workdir=str(self.workdir), snapshot=True, grace=5.0,
                       backend_options={"image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime", **options})


@pytest.fixture
def k8s(fake, tmp_path, monkeypatch):
    """The fake cluster, emptied; KUBECONFIG and PHALANX_HOME pointing at it and a fresh home."""
    from phalanx.backends.kubernetes import follow as watch

    fake.reset()
    fake.kubelet.plays.clear()
    fake.kubelet.choose = lambda pod: "succeed"
    monkeypatch.setattr(watch.Attempt, "every", 0.2)
    monkeypatch.setenv("PHALANX_HOME", str(tmp_path / "home"))
    kubeconfig = fake.api.kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('hello')\n")
    return K8s(fake, fake.kubelet, workdir, kubeconfig)
