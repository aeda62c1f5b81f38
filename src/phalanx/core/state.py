"""Job states and the transitions between them.

::

    PENDING --> RUNNING --> SUCCEEDED
       |           |------> FAILED        (retries exhausted or the failure is not retryable)
       |           |------> PREEMPTED     (the launcher was told to go: SIGTERM/SIGUSR1 from outside)
       |           |------> STOPPING --> CANCELLED   (phalanx stop, Ctrl-C)
       |           |------> PRUNED        (a sweep stopped a hopeless trial early)
       |           |------> TIMEOUT       (--max-duration reached, or idle for --idle-timeout)
       |           '------> LOST          (the supervisor vanished: shown by reads, recorded by resume/stop)
       |------------------> CANCELLED / FAILED (never started)
       '--> QUEUED --> RUNNING            (admission: over its project's quota until capacity frees)
              '------> CANCELLED / FAILED / LOST (stopped while queued; its project deleted)

    FAILED / CANCELLED / PREEMPTED / TIMEOUT / LOST --(phalanx resume)--> PENDING

A QUEUED job waits for its project's quota (``supervise/admission.py``): no process of it runs,
and no supervisor needs to (a detached one exits and a new one is started when the queue
admits the job). Job-level retries happen inside RUNNING (the attempt number grows). The supervisor never
leaves a terminal state; only ``resume`` reopens a job (``can_resume``).
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    PENDING = "PENDING"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"
    PRUNED = "PRUNED"
    TIMEOUT = "TIMEOUT"
    LOST = "LOST"


TERMINAL = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED, JobState.PRUNED, JobState.TIMEOUT,
     JobState.LOST}
)
RESUMABLE = frozenset({JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED, JobState.TIMEOUT, JobState.LOST})

_ENDS = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED, JobState.PRUNED, JobState.TIMEOUT,
         JobState.LOST}
_ALLOWED = {
    JobState.PENDING: {JobState.RUNNING, JobState.STOPPING, JobState.QUEUED} | _ENDS,
    JobState.QUEUED: {JobState.RUNNING, JobState.CANCELLED, JobState.FAILED, JobState.LOST},
    JobState.RUNNING: {JobState.STOPPING} | _ENDS,
    JobState.STOPPING: {JobState.CANCELLED, JobState.FAILED, JobState.SUCCEEDED, JobState.LOST},
}


def is_terminal(state: JobState) -> bool:
    return state in TERMINAL


def can_resume(state: JobState) -> bool:
    return state in RESUMABLE


def can_transition(old: JobState, new: JobState) -> bool:
    return new in _ALLOWED.get(old, set())


def sources_of(new: JobState) -> list[JobState]:
    """The states from which ``new`` can be reached."""
    return [old for old, targets in _ALLOWED.items() if new in targets]


# The supervisor pid of a job whose supervisor runs on another machine (a Kubernetes supervisor
# pod, ``--in-cluster``): not this machine's to judge (``supervise/liveness.py``). No process has
# it (Linux's pid_max is at most 2**22), so nothing can signal it by mistake.
SUPERVISOR_ELSEWHERE = 2**31 - 1
