"""Whether a failed attempt runs again: pure, given the job's retry settings and its output."""

from __future__ import annotations

import re
from typing import Callable

from ..core.contracts import OutcomeKind
from ..core.spec import JobSpec
from .outcome import Outcome


def should_retry(spec: JobSpec, outcome: Outcome, retries: int, output: Callable[[], str]) -> tuple[bool, str]:
    """(retry?, why). ``output`` gives the end of every rank's log; asked only when a
    ``--no-retry-on`` pattern has to be matched."""
    # A preemption the supervisor outlived (SLURM's) is requeued like a failure is retried.
    requeue = outcome.kind is OutcomeKind.PREEMPTED and bool((outcome.cause or {}).get("requeue"))
    if outcome.kind is OutcomeKind.DIVERGED:
        if spec.on_nan != "retry":
            return False, "diverged (--on-nan retry would roll back and run again)"
        if retries >= spec.max_retries:
            return False, f"no retries left ({retries}/{spec.max_retries} used)"
        return True, "diverged: rolling back"
    if outcome.kind not in (OutcomeKind.FAILED, OutcomeKind.STALLED) and not requeue:
        return False, outcome.kind.value
    if (outcome.cause or {}).get("output_closed"):
        return False, "its output's reader went away"
    if retries >= spec.max_retries:
        return False, f"no retries left ({retries}/{spec.max_retries} used)"
    if requeue:
        return True, "preempted; requeued"
    if spec.retry_on_exit_codes and outcome.exit_code not in spec.retry_on_exit_codes:
        return False, f"exit code {outcome.exit_code} is not in --retry-on-exit-codes"
    if spec.no_retry_on:
        text = output()
        for pattern in spec.no_retry_on:
            if re.search(pattern, text):
                return False, f"the output matches --no-retry-on '{pattern}'"
    return True, "retryable"
