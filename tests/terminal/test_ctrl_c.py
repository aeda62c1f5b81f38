"""Ctrl-C typed at a real pseudo-terminal, compared with python and torchrun in the same test.

Python delivers one SIGINT: the script's ``except KeyboardInterrupt:`` checkpoints, and the exit
status is the script's. phalanx must do the same (one process and ``-n 2``), record the job by
what the script did, and escalate on a second Ctrl-C (SIGTERM, then SIGKILL) leaving nothing
running. torchrun passes one SIGINT too but then exits 1 with its own traceback whatever the
scripts did: there phalanx compares what the scripts saw and left, and gives their status."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import alive, command, last_job
from .term import Tty

READY_2 = r"ready 0 [\s\S]*ready 1 |ready 1 [\s\S]*ready 0 "

# mode of scripts/interrupt.py -> (exit status, job state, lines the script printed)
ONE_PROCESS = [
    ("exit0", 0, "SUCCEEDED", ["interrupted -", "saved -"]),
    ("raise", 130, "CANCELLED", ["interrupted -", "saved -", "KeyboardInterrupt"]),
    ("exit3", 3, "CANCELLED", ["interrupted -", "saved -"]),
]


def _interrupted(argv: list[str], cwd, env, ready: str = "ready") -> Tty:
    term = Tty(argv, str(cwd), env)
    term.expect(ready, timeout=120)
    term.interrupt()
    return term


def _script_lines(text: str) -> list[str]:
    """What the script printed, without phalanx's own lines, rank prefixes and traceback frames."""
    text = re.sub(r"ready \S+ pid=\d+", "", text.replace("^C", ""))  # the echoed ^C may share its line
    lines = [re.sub(r"^\[\d+\] ", "", line) for line in text.splitlines()]
    return [line for line in lines if line.strip() and not line.startswith(("phalanx: ", "  ", "Traceback"))
            and not re.match(r"^[WIE]\d{4} ", line)]


@pytest.mark.parametrize("mode,code,state,lines", ONE_PROCESS, ids=[c[0] for c in ONE_PROCESS])
def test_ctrl_c_in_one_process_is_pythons(project, env, mode, code, state, lines):
    seen = {}
    for how in ("python", "phalanx"):
        term = _interrupted(command(how, "interrupt.py", mode), project, env)
        status = term.wait()
        seen[how] = (status, _script_lines(term.text()), (project / "ckpt_-.txt").read_text())
        (project / "ckpt_-.txt").unlink()
    assert seen["python"] == seen["phalanx"] == (code, lines, "sigints=1\n"), seen
    job = last_job(env)
    assert (job.state.value, job.exit_code) == (state, code)
    attempts = [json.loads(line) for line in job.paths.attempts_log.read_text().splitlines()]
    assert attempts[-1]["message"].startswith("interrupted (Ctrl-C)") and not attempts[-1]["retry"]


@pytest.mark.parametrize("mode,code", [("exit0", 0), ("raise", 130)])
def test_ctrl_c_with_two_ranks_reaches_each_once_as_under_torchrun(project, env, mode, code):
    left = {}
    for how in ("torchrun", "phalanx-n2"):
        term = _interrupted(command(how, "interrupt.py", mode), project, env, READY_2)
        status = term.wait()
        left[how] = sorted(p.name + ":" + p.read_text() for p in project.glob("ckpt_*.txt"))
        lines = _script_lines(term.text())
        for rank in (0, 1):
            if how == "torchrun":  # its two workers share one terminal unbuffered: lines may glue
                assert all(re.search(rf"{what} {rank}(?!\d)", term.text()) for what in ("interrupted", "saved")), term.text()
            else:
                assert f"interrupted {rank}" in lines and f"saved {rank}" in lines, (how, term.text())
        for ckpt in project.glob("ckpt_*.txt"):
            ckpt.unlink()
        if how == "phalanx-n2":
            assert status == code, term.text()  # the scripts' status (torchrun's is 1, its own traceback)
    assert left["torchrun"] == left["phalanx-n2"] == ["ckpt_0.txt:sigints=1\n", "ckpt_1.txt:sigints=1\n"]
    assert last_job(env).state.value == ("SUCCEEDED" if code == 0 else "CANCELLED")


@pytest.mark.parametrize("framework,mode,code", [("torch", "exit0", 0), ("tf", "exit0", 0), ("torch", "raise", 130)])
def test_ctrl_c_during_a_retry_on_kept_agents_is_not_retried_and_leaves_nothing(project, env, framework, mode, code):
    """Attempt 0 fails, attempt 1 runs on the kept node agent (torch's elastic agent, or the
    agent's own launcher for TF); a Ctrl-C there reaches each rank once, the status is the
    scripts', no further attempt starts although retries remain, and the agent is let go."""
    argv = command("phalanx-n2", "retry_interrupt.py", mode)
    argv[argv.index("run") + 1:argv.index("run") + 1] = ["--max-retries", "3", "--framework", framework]
    term = _interrupted(argv, project, env, READY_2)
    ranks = [int(pid) for pid in re.findall(rb"pid=(\d+)", term.seen)]
    assert term.wait() == code, term.text()
    lines = _script_lines(term.text())
    assert all(f"interrupted {r}" in lines and f"saved {r}" in lines for r in (0, 1)), term.text()
    assert sorted(p.read_text() for p in project.glob("ckpt_*.txt")) == ["sigints=1\n"] * 2
    job = last_job(env)
    assert job.state.value == ("SUCCEEDED" if code == 0 else "CANCELLED")
    attempts = [json.loads(line) for line in job.paths.attempts_log.read_text().splitlines()]
    assert [a["retry"] for a in attempts] == [True, False], attempts
    assert attempts[-1]["message"].startswith("interrupted (Ctrl-C)"), attempts
    agent = {json.loads((job.paths.root / f"attempt_{k}" / "node_0" / "result.json").read_text())["agent_pid"]
             for k in (0, 1)}
    assert len(agent) == 1, "attempt 1 ran on attempt 0's agent"
    assert ranks and not any(alive(pid) for pid in [*ranks, *agent]), "no agent or rank outlives phalanx"


@pytest.mark.parametrize("how,ready", [("phalanx", "ready"), ("phalanx-n2", READY_2)])
def test_ctrl_c_again_escalates_to_sigterm_then_sigkill_leaving_nothing(project, env, how, ready):
    term = _interrupted(command(how, "interrupt.py", "stubborn"), project, env, ready)
    pids = [int(pid) for pid in re.findall(rb"pid=(\d+)", term.seen)]
    term.expect("ignoring")
    term.interrupt()
    term.expect("SIGTERM sent to every rank; SIGKILL in")
    term.interrupt()
    term.expect("SIGKILL sent to every rank")
    assert term.wait() == 137, term.text()
    assert pids and not any(alive(pid) for pid in pids), "no rank outlives phalanx"
    assert last_job(env).state.value == "CANCELLED"


def test_the_example_checkpoints_on_ctrl_c(env, tmp_path):
    """examples/train_ddp.py at a terminal: Ctrl-C, every rank finishes its step, rank 0
    checkpoints into the state directory, the scripts exit 130 and so does phalanx. (SIGTERM,
    the other half, and resuming from the checkpoint are tests/local/test_survival.py's.)"""
    from .conftest import SCRIPTS

    example = SCRIPTS.parent.parent.parent / "examples" / "train_ddp.py"
    argv = command("phalanx-n2", str(example), "--epochs", "50", "--sleep", "0.1")
    argv[argv.index("run") + 1:argv.index("run") + 1] = ["--name", "ctrlc", "--grace", "20"]
    term = _interrupted(argv, tmp_path, env, r"epoch=1 step=2 ")
    term.expect(r"stopping: checkpoint saved at step=\d+", timeout=60)
    assert term.wait() == 130, term.text()
    job = last_job(env)
    assert (job.state.value, job.exit_code) == ("CANCELLED", 130)
    assert (Path(env["PHALANX_HOME"]) / "state" / "ctrlc" / "checkpoint.pt").stat().st_size > 0
