"""``PHALANX_TRACE=1``: when each step of a job's start and restart happened, for finding where
the time of a restart goes (``bench/bench_recovery.py`` reads it).

The supervisor and every node agent append one JSON line per step to the job's ``trace.jsonl``
(``JobPaths.trace``): ``{"t": unix time, "who": "supervisor" | "agent", "step": name, ...}``.
Appends of one short line are atomic, so the writers need no lock. Off (and free) by default;
the variable is read at each step, not at import: an agent forked from a warm pool imported this
module in the pool, whose environment is not the job's.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from ..core.paths import JobPaths

def enabled() -> bool:
    return os.environ.get("PHALANX_TRACE", "") not in ("", "0")


def mark(paths: JobPaths, who: str, step: str, **fields: Any) -> None:
    """Record that ``step`` happened now (nothing unless tracing is on)."""
    if not enabled():
        return
    line = json.dumps({"t": time.time(), "who": who, "step": step, **fields}, sort_keys=True) + "\n"
    try:
        fd = os.open(paths.trace, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:  # a trace is an aid: never let it fail a job
        pass


# torch's elastic agent says, at INFO, when it starts a rendezvous and when it starts the workers:
# the two steps of a (re)start that happen inside torch.
_TORCH_STEPS = {"[%s] Rendezvous'ing worker group": "rendezvous", "[%s] Starting worker group": "start workers"}
_TORCH_LOGGER = "torch.distributed.elastic.agent.server.api"


class _TorchSteps(logging.Handler):
    def __init__(self, paths: JobPaths, fields: dict[str, Any]) -> None:
        super().__init__(logging.INFO)
        self.paths, self.fields = paths, fields

    def emit(self, record: logging.LogRecord) -> None:
        step = _TORCH_STEPS.get(str(record.msg))
        if step is not None:
            mark(self.paths, "agent", step, **self.fields)


def follow_torch(paths: JobPaths, **fields: Any) -> logging.Handler | None:
    """Mark torch's own steps (rendezvous, starting workers) while tracing; ``unfollow`` the
    handle returned when the attempt is over. Nothing (None) when tracing is off."""
    if not enabled():
        return None
    handler = _TorchSteps(paths, fields)
    logger = logging.getLogger(_TORCH_LOGGER)
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        # The records reach the root logger too, whose last-resort handler prints only warnings.
        logger.setLevel(logging.INFO)
    return handler


def unfollow(handler: logging.Handler | None) -> None:
    if handler is not None:
        logging.getLogger(_TORCH_LOGGER).removeHandler(handler)
