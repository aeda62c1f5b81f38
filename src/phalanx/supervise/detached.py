"""Supervisors in their own session: a detached job's (``python -m phalanx.supervise JOB_ID``)
and a detached sweep's runner (``python -m phalanx.sweeps.runner SWEEP_ID``). They survive the
terminal and the CLI process that started them. A job's supervisor process runs
``__main__.py``."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from typing import Any

from ..backends import commands
from ..store import JobRecord


def spawn(module_args: list[str], log_path: Path, cwd: str) -> dict[str, Any]:
    """Start ``python -m MODULE ARGS`` in its own session; returns its identity (the store
    columns ``liveness`` checks). Non-blocking."""
    import psutil

    proc = commands.spawn([sys.executable, "-m", *module_args], {}, log_path, cwd=cwd)
    try:
        started = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess:
        started = time.time()
    return {"supervisor_pid": proc.pid, "supervisor_started": started, "supervisor_host": socket.gethostname()}


def spawn_supervisor(record: JobRecord, cwd: str) -> dict[str, Any]:
    return spawn(["phalanx.supervise", record.id], record.paths.supervisor_log, cwd)
