"""The one seam through which phalanx starts external processes.

Tests replace ``spawn`` (long-running processes) and ``run`` (short commands such as
``sbatch``, ``squeue``, ``scancel``) to observe or fake what would run; everything else calls them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Mapping, Sequence


def spawn(argv: Sequence[str], env: Mapping[str, str], log: Path, cwd: str | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (so terminal signals reach only the supervisor),
    stdin closed, stdout+stderr appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(argv),
            env={**os.environ, **env},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run(argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run a short command to completion; its exit status, stdout and stderr (text) are the
    caller's to judge. Blocking, at most ``timeout`` seconds. A missing program or a timeout
    comes back as exit status 127 or 124 with the reason in stderr, never as an exception."""
    try:
        return subprocess.run(
            list(argv), env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout,
        )
    except FileNotFoundError as exc:
        return subprocess.CompletedProcess(list(argv), 127, "", f"{argv[0]}: command not found ({exc.strerror})")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"{argv[0]}: no answer within {timeout:g}s")
