"""A command whose optional package is missing says which extra brings it, in one line, with no
traceback (``cli/main.py``'s EXTRAS): here ``phalanx server`` and ``phalanx ui`` without the ``web`` extra."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("command", ["server", "ui"])
def test_a_missing_optional_package_names_its_extra_in_one_line(tmp_path, command):
    # None in sys.modules makes ``import starlette`` raise ModuleNotFoundError, as when it is absent.
    code = ("import sys; sys.modules['starlette'] = None; from phalanx.cli.main import main; "
            f"main(['{command}', '--port', '0'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PHALANX_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1
    assert done.stderr == ("phalanx: error: this needs the Python package 'starlette', which is not installed; "
                           "install it with: pip install 'phalanx[web]'\n")
    assert "Traceback" not in done.stdout + done.stderr
