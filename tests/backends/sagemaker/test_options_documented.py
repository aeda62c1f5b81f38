"""Every SageMaker and SkyPilot option is a `phalanx run` flag and is documented on its backend's page."""

from pathlib import Path

import pytest
import typer

from phalanx.backends.sagemaker.options import OPTIONS as SAGEMAKER
from phalanx.backends.skypilot.options import OPTIONS as SKYPILOT
from phalanx.cli.main import app

DOCS = Path(__file__).resolve().parents[3] / "docs"


@pytest.mark.parametrize("option, page", [*((o, "sagemaker.md") for o in SAGEMAKER), *((o, "skypilot.md") for o in SKYPILOT)],
                         ids=lambda v: getattr(v, "name", v))
def test_option_is_a_flag_and_documented(option, page):
    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    flags = {opt for param in run.params for opt in param.opts}
    assert option.flag in flags, f"add {option.flag} to `phalanx run`"
    assert f"`{option.flag}" in (DOCS / page).read_text(), f"document {option.flag} in docs/{page}"


def test_help_never_imports_an_sdk():
    import subprocess
    import sys

    code = ("import sys; from phalanx.cli.main import main\ntry:\n    main(['run', '--help-all'])\nexcept SystemExit:\n    pass\n"
            "bad = [m for m in ('boto3', 'botocore', 'sky', 'torch') if m in sys.modules]\nprint('loaded', bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "loaded []" in out.stdout, out.stdout[-500:] + out.stderr[-2000:]
