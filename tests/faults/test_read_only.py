"""Read-only home (issue 17): a populated PHALANX_HOME seen through a read-only bind mount.
ps, status and logs work; commands that must write fail with one line and the right hint."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import phalanx

from .conftest import needs_root

pytestmark = needs_root


def test_reads_work_and_writes_say_read_only(read_only: tuple[Path, Path], tmp_path: Path) -> None:
    home, view = read_only
    code = tmp_path / "code"
    code.mkdir()
    (code / "hello.py").write_text("print('hello from the job')\nraise SystemExit(3)\n")
    env = {"PHALANX_HOME": str(home), "OMP_NUM_THREADS": "1"}
    assert phalanx("run", "hello.py", cwd=code, env=env).returncode == 3
    job_id = phalanx("ps", "--all", "-q", env=env, check=True).stdout.split()[0]

    ro = {"PHALANX_HOME": str(view), "OMP_NUM_THREADS": "1"}
    listing = phalanx("ps", "--all", env=ro)
    assert listing.returncode == 0 and job_id in listing.stdout and "FAILED" in listing.stdout, listing.stderr
    status = phalanx("status", job_id, env=ro)
    assert status.returncode == 0 and "FAILED" in status.stdout, status.stderr
    logs = phalanx("logs", job_id, env=ro)
    assert logs.returncode == 0 and "hello from the job" in logs.stdout, logs.stderr

    for args in (["run", "hello.py"], ["run", "--detach", "hello.py"], ["resume", job_id], ["rm", job_id]):
        refused = phalanx(*args, cwd=code, env=ro)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, (args, refused.stderr)
        errors = [line for line in lines if line.startswith("phalanx: error:")]
        assert len(errors) == 1, (args, refused.stderr)
        assert "read-only" in errors[0] and "PHALANX_HOME to a writable directory" in errors[0], errors[0]
        assert "move the file aside" not in errors[0]
    # nothing changed underneath
    assert phalanx("ps", "--all", "-q", env=env, check=True).stdout.split() == [job_id]
