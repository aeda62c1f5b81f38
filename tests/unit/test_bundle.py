"""The code bundle that backends without phalanx on their nodes ship (storage/bundle.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from phalanx.errors import UsageError
from phalanx.storage import bundle


def _code(tmp_path):
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_text("import pkg.model\nprint('trained', pkg.model.X)\n")
    (code / "pkg" / "__init__.py").write_text("")
    (code / "pkg" / "model.py").write_text("X = 42\n")
    (code / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (code / "run.sh").chmod(0o755)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"x" * 4096)
    os.symlink(tmp_path / "data", code / "data")  # what a snapshot links instead of copying
    return code


def test_same_code_gives_the_same_bytes_and_links_stay_home(tmp_path):
    code = _code(tmp_path)
    first = bundle.build(bundle.code_files(code), tmp_path / "a.tar.gz")
    os.utime(code / "train.py", (1, 1))  # times do not matter, content does
    second = bundle.build(bundle.code_files(code), tmp_path / "b.tar.gz")
    assert first.sha256 == second.sha256
    names = sorted(rel for rel, _ in bundle.code_files(code))
    assert names == ["pkg/__init__.py", "pkg/model.py", "run.sh", "train.py"]
    (code / "pkg" / "model.py").write_text("X = 43\n")
    assert bundle.build(bundle.code_files(code), tmp_path / "c.tar.gz").sha256 != first.sha256


def test_fetch_program_unpacks_a_bundle_that_runs_with_python_alone(tmp_path):
    """The node side: FETCH with nothing but the standard library, then the script and phalanx's
    worker bootstrap import from the bundle (site-packages off, so no installed phalanx helps)."""
    code = _code(tmp_path)
    built = bundle.build(bundle.code_files(code), tmp_path / "bundle.tar.gz")
    dest = tmp_path / "node"
    env = {"PATH": os.environ["PATH"], "PHX_BUNDLE_URL": str(built.path), "PHX_BUNDLE_SHA256": built.sha256,
           "PHX_BUNDLE_DIR": str(dest)}
    fetched = subprocess.run([sys.executable, "-S", "-c", bundle.FETCH], env=env, capture_output=True, text=True)
    assert fetched.returncode == 0, fetched.stderr
    assert built.sha256[:12] in fetched.stdout
    assert os.access(dest / "code" / "run.sh", os.X_OK)
    assert not (dest / "code" / "data").exists()
    ran = subprocess.run([sys.executable, "-S", "train.py"], cwd=dest / "code", env={"PATH": env["PATH"]},
                         capture_output=True, text=True)
    assert ran.stdout.strip() == "trained 42"
    probe = "import phalanx.launch.bootstrap as b, phalanx.storage.bundle as s; print(b.__file__)"
    imported = subprocess.run([sys.executable, "-S", "-c", probe], env={"PATH": env["PATH"], "PYTHONPATH": str(dest / "lib")},
                              capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip().startswith(str(dest / "lib"))


def test_fetch_refuses_a_bundle_whose_digest_differs(tmp_path):
    built = bundle.build(bundle.code_files(_code(tmp_path)), tmp_path / "bundle.tar.gz")
    env = {"PATH": os.environ["PATH"], "PHX_BUNDLE_URL": str(built.path), "PHX_BUNDLE_SHA256": "0" * 64,
           "PHX_BUNDLE_DIR": str(tmp_path / "node")}
    fetched = subprocess.run([sys.executable, "-S", "-c", bundle.FETCH], env=env, capture_output=True, text=True)
    assert fetched.returncode == 1
    assert "expected 000000" in fetched.stderr
    assert not (tmp_path / "node").exists()


def test_a_bundle_too_big_is_refused_naming_the_largest_file(tmp_path):
    code = _code(tmp_path)
    (code / "weights.bin").write_bytes(b"w" * (2 << 20))
    with pytest.raises(UsageError, match=r"weights\.bin \(2 MiB\).*--input"):
        bundle.build(bundle.code_files(code), tmp_path / "b.tar.gz", max_bytes=1 << 20)
    assert not (tmp_path / "b.tar.gz").exists()


def test_unpack_refuses_members_that_leave_the_directory(tmp_path):
    import io
    import tarfile

    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    # tarfile's data filter refuses it (FilterError); without filters, unpack's own check (ValueError)
    with pytest.raises((getattr(tarfile, "FilterError", ValueError), ValueError)):
        bundle.unpack(evil, tmp_path / "dest")
    assert not (tmp_path / "outside.txt").exists()
