"""The one seam through which phalanx starts external processes.

Tests replace ``spawn`` to observe what would run; everything else calls it.
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
