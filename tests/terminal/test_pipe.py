"""A closed pipe ends the job as it ends python: ``phalanx run gen.py | head -1`` stops at once,
as ``python gen.py | head -1`` does (the script's next write fails with BrokenPipeError, exit 1),
not at the script's own end ten minutes later; and the job is recorded as python ended. ``-n 2``
streams the ranks' logs, which no rank writes into a pipe: the job is stopped, FAILED, exit 1.
Real pipes, read one line and closed as ``head -1`` closes them."""

from __future__ import annotations

import subprocess

import pytest

from .conftest import command, last_job


def _head_1(argv: list[str], cwd, env: dict[str, str], err_file) -> tuple[str, int, str]:
    """``argv | head -1``: the first line, the command's exit status (once it ends by itself,
    within two minutes), its stderr."""
    with open(err_file, "wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()
        proc.stdout.close()  # head -1 exits
        code = proc.wait(timeout=120)
        return first, code, err_file.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("how", ["python", "phalanx"])
def test_head_ends_one_process_as_it_ends_python(project, env, how, tmp_path):
    first, code, err = _head_1(command(how, "gen.py"), project, env, tmp_path / "err")
    assert first == "line 0\n"
    assert code == 1 and "BrokenPipeError: [Errno 32] Broken pipe" in err, err
    if how == "phalanx":
        job = last_job(env)
        assert (job.state.value, job.exit_code) == ("FAILED", 1)
        assert "BrokenPipeError" in job.root_cause_dict().get("type", ""), job.root_cause_dict()


def test_head_stops_a_job_of_two_ranks(project, env, tmp_path):
    first, code, err = _head_1(command("phalanx-n2", "gen.py"), project, env, tmp_path / "err")
    assert first.endswith("line 0\n"), first
    assert code == 1, err
    assert "Traceback" not in err, err  # no thread of phalanx's dies of it
    job = last_job(env)
    assert (job.state.value, job.exit_code) == ("FAILED", 1)
    assert "Broken pipe" in job.root_cause_dict()["message"]
