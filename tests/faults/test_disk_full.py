"""Disk full (issue 17): a job that fills a small tmpfs PHALANX_HOME ends FAILED saying what could
not be written where; reads keep working; a run that cannot start leaves nothing behind and
says how much space it needed."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from tests.conftest import phalanx

from .conftest import needs_root

pytestmark = needs_root

FILL = """
import os
out = os.environ["PHALANX_OUTPUT_DIR"]
print("start", flush=True)
try:
    with open(os.path.join(out, "big.bin"), "wb") as f:
        while True:
            f.write(b"x" * 65536)
except OSError as e:
    print("script saw", e.errno, flush=True)
for i in range(5000):  # its log cannot take this: the disk is full
    print("line", i, "y" * 200, flush=True)
"""


def _rows(home: Path) -> list[tuple[str, str]]:
    """The store's rows, read as phalanx reads them (a full disk may not let a plain
    connection create its -shm)."""
    with sqlite3.connect(f"{(home / 'phalanx.db').as_uri()}?immutable=1", uri=True) as db:
        return sorted(db.execute("SELECT id, state FROM jobs"))


def _env(home: Path) -> dict[str, str]:
    return {"PHALANX_HOME": str(home), "OMP_NUM_THREADS": "1"}


def _job_dirs(home: Path) -> set[str]:
    return set(os.listdir(home / "jobs")) if (home / "jobs").exists() else set()


def test_job_filling_the_disk_ends_failed_and_reads_work(tmpfs: Path, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "fill.py").write_text(FILL)
    for topology in ([], ["-n", "2"]):  # a lone process (the console relay) and a node agent
        for leftover in (tmpfs / "jobs").glob("*/output/big.bin"):
            leftover.unlink()  # room for the next job's files
        before = _job_dirs(tmpfs)
        run = phalanx("run", *topology, "fill.py", cwd=code, env=_env(tmpfs), timeout=120)
        assert run.returncode == 1, run.stderr
        # phalanx's own lines say it (the script's traceback, printed as its output fails, is its own)
        assert any(line.startswith("phalanx: disk full while writing") for line in run.stderr.splitlines()), run.stderr
        (job_id,) = _job_dirs(tmpfs) - before
        rows = dict(_rows(tmpfs))
        assert rows[job_id] == "FAILED"  # not RUNNING, not LOST: its end was recorded
        status = phalanx("status", job_id, "--json", env=_env(tmpfs))
        assert status.returncode == 0, status.stderr
        cause = json.loads(status.stdout)["root_cause"]["message"]
        assert cause.startswith("disk full while writing ") and f"under {tmpfs}/jobs/{job_id}/" in cause, cause
        assert "disk full while writing" in run.stderr
        # the disk is still full: reads work and write nothing
        db_stat = (tmpfs / "phalanx.db").stat()
        listing = phalanx("ps", "--all", env=_env(tmpfs))
        assert listing.returncode == 0 and job_id in listing.stdout, listing.stderr
        assert phalanx("logs", job_id, env=_env(tmpfs)).returncode == 0
        assert (tmpfs / "phalanx.db").stat().st_mtime == db_stat.st_mtime
        assert not (tmpfs / "jobs" / job_id / ".reserve").exists()  # given back
        assert not list((tmpfs / "staging").iterdir())


def test_run_that_cannot_start_leaves_nothing(tmpfs: Path, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "ok.py").write_text("print('hi')\n")
    first = phalanx("run", "ok.py", cwd=code, env=_env(tmpfs), timeout=120)
    assert first.returncode == 0, first.stderr
    # fill the disk to all but a little
    with open(tmpfs / "ballast", "wb", buffering=0) as fh:  # unbuffered: nothing left to flush at close
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    rows_before, dirs_before = _rows(tmpfs), _job_dirs(tmpfs)
    for extra in ([], ["--detach"]):
        run = phalanx("run", *extra, "ok.py", cwd=code, env=_env(tmpfs), timeout=120)
        assert run.returncode == 1
        errors = [line for line in run.stderr.splitlines() if line.startswith("phalanx: error:")]
        assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
        assert "disk full while writing" in errors[0] and "needs about" in errors[0] and "free" in errors[0], errors[0]
        assert _rows(tmpfs) == rows_before and _job_dirs(tmpfs) == dirs_before
        assert not (tmpfs / "staging").exists() or not list((tmpfs / "staging").iterdir())
    # space freed: a run works again
    (tmpfs / "ballast").unlink()
    again = phalanx("run", "ok.py", cwd=code, env=_env(tmpfs), timeout=120)
    assert again.returncode == 0, again.stderr
