"""Every SageMaker and SkyPilot option is a `phalanx run` flag and is documented in the README."""

from pathlib import Path

import pytest
import typer

from phalanx.backends.sagemaker.options import OPTIONS as SAGEMAKER
from phalanx.backends.skypilot.options import OPTIONS as SKYPILOT
from phalanx.cli.main import app

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()


@pytest.mark.parametrize("option", [*SAGEMAKER, *SKYPILOT], ids=lambda o: o.name)
def test_option_is_a_flag_and_documented(option):
    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    flags = {opt for param in run.params for opt in param.opts}
    assert option.flag in flags, f"add {option.flag} to `phalanx run`"
    assert f"`{option.flag}" in README, f"document {option.flag} in README.md"


def test_help_never_imports_an_sdk():
    import subprocess
    import sys

    code = ("import sys; from phalanx.cli.main import main\ntry:\n    main(['run', '--help-all'])\nexcept SystemExit:\n    pass\n"
            "bad = [m for m in ('boto3', 'botocore', 'sky', 'torch') if m in sys.modules]\nprint('loaded', bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "loaded []" in out.stdout, out.stdout[-500:] + out.stderr[-2000:]
