"""Job files that explode, and where a job file comes from (issue 26), through the real ``phalanx``.

A job file is read with bounds (``jobfile/read.py``, docs/limits.md): an alias bomb, a merge-key
bomb, an alias inside its own value, 50,000 nested brackets, nesting built from aliases and a
file past the size limit are each refused in one line, exit 2, before anything is expanded or
recorded. ``-f -`` reads standard input; ``-f DIR`` says it is a directory; a pipe
(``-f <(...)``) is read as a file whose relative paths start in the current directory.
(How long the refusals take is measured in the report of the change, not asserted here.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = "import os, sys\nprint('args', sys.argv[1:], 'A=' + os.environ.get('A', ''))\n"


def bomb(levels: int = 9, width: int = 9) -> str:
    """The billion laughs in ``args:``: each level a list of ``width`` aliases of the one before."""
    anchors = ['&a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    anchors += [f"&a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return f"script: t.py\nargs: [{', '.join(anchors)}]\n"


def merge_bomb(levels: int = 9) -> str:
    """The same through merge keys (``<<:``), which PyYAML copies pair by pair."""
    maps = ["&m0 {" + ", ".join(f"k{i}: v" for i in range(9)) + "}"]
    maps += [f"&m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 9)}]}}" for i in range(1, levels)]
    return f"script: t.py\nargs: [{', '.join(maps)}]\n"


def deep_by_aliases() -> str:
    """Each anchor 20 levels deep, holding the one before: 100 levels once expanded."""
    lists = ["&d0 " + "[" * 20 + "x" + "]" * 20]
    lists += [f"&d{i} " + "[" * 19 + f"*d{i - 1}" + "]" * 19 for i in range(1, 5)]
    return f"script: t.py\nargs: [{', '.join(lists)}]\n"


# (job file text, fragment of the one-line refusal)
REFUSED = [
    (bomb(), "job.yaml:2: more than 100,000 values once its aliases (*name) are expanded; a job file holds settings"),
    (merge_bomb(), "more than 100,000 values once its aliases (*name) are expanded"),
    ("script: t.py\nargs: &a [x, *a]\n", "job.yaml:2: an alias (*name) is used inside the value it names"),
    ("script: t.py\nargs: " + "[" * 50_000 + "]" * 50_000 + "\n", "job.yaml:2:39: nested more than 32 levels deep"),
    ("script: t.py\nenv:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 40)) + "  " * 40 + "v\n",
     "nested more than 32 levels deep"),
    (deep_by_aliases(), "nested more than 32 levels deep"),
    ("script: t.py\nargs: [" + ", ".join(["x"] * 100_001) + "]\n", "more than 100,000 values"),
    ("script: t.py\n#" + "x" * (1 << 20) + "\n", "job file 'job.yaml' is larger than 1 MiB"),
]


def phalanx(*args: str, cwd: Path, stdin: bytes = b"", pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "PHALANX_HOME": str(cwd / "home"), "PHALANX_WARM": "0",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run([sys.executable, "-m", "phalanx", *args], cwd=cwd, env=env, input=stdin, capture_output=True,
                          timeout=120, pass_fds=pass_fds)


def refused(proc: subprocess.CompletedProcess) -> str:
    err = proc.stderr.decode()
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in err and len(lines) == 1, (proc.returncode, err[-2000:])
    assert lines[0].startswith("phalanx: error: "), lines
    return lines[0]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "t.py").write_text(SCRIPT)
    return tmp_path


@pytest.mark.parametrize("text, fragment", REFUSED, ids=["alias bomb", "merge bomb", "alias in itself", "50,000 brackets",
                                                         "40 levels of keys", "depth by aliases", "100,001 values",
                                                         "over 1 MiB"])
def test_job_files_that_explode_are_refused_in_one_line(project: Path, text: str, fragment: str) -> None:
    (project / "job.yaml").write_text(text)
    line = refused(phalanx("run", "-f", "job.yaml", cwd=project))
    assert fragment in line, line
    assert not (project / "home" / "jobs").exists() or not any((project / "home" / "jobs").iterdir()), "nothing recorded"


def test_anchors_and_merges_within_the_bounds_keep_working(project: Path) -> None:
    (project / "job.yaml").write_text("script: t.py\nenv: &env {A: '1'}\nargs: [&lr --lr, '0.1', *lr, '0.2']\n"
                                      "tags: {<<: *env, B: '2'}\n")
    proc = phalanx("run", "-f", "job.yaml", cwd=project)
    assert proc.returncode == 0 and b"args ['--lr', '0.1', '--lr', '0.2'] A=1" in proc.stdout, proc.stderr.decode()


def test_job_file_from_standard_input(project: Path) -> None:
    proc = phalanx("run", "-f", "-", "--name", "piped", cwd=project, stdin=b"script: t.py\nargs: [--from, stdin]\n")
    assert proc.returncode == 0 and b"args ['--from', 'stdin'] A=" in proc.stdout, proc.stderr.decode()
    line = refused(phalanx("run", "-f", "-", cwd=project, stdin=b"script: t.py\ngrace: soon\n"))
    assert "<stdin>:2: grace: expected a number of seconds" in line, line
    line = refused(phalanx("run", "-f", "-", cwd=project, stdin=bomb().encode()))
    assert "<stdin>:2: more than 100,000 values" in line, line


def test_job_file_that_is_a_directory_or_a_pipe(project: Path) -> None:
    (project / "jobs").mkdir()
    line = refused(phalanx("run", "-f", "jobs", cwd=project))
    assert "job file 'jobs' is a directory" in line and "-f jobs/job.yaml" in line, line
    line = refused(phalanx("run", "-f", "nope.yaml", cwd=project))
    assert "job file 'nope.yaml' not found" in line, line
    read, write = os.pipe()  # what `-f <(envsubst < job.yaml)` hands over: /dev/fd/N, a pipe
    os.write(write, b"script: t.py\nargs: [--from, a-pipe]\n")
    os.close(write)
    try:
        proc = phalanx("run", "-f", f"/dev/fd/{read}", cwd=project, pass_fds=(read,))
    finally:
        os.close(read)
    assert proc.returncode == 0 and b"args ['--from', 'a-pipe'] A=" in proc.stdout, proc.stderr.decode()
