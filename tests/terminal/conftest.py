"""Shared by the terminal tests: a fresh copy of the scripts per test, and the command lines of
python, torchrun and phalanx that run them."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The scripts, copied into a directory of their own (the command's cwd)."""
    work = tmp_path / "proj"
    shutil.copytree(SCRIPTS, work)
    return work


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PHALANX_HOME": str(tmp_path / "phx"), "OMP_NUM_THREADS": "1", "TERM": "xterm"}


def command(how: str, script: str, *args: str) -> list[str]:
    """``python``, ``torchrun`` (2 processes), ``phalanx`` (one process) or ``phalanx-n2``."""
    py = sys.executable
    return {
        "python": [py, script],
        "torchrun": [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script],
        "phalanx": [py, "-m", "phalanx", "run", script],
        "phalanx-n2": [py, "-m", "phalanx", "run", "-n", "2", script],
    }[how] + list(args)


def last_job(env: dict[str, str]):
    """The newest job of the test's ``$PHALANX_HOME``."""
    from phalanx.core.paths import HomePaths
    from phalanx.store import Store

    (record,) = Store(HomePaths(Path(env["PHALANX_HOME"])).db).list(limit=1)
    return record


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
