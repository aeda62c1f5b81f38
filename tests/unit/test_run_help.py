"""`phalanx run --help` fits a person: the common options on one screen, each help line with its
default first, every installed backend named, and the way to the rest (`--help-all`,
`phalanx help BACKEND`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from phalanx.backends.builtin import BACKENDS
from phalanx.cli.runflags import installed_backends, option_help
from phalanx.jobfile.values import all_options

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "phalanx", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80", **(env or {})}, cwd=cwd)


def test_run_help_is_one_screen_of_common_options_and_says_where_the_rest_is():
    out = _cli("run", "--help")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.rstrip("\n").splitlines()
    assert len(lines) <= 30, f"run --help is {len(lines)} lines:\n{out.stdout}"
    assert max(len(line) for line in lines) <= 80
    for flag in ("-n, --n TOPOLOGY", "-d, --detach", "--backend", "--max-retries", "--metric", "--objective"):
        assert flag in out.stdout
    for rare in ("--rdzv-conf", "--partition", "--instance-type", "--local-ranks-filter"):
        assert rare not in out.stdout
    tail = " ".join(" ".join(lines[-3:]).split())
    assert "phalanx run --help-all" in tail and "phalanx help BACKEND" in tail
    full = _cli("run", "--help-all").stdout
    assert len(full.splitlines()) > 200 and "--rdzv-conf" in full and "--partition" in full


def test_backend_option_lists_every_installed_backend(tmp_path):
    """A backend a package installs (an entry point) is named with the built-ins."""
    site = tmp_path / "site"
    (site / "mybackend").mkdir(parents=True)
    (site / "mybackend" / "__init__.py").write_text("")
    info = site / "mybackend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mybackend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[phalanx.backends]\nmine = mybackend.backend:MineBackend\n")
    out = _cli("run", "--help", env={"PYTHONPATH": str(site)}).stdout
    text = " ".join(out.split())
    at = text.index("--backend NAME")
    line = text[at:at + 200]
    for name in [*BACKENDS, "mine"]:
        assert name in line, f"--backend does not name {name}: {line}"


def test_every_help_line_states_its_default_first():
    backends = installed_backends()
    for option in all_options():
        if option.expands or not option.flags:
            continue
        text = option_help(option, backends)
        assert "(default" not in text and "; default" not in text, (option.name, text)  # none left inside
        shared = option.group == "backend" and len(option.backends) > 1 and option.help.startswith(option.backends[0])
        # A plain switch (off unless given) has no default to state; every other option does.
        if not shared and (option.default_doc or (option.default_text() and not option.is_flag)):
            assert text.startswith("[default: "), (option.name, text)
    by_name = {o.name: option_help(o, backends) for o in all_options()}
    # The negative flags say what they do after their default, never the default as if it were theirs.
    assert by_name["snapshot"].startswith("[default: a copy of the working directory taken at submit time] Run from "
                                          "the working directory itself")
    assert by_name["warm"].startswith("[default: warm on the local backend (setting: warm)] Start every Python "
                                      "process of the job cold")
    assert by_name["auto_metrics"].startswith("[default: on")
    assert "Do not pick up" in by_name["auto_metrics"]


def test_help_backend_shows_that_backends_options_only():
    slurm = _cli("help", "slurm")
    assert slurm.returncode == 0, slurm.stderr
    assert "--partition" in slurm.stdout and "--sbatch" in slurm.stdout and "--hosts" not in slurm.stdout
    assert "[default: --grace + 30] Seconds before the time limit" in " ".join(slurm.stdout.split())
    local = _cli("help", "local").stdout
    assert "--rdzv-endpoint" in local and "--partition" not in local
    sagemaker = " ".join(_cli("help", "sagemaker").stdout.split())
    assert "--instance-type TEXT [default: ml.m5.xlarge]" in sagemaker and "sagemaker:" in sagemaker  # its section
    wrong = _cli("help", "slrum")
    assert wrong.returncode == 2 and wrong.stderr.startswith("phalanx: error: no such command or backend 'slrum'")
    assert "slurm" in wrong.stderr and "Traceback" not in wrong.stderr
    assert _cli("help", "run").stdout == _cli("run", "--help").stdout
