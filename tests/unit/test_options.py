"""The option table is the one declaration: the docs, the command line and the job-file schema
list exactly its options, and backends' options arrive without importing the backends."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.backends import options as backend_options
from phalanx.cli.optdocs import render
from phalanx.core.options import RUN_OPTIONS
from phalanx.jobfile.values import all_options, file_schema

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "options.md"


def test_docs_page_is_generated_from_the_table():
    assert DOC.read_text() == render(), "docs/options.md is stale: python -m phalanx.cli.optdocs > docs/options.md"


def _doc_rows():
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| ") and not line.startswith("| flags")]
    flags, keys = set(), set()
    for row in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        flags |= {m.split(" ")[0] for m in re.findall(r"`(-[^`]*)`", cells[0])}
        keys |= set(re.findall(r"`([^`]+)`", cells[1]))
    return flags, keys


def _cli_flags():
    import typer

    from phalanx.cli.main import app

    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    return {flag for p in run.params for flag in getattr(p, "opts", []) if flag.startswith("-")} - {"-h", "--help", "--help-all"}


def test_docs_cli_and_job_file_list_the_same_options():
    table = all_options()
    table_flags = {f for o in table for f in o.flags}
    table_keys = {o.file_key for o in table if o.file_key}
    doc_flags, doc_keys = _doc_rows()
    top, sections, _ = file_schema()
    file_keys = {k for k in top if k not in sections} | {f"{s}.{k}" for s, keys in sections.items() for k in keys}
    assert _cli_flags() == table_flags == doc_flags
    assert file_keys == table_keys == doc_keys
    assert {"--hosts", "--partition", "--sbatch"} <= table_flags  # backends' own, picked up from their modules
    assert {"backend_options.hosts", "sweep.trials", "max_retries"} <= table_keys


def test_flags_and_keys_are_unique():
    flags = [f for o in all_options() for f in o.flags]
    assert len(flags) == len(set(flags))
    names = [o.name for o in all_options()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("backend", ["ssh", "slurm", "local", "ray", "sagemaker", "skypilot", "k8s"])
def test_builtin_backends_declare_what_their_light_module_says(backend):
    from phalanx.backends.registry import get_backend

    assert backend_options.declared(backend) == tuple(get_backend(backend).options)


def test_every_option_has_help_and_a_spelling():
    for option in RUN_OPTIONS:
        assert option.help.endswith((".", ")")), option.name
        assert option.flags or option.file_key, option.name


def test_listing_backend_options_imports_no_backend():
    """Only the backends' options modules (and their packages, which import nothing else) load."""
    code = ("import sys\nfrom phalanx.backends.options import backend_options\nbackend_options()\n"
            "light = {'phalanx.backends.options', 'phalanx.backends.slurm', 'phalanx.backends.slurm.sbatch', 'phalanx.backends.builtin'}\n"
            "print(sorted(m for m in sys.modules if m.startswith('phalanx.backends.') and m not in light\n"
            "             and not m.endswith('.options') and m + '.options' not in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


THIRD_PARTY = {
    "mybackend/__init__.py": "",
    # The backend module stands for one that imports a heavy SDK: --help must not import it.
    "mybackend/backend.py": "import sys\nsys.modules['HEAVY_SDK_IMPORTED'] = sys\n"
                            "from phalanx.backends.local import LocalBackend\nfrom .options import OPTIONS\n"
                            "class MineBackend(LocalBackend):\n    name = 'mine'\n    options = OPTIONS\n",
    "mybackend/options.py": "from phalanx.backends.options import BackendOption\n"
                            "OPTIONS = (BackendOption('mine_zone', str, 'z1', 'Zone of the mine backend.'),)\n",
    "mybackend-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: mybackend\nVersion: 1.0\n",
    "mybackend-1.0.dist-info/entry_points.txt": "[phalanx.backends]\nmine = mybackend.backend:MineBackend\n",
}


def test_an_installed_backend_adds_its_options_without_being_imported(tmp_path):
    site = tmp_path / "site"
    for rel, text in THIRD_PARTY.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    (tmp_path / "t.py").write_text("print('ok')\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(site), "PHALANX_HOME": str(tmp_path / "home")}
    probe = ("import sys\nfrom phalanx.cli.main import main\ntry:\n    main(['run', '--help-all'])\nexcept SystemExit:\n"
             "    pass\nprint('HEAVY' if 'HEAVY_SDK_IMPORTED' in sys.modules else 'LIGHT')\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True).stdout
    assert "--mine-zone" in out and "mine: Zone of the mine backend." in " ".join(out.split())
    assert out.strip().endswith("LIGHT")
    run = [sys.executable, "-m", "phalanx", "run", "--dry-run"]
    ok = subprocess.run([*run, "--backend", "mine", "--mine-zone", "z9", "t.py"], capture_output=True, text=True,
                        env=env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    wrong = subprocess.run([*run, "--mine-zone", "z9", "t.py"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert wrong.returncode == 2 and "--mine-zone is an option of the mine backend, not of local" in wrong.stderr
