"""Supervisors in their own session: a detached job's (``python -m phalanx.supervise JOB_ID``)
and a detached sweep's runner (``python -m phalanx.sweeps.runner SWEEP_ID``). They survive the
terminal and the CLI process that started them."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from ..backends import commands
from ..core.paths import HomePaths, read_json
from ..core.plan import Plan
from ..store import JobRecord, open_store


def spawn(module_args: list[str], log_path: Path, cwd: str) -> dict[str, Any]:
    """Start ``python -m MODULE ARGS`` in its own session; returns its identity (the store
    columns ``liveness`` checks). Non-blocking."""
    import psutil

    proc = commands.spawn([sys.executable, "-m", *module_args], {}, log_path, cwd=cwd)
    try:
        started = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess:
        started = time.time()
    return {"supervisor_pid": proc.pid, "supervisor_started": started}


def spawn_supervisor(record: JobRecord, cwd: str) -> dict[str, Any]:
    return spawn(["phalanx.supervise", record.id], record.paths.supervisor_log, cwd)


def main(argv: list[str] | None = None) -> None:
    """``python -m phalanx.supervise JOB_ID``: supervise a recorded job to its end."""
    from .. import config
    from .job import supervise

    args = sys.argv[1:] if argv is None else argv
    home = HomePaths(config.home())
    store = open_store(home.db)
    record = store.get(args[0])
    plan = Plan.from_dict(read_json(record.paths.plan))

    def say(text: str) -> None:
        print(f"phalanx: {text}", flush=True)

    code = supervise(store, home, record, plan, events=say)
    sys.stdout.flush()
    os._exit(code & 0xFF)
