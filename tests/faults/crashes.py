"""SIGKILL at random instants of a job's life (submit, start, retry, stop, finish), and the
invariants that must hold after each (issue 17, "Crash consistency"). Shared by
``tests/faults/test_crash.py`` (a few dozen rounds) and ``bench/crash_loop.py`` (many)."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil

# Fails its first attempt (a retry), then runs a moment and succeeds.
JOB = """
import os, sys, time
time.sleep(0.2)
if os.environ.get("PHALANX_ATTEMPT") == "0":
    sys.exit(1)
time.sleep(0.3)
"""
MODES = ("foreground", "detached", "stop")


def round_(home: Path, code: Path, rng: random.Random, mode: str) -> str:
    """One job, killed at a random instant; returns the mode. Leaves its processes to be checked."""
    env = {**os.environ, "PHALANX_HOME": str(home), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "phalanx", "run", "--max-retries", "1", "job.py"]
    if mode != "foreground":
        args.insert(4, "--detach")
    cli = subprocess.Popen(args, cwd=code, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    time.sleep(rng.uniform(0.0, 1.6 if mode == "foreground" else 0.8))
    os.kill(cli.pid, signal.SIGKILL)  # the CLI (a foreground run's supervisor), wherever it is
    cli.wait()
    if mode != "foreground":  # then the detached supervisor, at another instant
        if mode == "stop":
            for row in rows(home):
                subprocess.run([sys.executable, "-m", "phalanx", "stop", row[0]], env=env, capture_output=True, timeout=60)
        time.sleep(rng.uniform(0.0, 1.0))
        for _, _, pid, _ in rows(home):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    return mode


def rows(home: Path) -> list[tuple[str, str, int | None, float]]:
    if not (home / "phalanx.db").exists():
        return []
    with sqlite3.connect(home / "phalanx.db", timeout=30) as db:
        try:
            return list(db.execute("SELECT id, state, supervisor_pid, created_at FROM jobs"))
        except sqlite3.OperationalError:  # no table yet: the first CLI died before migrating
            return []


def job_processes(ids: set[str]) -> list[int]:
    """Processes (any we started) whose environment names one of these jobs."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("PHALANX_JOB_ID") in ids and proc.status() != psutil.STATUS_ZOMBIE:
            found.append(proc.pid)
    return found


def violations(home: Path, settle: float = 5.0) -> list[str]:
    """What breaks the invariants now (an empty list when they hold)."""
    from phalanx.core.state import JobState, is_terminal
    from phalanx.store import Store
    from phalanx.supervise.liveness import START_GRACE, is_lost

    bad: list[str] = []
    store = Store(home / "phalanx.db") if (home / "phalanx.db").exists() else None
    records = store.list(trials=True) if store is not None else []
    ids = {r.id for r in records}
    deadline = time.monotonic() + settle  # PDEATHSIG takes agents and ranks down within moments
    while job_processes(ids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in job_processes(ids):
        bad.append(f"orphan process {pid} of a job whose supervisor was killed")
        os.kill(pid, signal.SIGKILL)
    for r in records:
        # no job RUNNING forever: every non-final one shows LOST (a detached job that never got a
        # supervisor: once START_GRACE has passed)
        if not is_terminal(r.state) and not is_lost(r, now=r.created_at + START_GRACE + 1):
            bad.append(f"job {r.id} {r.state.value} with no supervisor, not shown LOST")
        if r.state is JobState.RUNNING and r.supervisor_pid is None:
            bad.append(f"job {r.id} RUNNING without a supervisor identity")
    dirs = set(os.listdir(home / "jobs")) if (home / "jobs").exists() else set()
    bad += [f"job directory {d} without a store row" for d in dirs - ids]
    bad += [f"row {i} without a job directory" for i in ids - dirs]
    for path in (home / "jobs").rglob("*.json") if dirs else []:
        if path.name.startswith("."):
            continue  # a temp file, never read
        try:
            json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            bad.append(f"partially written {path}")
    for path in (home / "jobs").rglob("attempts.jsonl") if dirs else []:
        from phalanx.core.contracts import read_attempts

        try:
            read_attempts(path)
        except Exception as exc:  # noqa: BLE001
            bad.append(f"unreadable {path}: {exc}")
    return bad
