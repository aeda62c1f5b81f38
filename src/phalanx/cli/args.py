"""Checks for the arguments of the commands other than ``run`` (whose options come from the
option table): a job reference that can match something, durations that are numbers."""

from __future__ import annotations

import math
from typing import Optional

import typer

from ..errors import UsageError


def job_ref(value: str) -> str:
    """``JOB``: an id, an id prefix or a name; empty text would match every id as a prefix."""
    if not value.strip():
        raise UsageError(f"a job id, id prefix or name is needed, got {value!r}", "list jobs with: phalanx ps --all")
    return value


def _flag(param: typer.CallbackParam) -> str:
    return next((o for o in param.opts if o.startswith("--")), param.name or "value")


def seconds(param: typer.CallbackParam, value: Optional[float]) -> Optional[float]:
    """A finite, non-negative number of seconds (``nan`` and ``inf`` mean nothing here)."""
    if value is not None and (not math.isfinite(value) or value < 0):
        raise UsageError(f"invalid {_flag(param)} {value}", "use a finite number of seconds of at least 0, e.g. 30")
    return value


def positive_seconds(param: typer.CallbackParam, value: Optional[float]) -> Optional[float]:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise UsageError(f"invalid {_flag(param)} {value}", "use a finite number of seconds above 0, e.g. 2")
    return value


def count(param: typer.CallbackParam, value: Optional[int]) -> Optional[int]:
    if value is not None and value < 0:
        raise UsageError(f"invalid {_flag(param)} {value}", "use 0 or more")
    return value


PROJECT_HELP = "Only this project's jobs and sweeps (one you are in)."


def project_scope(value: Optional[str]) -> Optional[str]:
    """``--project NAME``: what the command shows and finds is that project's (``cli/face.narrow``)."""
    from .face import narrow

    return narrow(value)
