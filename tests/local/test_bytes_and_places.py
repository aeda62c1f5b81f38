"""Bytes that are not UTF-8, places that are gone (issue 26), through the real ``phalanx``.

- A project holding names that are not UTF-8 (``data-\\xff\\xfe.bin``, a package directory
  ``lib-\\xff``) and arguments that are not (``caf\\xe9.txt``): the job runs as ``python
  train.py`` does, the frozen code is served from the snapshot under those names, the script's
  ``sys.argv`` holds the exact bytes on the first attempt, a retry, a resume and every sweep
  trial, and ``ps``, ``status``, ``artifacts`` and the dashboard's JSON show them (``$'caf\\xe9.txt'``)
  without a traceback, under a strict UTF-8 locale (``PYTHONIOENCODING=utf-8:strict``: what a
  terminal under ``en_US.UTF-8`` gives python).
- The current directory deleted under the shell, ``PHALANX_HOME`` naming a file, and ``cd /``
  before ``phalanx run /abs/train.py``: one line each, naming the problem and the way out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.local

ARG = os.fsdecode(b"caf\xe9.txt")  # what python's sys.argv holds for these bytes
DATA = os.fsdecode(b"data-\xff\xfe.bin")
LIB = os.fsdecode(b"lib-\xff")
OUT = os.fsdecode(b"out-\xfe.txt")
STRICT = {"PYTHONIOENCODING": "utf-8:strict", "PHALANX_WARM": "0"}  # a UTF-8 terminal; cold: a plain tree

SCRIPT = r"""
import os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
lib = os.path.join(here, os.fsdecode(b"lib-\xff"))
sys.path.insert(0, lib)
while not os.path.exists("go"):  # the test edits the code meanwhile: what runs is what was submitted
    time.sleep(0.05)
print("argv", " ".join(os.fsencode(a).hex() for a in sys.argv[1:]), flush=True)
if os.path.isdir(lib):
    import helper
    print("helper", helper.VALUE, helper.__file__ == os.path.join(lib, "helper.py"), flush=True)
    print("data", open(os.fsdecode(b"data-\xff\xfe.bin"), "rb").read().decode(), flush=True)
    with open(os.path.join(os.environ.get("PHALANX_OUTPUT_DIR", "."), os.fsdecode(b"out-\xfe.txt")), "w") as fh:
        fh.write("hi")
sys.exit(3 if os.environ.get("PHALANX_ATTEMPT") == "0" and "--fail-once" in sys.argv else 0)
"""


def environment(home: Path) -> dict[str, str]:
    """The CLI's environment: this checkout's phalanx (whatever is installed), a strict locale."""
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **STRICT, "PHALANX_HOME": str(home), "PYTHONPATH": path}


def cli(*args: str, cwd: Path, home: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """``phalanx ARGS`` in ``cwd``; args and output as python reads them (surrogates for bytes)."""
    return subprocess.run([sys.executable, "-m", "phalanx", *args], cwd=cwd, env=environment(home), capture_output=True,
                          timeout=timeout, check=False)


def ok(proc: subprocess.CompletedProcess) -> str:
    out, err = proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")  # strict: phalanx writes UTF-8 text
    assert proc.returncode == 0 and "Traceback" not in err, (proc.args, out, err)
    return out


def hexes(*words: str) -> str:
    return " ".join(os.fsencode(w).hex() for w in words)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project of plain names: only the arguments are not UTF-8."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(SCRIPT)
    return proj


@pytest.fixture
def odd_project(project: Path) -> Path:
    """A project holding names that are not UTF-8: a data file, a directory of modules."""
    (project / LIB).mkdir()
    (project / LIB / "helper.py").write_text("VALUE = 'submitted'\n")
    (project / DATA).write_bytes(b"payload")
    return project


def wait_for(predicate, what: str, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def log(home: Path, job: str, attempt: int = 0) -> str:
    return (home / "jobs" / job / f"attempt_{attempt}" / "rank_0" / "output.log").read_text()


def dashboard(home: Path, monkeypatch):
    testclient = pytest.importorskip("starlette.testclient")
    from phalanx.web.app import create_app

    monkeypatch.setenv("PHALANX_HOME", str(home))
    return testclient.TestClient(create_app(), base_url="http://127.0.0.1:8000")


SHOWN = "$'caf\\xe9.txt'"  # bash's quoting: pasted into a shell, it gives the bytes back


def test_arguments_that_are_not_utf8(project: Path, tmp_path: Path, monkeypatch) -> None:
    home, go = tmp_path / "home", project / "go"
    go.touch()
    reference = subprocess.run([sys.executable, "train.py", ARG, "--fail-once"], cwd=project, capture_output=True,
                               env={**os.environ, **STRICT}).stdout.decode()
    assert f"argv {hexes(ARG, '--fail-once')}\n" == reference  # what python gives the script

    # detached, retried: the first attempt exits 3, the second succeeds
    job = ok(cli("run", "-d", "--max-retries", "1", "train.py", ARG, "--fail-once", cwd=project, home=home)).strip()
    waited = cli("wait", job, cwd=project, home=home)
    assert b"SUCCEEDED" in waited.stderr, ok(waited)
    assert log(home, job, 0) == log(home, job, 1) == reference

    assert SHOWN in ok(cli("ps", "--all", cwd=project, home=home))
    assert SHOWN in ok(cli("status", job, cwd=project, home=home))
    status = json.loads(ok(cli("status", job, "--json", cwd=project, home=home)))
    assert status["command"].endswith(f"train.py {SHOWN} --fail-once")

    # resumed: stopped while it waits, then resumed
    go.unlink()
    stopped = ok(cli("run", "-d", "--grace", "1", "train.py", ARG, cwd=project, home=home)).strip()
    wait_for(lambda: (home / "jobs" / stopped / "attempt_0" / "rank_0" / "proc.json").exists(), "the job to start")
    ok(cli("stop", stopped, cwd=project, home=home))
    go.touch()
    assert f"argv {hexes(ARG)}\n" in ok(cli("resume", "--attach", stopped, cwd=project, home=home))

    # a sweep's trials
    ok(cli("run", "train.py", ARG, "--lr", "[1, 2]", cwd=project, home=home))
    trials = [p.read_text() for p in home.glob("jobs/*/attempt_0/rank_0/output.log")]
    for value in ("1", "2"):
        assert trials.count(f"argv {hexes(ARG, '--lr', value)}\n") == 1, trials

    web = dashboard(home, monkeypatch)
    assert any(r["command_short"] == f"train.py {SHOWN} --fail-once" for r in web.get("/api/jobs").json())
    assert web.get(f"/api/jobs/{job}").json()["command"].endswith(f"{SHOWN} --fail-once")


def test_names_that_are_not_utf8(odd_project: Path, tmp_path: Path, monkeypatch) -> None:
    project, home, go = odd_project, tmp_path / "home", odd_project / "go"
    job = ok(cli("run", "-d", "train.py", cwd=project, home=home)).strip()
    code = home / "jobs" / job / "code"
    assert {os.fsencode(DATA), os.fsencode(LIB), b"train.py"} <= set(os.listdir(os.fsencode(code)))
    assert (code / LIB / "helper.py").read_text() == "VALUE = 'submitted'\n"
    (project / LIB / "helper.py").write_text("VALUE = 'edited after submit'\n")
    go.touch()
    waited = cli("wait", job, cwd=project, home=home)
    assert b"SUCCEEDED" in waited.stderr, ok(waited)
    # the module in lib-\xff came from the snapshot (the hook served it), under its own file name
    assert log(home, job) == "argv \nhelper submitted True\ndata payload\n"
    assert "out-\\xfe.txt" in ok(cli("artifacts", job, cwd=project, home=home))

    # a git work tree (its names listed by git), and a script whose own name is not UTF-8
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", "."], cwd=project, check=True)
        subprocess.run(["git", "add", "-A"], cwd=project, check=True)
    odd = os.fsdecode(b"tr\xffain.py")
    shutil.copy(project / "train.py", project / odd)
    assert "helper edited after submit True\n" in ok(cli("run", odd, cwd=project, home=home))
    if shutil.which("git"):
        assert json.loads((home / "jobs" / ok(cli("ps", "-q", "--all", "--limit", "1", cwd=project, home=home)).strip()
                           / "code.json").read_text())["mode"] == "git"
    listing = ok(cli("ps", "--all", cwd=project, home=home))
    assert "tr\\xffain " in listing and "$'tr\\xffain.py'" in listing, listing

    web = dashboard(home, monkeypatch)
    files = web.get(f"/api/jobs/{job}/artifacts").json()["files"]
    assert [f["path"] for f in files] == ["out-\\xfe.txt"]
    got = web.get(f"/api/jobs/{job}/artifacts/file", params={"path": files[0]["path"], "download": "1"})
    assert got.status_code == 200 and got.content == b"hi"


def one_line(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    err = proc.stderr.decode("utf-8", "replace")
    lines = err.strip().splitlines()
    assert proc.returncode == code and "Traceback" not in err and len(lines) == 1, (proc.returncode, err)
    assert lines[0].startswith("phalanx: error: "), lines
    return lines[0]


def test_working_directory_deleted_under_the_shell(project: Path, tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.run(["bash", "-c", 'cd "$1" && rmdir "$1" && exec "$2" -m phalanx run "$3"', "-", str(gone),
                           sys.executable, str(project / "train.py")], env=environment(tmp_path / "home"),
                          capture_output=True, timeout=120)
    line = one_line(proc)
    assert "the working directory no longer exists" in line and "cd to an existing directory" in line, line
    assert not (tmp_path / "home" / "jobs").exists(), "nothing recorded"


def test_home_that_is_a_file(project: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("my notes\n")
    for home, says in ((blocker, f"PHALANX_HOME {blocker} is a file, not a directory"),
                       (blocker / "home", f"PHALANX_HOME {blocker / 'home'} cannot be created: {blocker} is a file")):
        for args in (["run", "train.py"], ["ps"]):
            line = one_line(cli(*args, cwd=project, home=home))
            assert says in line and "set PHALANX_HOME to a directory" in line, line
    assert blocker.read_text() == "my notes\n", "the file is left as it was"


def test_snapshot_from_the_root_names_the_script_directory(odd_project: Path, tmp_path: Path) -> None:
    project = odd_project
    home = tmp_path / "home"
    go = project / "go"
    go.touch()
    line = one_line(cli("run", str(project / "train.py"), cwd=Path("/"), home=home))
    assert "/ is too big for a code snapshot" in line, line
    assert f"the script's directory {project}, not /, can be the project" in line, line
    assert f"(cd {project}) or add --workdir {project}" in line and ".phalanxignore" not in line, line
    # and what it suggests works, from / still
    out = ok(cli("run", "--workdir", str(project), str(project / "train.py"), cwd=Path("/"), home=home))
    assert "helper submitted True" in out
