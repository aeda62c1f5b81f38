"""Job states and the transitions between them.

::

    PENDING --> RUNNING --> SUCCEEDED
       |           |------> FAILED
       |           |------> STOPPING --> CANCELLED
       |           '------> LOST        (the supervisor vanished; found by reconcile)
       '------------------> CANCELLED / FAILED (never started)

Terminal states never change again (``is_terminal``).
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    LOST = "LOST"


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST})

_ALLOWED = {
    JobState.PENDING: {JobState.RUNNING, JobState.STOPPING, JobState.FAILED, JobState.CANCELLED, JobState.LOST},
    JobState.RUNNING: {JobState.STOPPING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST},
    JobState.STOPPING: {JobState.CANCELLED, JobState.FAILED, JobState.SUCCEEDED, JobState.LOST},
}


def is_terminal(state: JobState) -> bool:
    return state in TERMINAL


def can_transition(old: JobState, new: JobState) -> bool:
    return new in _ALLOWED.get(old, set())


def sources_of(new: JobState) -> list[JobState]:
    """The states from which ``new`` can be reached."""
    return [old for old, targets in _ALLOWED.items() if new in targets]
