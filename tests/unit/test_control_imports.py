"""`phalanx --help` and `ps` (with its new filters, columns and --wide) stay light: no torch, no
web stack, no optimiser or cloud SDK imported."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "starlette", "uvicorn", "plotly", "optuna", "boto3", "ray", "kubernetes", "jax", "sqlalchemy",
         "mlflow", "wandb", "tensorboard")


def _imported(tmp_path, *args: str) -> set[str]:
    code = ("import sys\nsys.argv = ['phalanx', *sys.argv[1:]]\nfrom phalanx.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True,
                         env={"PHALANX_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}).stdout
    return set(out.strip().splitlines()[-1].split())


def test_help_and_ps_import_nothing_heavy(tmp_path):
    for args in (["--help"], ["ps"], ["ps", "--all", "--wide"], ["ps", "--state", "failed", "--tag", "team=x", "--since", "1d"]):
        heavy = _imported(tmp_path, *args) & set(HEAVY)
        assert not heavy, (args, heavy)
