from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture
def phx_home(tmp_path, monkeypatch):
    home = tmp_path / "phx"
    monkeypatch.setenv("PHALANX_HOME", str(home))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return home


def phalanx(*args: str, timeout: float = 180, check: bool = False, cwd: Path = ROOT, env: dict | None = None):
    """Run the real CLI in a subprocess; returns CompletedProcess (text)."""
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"phalanx {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc
