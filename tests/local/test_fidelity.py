"""Frozen code, live paths; state shared only on purpose; snapshots that cost kilobytes.
Real processes (the CLI, the bootstrap, retries)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import phalanx

pytestmark = pytest.mark.local

HELPER_V1 = """import os, time


def run():
    if os.environ["PHALANX_ATTEMPT"] == "0":
        while not os.path.exists("go"):  # the test edits the code meanwhile
            time.sleep(0.05)
        raise RuntimeError("v1 fails on its first attempt")
    print("helper v1 ran", flush=True)
"""
HELPER_V2 = "\n\n# edited after submit: the line numbers moved\n" + HELPER_V1.replace("v1", "v2")


def _wait_state(job: str, states: set[str], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = json.loads(phalanx("status", job, "--json", check=True).stdout)
        if status["state"] in states:
            return status
        time.sleep(0.2)
    raise AssertionError(f"job {job} never reached {states}")


def test_a_retry_runs_the_submitted_code_in_the_users_directory_under_their_names(phx_home, tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("import helper\nopen('written_here.txt', 'w').write('ok')\nhelper.run()\n")
    (proj / "helper.py").write_text(HELPER_V1)
    job = phalanx("run", "-d", "--max-retries", "1", "train.py", cwd=proj, check=True).stdout.strip()
    (proj / "helper.py").write_text(HELPER_V2)  # edits after submit must not reach a retry
    (proj / "train.py").write_text("raise SystemExit('edited script ran')\n")
    (proj / "go").write_text("")
    status = _wait_state(job, {"SUCCEEDED", "FAILED"})
    assert status["state"] == "SUCCEEDED", status
    assert "helper v1 ran" in phalanx("logs", job, check=True).stdout
    assert (proj / "written_here.txt").read_text() == "ok"  # cwd is the user's directory
    first = phalanx("logs", job, "--attempt", "0", check=True).stdout
    # the traceback names the user's file and shows the line that ran (v1's, not the edit's)
    assert f'File "{proj / "helper.py"}", line 8, in run' in first
    assert 'raise RuntimeError("v1 fails on its first attempt")' in first and "v2" not in first
    assert not list(Path(status["job_dir"]).glob("**/written_here.txt"))


def _frozen_run(tmp_path: Path, script: str, files: dict[str, str], edit: dict[str, str], args: tuple[str, ...] = ()):
    """Run the bootstrap with --frozen on a project copied as ``files``, then edited to ``edit``."""
    proj, code = tmp_path / "proj", tmp_path / "code"
    for rel, text in files.items():
        for root in (proj, code):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    for rel, text in edit.items():
        (proj / rel).parent.mkdir(parents=True, exist_ok=True)
        (proj / rel).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("PHALANX_RANK_DIR", "PYTHONDONTWRITEBYTECODE")}
    return subprocess.run([sys.executable, "-m", "phalanx.launch.bootstrap", "--frozen", str(code), str(proj), *args, script],
                          cwd=proj, env=env, capture_output=True, text=True, timeout=60), proj, code


def test_frozen_imports_name_the_users_files_and_read_the_copy(tmp_path):
    files = {
        "main.py": ("import inspect, json, os, sys\nimport pkg.mod, late, nspace.part\nfrom pkg import mod\n"
                    "import importlib.resources\n"
                    "print(json.dumps({'mod': mod.VALUE, 'file': mod.__file__, 'origin': mod.__spec__.origin,\n"
                    "  'src': inspect.getsource(mod.f).strip(), 'late': late.VALUE, 'ns': nspace.part.VALUE,\n"
                    "  'data': importlib.resources.files('pkg').joinpath('data.txt').read_text().strip(),\n"
                    "  'rel': mod.rel(), 'path0': sys.path[0], 'main': __file__}))\n"),
        "pkg/__init__.py": "",
        "pkg/mod.py": "from . import sub\nVALUE = 'frozen ' + sub.WORD\ndef f():\n    return 'frozen f'\ndef rel():\n    import os\n    return open(os.path.join(os.path.dirname(__file__), 'data.txt')).read().strip()\n",
        "pkg/sub.py": "WORD = 'sub'\n",
        "pkg/data.txt": "data v1\n",
        "nspace/part.py": "VALUE = 'frozen ns'\n",
    }
    edit = {"pkg/mod.py": "VALUE = 'live'\ndef f():\n    return 'live f'\n", "pkg/sub.py": "WORD = 'live'\n",
            "pkg/data.txt": "data v2\n", "late.py": "VALUE = 'created after submit'\n",
            "nspace/part.py": "VALUE = 'live ns'\n"}
    proc, proj, code = _frozen_run(tmp_path, "main.py", files, edit, ("--script",))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["mod"] == "frozen sub" and seen["ns"] == "frozen ns"  # the copy's code, packages and namespaces
    assert seen["file"] == seen["origin"] == str(proj / "pkg" / "mod.py")  # under the user's name
    assert seen["src"] == "def f():\n    return 'frozen f'"  # inspect reads the code that runs
    assert seen["late"] == "created after submit"  # what the snapshot lacks, python finds live
    assert seen["data"] == seen["rel"] == "data v2"  # data next to the code is read live
    assert seen["path0"] == str(proj) and seen["main"] == str(proj / "main.py")
    assert not (proj / "pkg" / "__pycache__").exists()  # frozen bytecode stays with the copy
    assert list((code / "pkg" / "__pycache__").glob("mod.*.pyc"))


def test_frozen_bytecode_is_compiled_once_for_every_job_that_runs_the_same_code(phx_home, tmp_path):
    (tmp_path / "lib.py").write_text("VALUE = 1\n")
    (tmp_path / "train.py").write_text("import lib\nprint(lib.VALUE, lib.__cached__)\n")
    env = {"PYTHONDONTWRITEBYTECODE": ""}
    outs = [phalanx("run", "train.py", cwd=tmp_path, check=True, env=env).stdout for _ in range(2)]
    cache = phx_home / "cache" / "code" / "pyc"
    pycs = list(cache.iterdir())
    assert len(pycs) == 1 and pycs[0].name.endswith("-lib.cpython-%d%d.pyc" % sys.version_info[:2]), pycs
    first_write = pycs[0].stat().st_mtime_ns
    assert outs[0] == outs[1] == f"1 {tmp_path / '__pycache__' / pycs[0].name.split('-', 2)[2]}\n"  # python's name
    assert pycs[0].stat().st_mtime_ns == first_write  # the second job reused it
    assert not (tmp_path / "__pycache__").exists()


def test_frozen_module_runs_like_python_dash_m(tmp_path):
    files = {"pkg/__init__.py": "", "pkg/__main__.py": "import sys\nprint('main', __name__, __spec__.name, sys.argv[1:])\n",
             "pkg/train.py": "import sys\nfrom . import util\nprint(util.X, __file__, sys.argv[0] == __file__, __package__)\n",
             "pkg/util.py": "X = 'frozen util'\n"}
    proc, proj, _ = _frozen_run(tmp_path, "pkg.train", files, {"pkg/util.py": "X = 'live util'\n"}, ("--module",))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["frozen", "util", str(proj / "pkg" / "train.py"), "True", "pkg"]
    proc, _, _ = _frozen_run(tmp_path / "b", "pkg", files, {}, ("--module",))
    assert proc.stdout.split() == ["main", "__main__", "pkg.__main__", "[]"]


def test_a_plain_run_starts_with_empty_state_a_named_one_picks_it_up_and_says_so(phx_home, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import os\nstate = os.environ['PHALANX_STATE_DIR']\nckpt = os.path.join(state, 'epoch.txt')\n"
        "start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0\n"
        "print('resumed at', start)\nopen(ckpt, 'w').write(str(start + 3))\n")
    first = phalanx("run", "train.py", cwd=tmp_path, check=True)
    second = phalanx("run", "train.py", cwd=tmp_path, check=True)
    assert "resumed at 0" in first.stdout and "resumed at 0" in second.stdout, "a plain run never resumes another"
    assert "state:" not in second.stderr
    named = [phalanx("run", "--name", "long", "train.py", cwd=tmp_path, check=True) for _ in range(2)]
    assert "resumed at 0" in named[0].stdout and "resumed at 3" in named[1].stdout
    first_id = json.loads(phalanx("status", "long", "--json", check=True).stdout)["id"]
    line = [entry for entry in named[1].stderr.splitlines() if "state:" in entry]
    assert len(line) == 1 and "picking up" in line[0] and "--clean-state" in line[0]
    jobs = json.loads(phalanx("ps", "--all", "--json", check=True).stdout)
    older = [j["id"] for j in jobs if j["name"] == "long" and j["id"] != first_id]
    assert f"by job {older[0]} 'long'" in line[0]
    fresh = phalanx("run", "--name", "long", "--clean-state", "train.py", cwd=tmp_path, check=True)
    assert "resumed at 0" in fresh.stdout


def _disk_usage(root: Path) -> int:
    """Bytes the tree takes on disk (blocks, hard links counted once), as du does."""
    seen, total = set(), 0
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        total += st.st_blocks * 512
    return total


def test_ten_runs_of_a_project_with_50_mb_of_data_cost_kilobytes_each(phx_home, tmp_path):
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "src").mkdir()
    with open(proj / "data" / "train.bin", "wb") as fh:
        fh.write(os.urandom(50 * 1024 * 1024))
    (proj / "data" / "labels.csv").write_text("0,1\n" * 100)
    for i in range(20):
        (proj / "src" / f"layer{i}.py").write_text(f"WIDTH = {i}\n" * 50)
    (proj / "train.py").write_text("import os\nprint(os.path.getsize('data/train.bin'))\n")
    growth = []
    for i in range(10):
        before = _disk_usage(phx_home) if phx_home.exists() else 0
        proc = phalanx("run", "train.py", cwd=proj, check=True)
        assert proc.stdout.strip() == str(50 * 1024 * 1024)  # the data is read in place
        growth.append(_disk_usage(phx_home) - before)
        if i == 0:
            assert "left out 1 large file(s)" in proc.stderr and "data/train.bin (52.4 MB)" in proc.stderr
            assert "'!data/train.bin' to .phalanxignore" in proc.stderr
    print("PHALANX_HOME growth per run (bytes):", growth)
    assert max(growth[1:]) < 256 * 1024, growth  # well under 1 MB: no copy of the data, code stored once
    assert growth[0] < 1024 * 1024, growth


def test_a_huge_snapshot_is_refused_before_anything_starts(phx_home, tmp_path):
    (tmp_path / "train.py").write_text("print('ran')\n")
    (tmp_path / "shards").mkdir()
    for i in range(10_001):
        (tmp_path / "shards" / f"{i}.txt").write_text("")
    proc = phalanx("run", "train.py", cwd=tmp_path)
    assert proc.returncode == 2 and "too big for a code snapshot" in proc.stderr and "--no-snapshot" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "ran" not in proc.stdout
    assert not (phx_home / "jobs").exists() or not list((phx_home / "jobs").iterdir())
    assert phalanx("run", "--no-snapshot", "train.py", cwd=tmp_path, check=True).stdout.strip() == "ran"


def test_a_multi_node_jax_script_is_recognised_and_initialized(phx_home, tmp_path):
    pytest.importorskip("jax")
    (tmp_path / "j.py").write_text(
        "import jax\nfrom jax.experimental import multihost_utils\nimport numpy as np\n"
        "print('sum', int(multihost_utils.process_allgather(np.int32(jax.process_index() + 1)).sum()))\n")
    proc = phalanx("run", "-n", "2x1", "j.py", cwd=tmp_path, check=True)
    assert "phalanx: framework: jax, inferred from j.py (it imports jax)" in proc.stderr
    assert proc.stdout.count("sum 3") == 2
