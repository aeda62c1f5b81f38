"""Secrets with real processes on this machine (docs/secrets.md): ``phalanx secret`` as a user types
it; a job's ranks get the value and every form of printing it is masked in their logs, in
``error.json`` and the root cause; a retry on the kept agents reads the value again; at a terminal
the lone process's relay and rank 0's pseudo-terminal mask too; a warm pool never holds a value."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import phalanx

pytestmark = pytest.mark.local

CANARY = "phx-canary-7Qm2vX9aLk4tB8wZ"
MASK = "********"

# Prints the secret every way a script might: whole, in two writes, in a progress bar redrawn with
# \r, on stderr, with os.write, from a child process; raises with it on attempt FAIL_ATTEMPT (after
# WAIT_FOR exists, when given).
SCRIPT = r'''
import hashlib, os, subprocess, sys, time
v = os.environ["CANARY_TOKEN"]
print("sha", hashlib.sha256(v.encode()).hexdigest(), "attempt", os.environ["PHALANX_ATTEMPT"], flush=True)
print("whole:", v, flush=True)
sys.stdout.write("split:" + v[:7]); sys.stdout.flush(); time.sleep(0.05)
sys.stdout.write(v[7:] + "\n"); sys.stdout.flush()
for i in range(1, len(v), 6):
    sys.stdout.write("\rbar " + v[:i]); sys.stdout.flush()
sys.stdout.write("\rbar " + v + " 100%\n"); sys.stdout.flush()
print("err:", v, file=sys.stderr, flush=True)
os.write(1, b"fd1:" + v.encode() + b"\n")
subprocess.run([sys.executable, "-c", "import os; print('child:', os.environ['CANARY_TOKEN'], flush=True)"], check=True)
if os.environ.get("FAIL_ATTEMPT") == os.environ["PHALANX_ATTEMPT"]:
    go = os.environ.get("WAIT_FOR")
    while go and not os.path.exists(go):
        time.sleep(0.05)
    raise ValueError("bad token " + v)
'''
FORMS = 6  # whole, split, the bar's last redraw, stderr, os.write, the child


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@pytest.fixture
def env(phx_home, tmp_path, monkeypatch) -> dict[str, str]:
    secrets = tmp_path / "config" / "secrets.json"
    monkeypatch.setenv("PHALANX_SECRETS_FILE", str(secrets))
    monkeypatch.setenv("PHALANX_SECRETS_STORE", "file")
    (tmp_path / "show.py").write_text(SCRIPT)
    return {"PHALANX_SECRETS_FILE": str(secrets)}


def _set(name: str, value: str, cwd: Path) -> None:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "phalanx", "secret", "set", name], input=value + "\n", text=True,
                          capture_output=True, cwd=cwd, timeout=60)
    assert proc.returncode == 0, proc.stderr


def _jobs() -> list[dict]:
    return json.loads(phalanx("ps", "--all", "--json", check=True).stdout)


def _masked(text: str, forms: int = FORMS) -> None:
    assert CANARY not in text, text
    assert text.count(MASK) >= forms, text


def test_secret_set_list_rm_as_typed(env, tmp_path):
    import subprocess

    _set("CANARY_TOKEN", CANARY, tmp_path)
    path = Path(env["PHALANX_SECRETS_FILE"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    listed = phalanx("secret", "list", check=True).stdout
    assert listed.splitlines()[0].split() == ["NAME", "OWNER", "KEPT", "IN", "CREATED", "UPDATED"]
    assert "CANARY_TOKEN" in listed and "file" in listed and CANARY not in listed
    rows = json.loads(phalanx("secret", "list", "--json", check=True).stdout)
    assert [r["name"] for r in rows] == ["CANARY_TOKEN"] and CANARY not in json.dumps(rows)
    replaced = subprocess.run([sys.executable, "-m", "phalanx", "secret", "set", "CANARY_TOKEN"], input="abc",
                              text=True, capture_output=True, timeout=60)
    assert replaced.returncode == 0 and "secret CANARY_TOKEN replaced in" in replaced.stdout
    assert "warning: the value of CANARY_TOKEN is 3 character(s) long" in replaced.stderr
    assert phalanx("secret", "rm", "CANARY_TOKEN", check=True).stdout == "secret CANARY_TOKEN removed\n"
    gone = phalanx("secret", "rm", "CANARY_TOKEN")
    assert gone.returncode == 2 and gone.stderr.startswith("phalanx: error: no secret 'CANARY_TOKEN' in ") and gone.stderr.count("\n") == 1
    bad = phalanx("secret", "set", "bad name")
    assert bad.returncode == 2 and "'bad name' is not a secret name" in bad.stderr and bad.stderr.count("\n") == 1
    empty = subprocess.run([sys.executable, "-m", "phalanx", "secret", "set", "X"], input="", text=True,
                           capture_output=True, timeout=60)
    assert empty.returncode == 2 and "the secret's value is empty" in empty.stderr


def test_a_missing_or_unreadable_secret_fails_the_submit_and_creates_nothing(env, tmp_path):
    for args in (["--secret", "NOPE"], ["-d", "--secret", "NOPE"], ["--dry-run", "--secret", "NOPE"], ["--secret", "1X"],
                 ["--secret", "NOPE", "--lr", "[1, 2]"]):
        proc = phalanx("run", *args, "show.py", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    _set("CANARY_TOKEN", CANARY, tmp_path)
    Path(env["PHALANX_SECRETS_FILE"]).chmod(0o640)
    proc = phalanx("run", "--secret", "CANARY_TOKEN", "show.py", cwd=tmp_path)
    assert proc.returncode == 2 and "is open to other users (mode 640); phalanx will not read secrets from it" in proc.stderr
    assert _jobs() == [], "nothing was created"


def test_two_ranks_a_failure_and_a_retry_on_the_kept_agents(env, tmp_path):
    """-n 2 (torchrun on a kept agent): attempt 0 raises with the value in its message, after the
    test changed the secret; attempt 1 runs on the same agent and gets the new value (read again
    at its start, sent over the control line). Nothing holds either value; every form is masked."""
    _set("CANARY_TOKEN", CANARY, tmp_path)
    go = tmp_path / "go"
    job_id = phalanx("run", "-d", "-n", "2", "--max-retries", "1", "--secret", "CANARY_TOKEN", "-e", "FAIL_ATTEMPT=0",
                     "-e", f"WAIT_FOR={go}", "show.py", cwd=tmp_path, check=True).stdout.strip()
    job_dir = Path(json.loads(phalanx("status", job_id, "--json", check=True).stdout)["job_dir"])
    rank1 = job_dir / "attempt_0" / "rank_1" / "output.log"
    deadline = time.monotonic() + 120
    while not (rank1.exists() and "child:" in rank1.read_text()):
        assert time.monotonic() < deadline, "attempt 0 to print"
        time.sleep(0.1)
    rotated = CANARY[::-1] + "-2"
    _set("CANARY_TOKEN", rotated, tmp_path)
    go.write_text("")
    assert phalanx("wait", job_id, timeout=240).returncode == 0
    status = json.loads(phalanx("status", job_id, "--json", check=True).stdout)
    assert status["state"] == "SUCCEEDED", status
    assert [a["outcome"] for a in status["attempts"]] == ["failed", "succeeded"]
    for attempt, value in ((0, CANARY), (1, rotated)):
        for rank in (0, 1):
            log = (job_dir / f"attempt_{attempt}" / f"rank_{rank}" / "output.log").read_text()
            assert f"sha {sha(value)} attempt {attempt}" in log, log
            assert value not in log and CANARY not in log
            assert log.count(MASK) >= FORMS, log
    error = json.loads((job_dir / "attempt_0" / "rank_0" / "error.json").read_text())
    assert error["message"] == f"bad token {MASK}" and CANARY not in error["traceback"] and MASK in error["traceback"]
    cause = status["attempts"][0]["root_cause"] if status["attempts"][0].get("root_cause") else None
    blob = json.dumps(status) + (json.dumps(cause) if cause else "")
    assert CANARY not in blob and rotated not in blob
    logs = phalanx("logs", job_id, "--attempt", "0", check=True).stdout + phalanx("logs", job_id, check=True).stdout
    assert CANARY not in logs and rotated not in logs and MASK in logs
    _nowhere(Path(os.environ["PHALANX_HOME"]), CANARY.encode(), rotated.encode())


def test_a_lone_foreground_process_is_masked_on_the_stream_and_in_its_log(env, tmp_path):
    """``phalanx run`` in the foreground, its output a pipe: the relay phalanx lends the process
    masks what it copies to phalanx's stdout and stderr and into the log."""
    _set("CANARY_TOKEN", CANARY, tmp_path)
    proc = phalanx("run", "--secret", "CANARY_TOKEN", "-e", "FAIL_ATTEMPT=0", "show.py", cwd=tmp_path)
    assert proc.returncode == 1
    _masked(proc.stdout + proc.stderr, FORMS + 2)  # + the traceback and phalanx's line naming the root cause
    assert f"sha {sha(CANARY)} attempt 0" in proc.stdout
    assert f"ValueError: bad token {MASK}" in proc.stderr
    job = _jobs()[0]
    _masked((Path(job["job_dir"]) / "attempt_0" / "rank_0" / "output.log").read_text(), FORMS + 1)
    dry = phalanx("run", "--dry-run", "--secret", "CANARY_TOKEN", "show.py", cwd=tmp_path, check=True).stdout
    assert "  CANARY_TOKEN=<secret>\n" in dry and CANARY not in dry
    _nowhere(Path(os.environ["PHALANX_HOME"]), CANARY.encode())


def test_at_a_terminal_warm_the_relay_and_rank_0s_terminal_mask_and_the_pool_holds_nothing(env, tmp_path):
    """At a terminal, with warm starts: a lone process (lent the terminal: pseudo-terminals relayed
    by phalanx) and -n 2 (rank 0 writes to a pseudo-terminal its bootstrap relays), both forked
    from a warm pool after a first run started it. The terminal shows masks, the logs hold masks,
    and the pool's own environment (/proc) and log hold no value."""
    import subprocess

    from phalanx.launch.warm import plan as warm
    from tests.conftest import stop_pools
    from tests.differential import pools as warm_pools
    from tests.terminal.term import Tty

    _set("CANARY_TOKEN", CANARY, tmp_path)
    pools = Path(tempfile.mkdtemp(prefix="phx-w-"))  # short: a socket's path has at most 107 bytes
    base = {**os.environ, "PHALANX_WARM": "1", "PHALANX_WARM_DIR": str(pools), "TERM": "xterm"}
    try:
        for args in (["show.py"], ["-n", "2", "show.py"]):  # the first warm runs start the pools, and run cold
            primed = subprocess.run([sys.executable, "-m", "phalanx", "run", "-q", "--secret", "CANARY_TOKEN", *args],
                                    cwd=tmp_path, env=base, stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
            assert primed.returncode == 0, primed.stderr
        warm_pools.settle(str(pools))
        served, cold = warm_pools.served(str(pools)), warm_pools.cold_starts(str(pools))
        for args in (["show.py"], ["-n", "2", "show.py"]):
            tty = Tty([sys.executable, "-m", "phalanx", "run", "-q", "--secret", "CANARY_TOKEN", *args], str(tmp_path), base)
            code = tty.wait(240)
            seen = tty.seen.decode(errors="replace")
            assert code == 0, seen
            _masked(seen, FORMS * (2 if "-n" in args else 1))
            assert seen.count(f"sha {sha(CANARY)}") == (2 if "-n" in args else 1), seen
        assert warm_pools.served(str(pools)) > served and warm_pools.cold_starts(str(pools)) == cold, "forked warm"
        for pool in warm.pools(str(pools)):
            assert CANARY.encode() not in Path(f"/proc/{pool['pid']}/environ").read_bytes()
        for path in pools.iterdir():
            if path.is_file():
                assert CANARY.encode() not in path.read_bytes(), path
        for job in _jobs():
            for log in Path(job["job_dir"]).glob("attempt_0/rank_*/output.log"):
                _masked(log.read_text())
    finally:
        stop_pools(warm, str(pools))
        shutil.rmtree(pools, ignore_errors=True)
    _nowhere(Path(os.environ["PHALANX_HOME"]), CANARY.encode())


def _nowhere(home: Path, *values: bytes) -> None:
    """No file under ``home`` holds a value, nor does the store once dumped as SQL."""
    for path in home.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert not any(v in data for v in values), path
    con = sqlite3.connect(home / "phalanx.db")
    try:
        dump = "\n".join(con.iterdump()).encode()
    finally:
        con.close()
    assert not any(v in dump for v in values)
