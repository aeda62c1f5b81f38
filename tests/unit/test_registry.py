"""Backends are found through the ``phalanx.backends`` entry points: a package registers one with
one line of packaging metadata, imported only when asked for; an unknown name lists the known."""

from __future__ import annotations

import sys

import pytest

from phalanx.backends import registry
from phalanx.errors import UsageError

BACKEND = '''
from phalanx.backends.base import Backend

class ToyBackend(Backend):
    name = "toy"

    def _plan(self, spec, job_id, attempt, home, paths, facts):
        raise NotImplementedError
'''


@pytest.fixture
def toy_package(tmp_path, monkeypatch):
    """An installed distribution (a .dist-info on sys.path) registering ``toy`` and a broken entry."""
    (tmp_path / "toy_backend.py").write_text(BACKEND)
    info = tmp_path / "toy_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[phalanx.backends]\ntoy = toy_backend:ToyBackend\nbroken = toy_backend:Missing\nlocal = toy_backend:ToyBackend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry._entry_points.cache_clear()
    yield
    registry._entry_points.cache_clear()
    sys.modules.pop("toy_backend", None)


def test_a_third_party_backend_registers_through_an_entry_point(toy_package):
    assert "toy_backend" not in sys.modules  # listing the names imports nothing
    assert {"local", "ssh", "slurm", "toy", "broken"} <= set(registry.known())
    assert "toy_backend" not in sys.modules
    backend = registry.get_backend("toy")
    assert type(backend).__name__ == "ToyBackend" and backend.name == "toy"
    assert type(registry.get_backend("local")).__name__ == "LocalBackend"  # a built-in name cannot be taken over
    with pytest.raises(UsageError, match=r"the broken backend \(toy_backend:Missing\) cannot be loaded"):
        registry.get_backend("broken")


def test_an_unknown_backend_lists_the_known_ones(toy_package):
    with pytest.raises(UsageError, match="unknown backend 'nope'; known backends: broken, k8s, local, ray, sagemaker, skypilot, slurm, ssh, toy"):
        registry.get_backend("nope")


def test_backend_modules_are_imported_only_when_used():
    code = ("import sys, phalanx.cli.main\n"
            "from phalanx.api import query\n"
            "loaded = [m for m in sys.modules if m.startswith(('phalanx.backends.ssh', 'phalanx.backends.slurm.backend', "
            "'phalanx.supervise.job', 'torch'))]\n"
            "assert not loaded, loaded\n")
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_built_ins_are_registered_as_entry_points_too():
    """pyproject.toml registers them as any package would; BUILTIN only serves a checkout run uninstalled."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    section = text.split('[project.entry-points."phalanx.backends"]', 1)[1].split("\n[", 1)[0]
    assert dict(re.findall(r'^(\w+) = "([^"]+)"$', section, re.M)) == registry.BUILTIN
