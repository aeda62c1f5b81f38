"""The SkyPilot environment the real-library tests run in: ``.venv-sky`` at the repository root,
apart from the main ``.venv`` (skypilot 0.14.1 pins click<8.2 and uvicorn<0.36; constraints.txt
does not), with phalanx installed editable into it and every version from ``constraints-sky.txt``.

``python3 tests/backends/skypilot/skyenv.py`` builds it (CI: ``.ci/run``; ~30 s and ~450 MB from
the package index); the tests build it on first use (``ensure``). ``PHALANX_SKY_PYTHON`` points
the tests at another interpreter that has skypilot and phalanx installed.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
VENV = ROOT / ".venv-sky"
CONSTRAINTS = ROOT / "constraints-sky.txt"
STAMP = VENV / "phalanx-constraints.sha256"  # which constraints the environment was built from


def _digest() -> str:
    return hashlib.sha256(CONSTRAINTS.read_bytes() + (ROOT / "pyproject.toml").read_bytes()).hexdigest()


def python() -> Path:
    """The environment's interpreter, as it is (``ensure`` builds it)."""
    return Path(os.environ.get("PHALANX_SKY_PYTHON") or VENV / "bin" / "python")


def ensure() -> Path:
    """The interpreter of an up-to-date environment, built now if missing or stale (under a lock:
    two test processes may ask at once). Raises CalledProcessError when pip cannot install."""
    if os.environ.get("PHALANX_SKY_PYTHON"):
        return python()
    with open(ROOT / ".venv-sky.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (STAMP.is_file() and STAMP.read_text() == _digest()):
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
            pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            subprocess.run([*pip, "-c", str(CONSTRAINTS), "pip"], check=True)
            subprocess.run([*pip, "-c", str(CONSTRAINTS), "-e", f"{ROOT}[skypilot]"], check=True, cwd=ROOT)
            STAMP.write_text(_digest())
    return python()


if __name__ == "__main__":
    print(ensure())
