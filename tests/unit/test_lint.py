"""`ruff check` (lint only, the rules of pyproject.toml's [tool.ruff.lint]) finds nothing: unused
and undefined names, syntax errors, bugbear's real mistakes. CI runs it through this test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ruff() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")  # the test extra installs it into this venv
    found = str(beside) if beside.exists() else shutil.which("ruff")
    assert found, "ruff is missing: pip install -c constraints.txt -e '.[test]'"
    return [found]


def test_ruff_finds_nothing():
    proc = subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise", str(ROOT)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"ruff check found problems (fix them; see docs/contributing.md):\n{proc.stdout}{proc.stderr}"


def test_ruff_catches_what_it_is_for(tmp_path):
    """The configuration is the one in use and catches an undefined name and a loop closure."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\n\n\ndef f(xs):\n    return [lambda: x for x in xs] + [y]\n")
    proc = subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise", "bad.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for code in ("F401", "F821", "B023"):
        assert code in proc.stdout, proc.stdout
