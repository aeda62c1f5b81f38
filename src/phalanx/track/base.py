"""What an exporter is given and what it must do.

The feed (``supervise/tracking.py``) calls one exporter from one thread, in this order::

    open(run, state)        create the job's run (with its tags), or continue the one ``state``
                            names (a retry, a resume, a restarted exporter); quick: the job's start
                            may wait for the run's id
    params(run)             the parameters, once per run
    send(points)*           in order; the feed moves its cursor only once ``send`` returned (the
                            number of points the tracker will not keep: W&B's steps only grow)
    finish(ending)          the outcome and root cause; closes the run (only at the job's end)
    artifacts(files)        with --track-artifacts, after finish
    close()                 always, last

Each may raise ``TrackerUnavailable`` (the feed waits, with backoff, and calls it again with the
same points: nothing is lost) or ``TrackerRefused`` (the feed counts the points as dropped and goes
on). ``send`` must not send a point twice when called again after a failure; a tracker that may
have stored part of a failed request must store a repeated point once (MLflow does: a metric's
key, step, timestamp and value identify it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol, Sequence

from .conventions import TrackState


class Point(NamedTuple):
    key: str  # the tracker's name for the series (``loss``, ``rank1/loss``, ``sys/cpu_percent``)
    value: float
    step: int
    time: float  # seconds since the epoch: when phalanx read it (metrics) or sampled it (sys/)


@dataclass(frozen=True)
class Parent:
    """The sweep a trial belongs to: its run is the trials' parent (MLflow) or group (W&B)."""

    sweep_id: str
    name: str
    state_file: Path  # the parent run's state (``HomePaths.sweep_track``), shared by the trials
    lock_file: Path


@dataclass(frozen=True)
class RunInfo:
    """Everything the tracker's run is created with, derived from the job's spec and files."""

    job_id: str
    name: str
    started: float
    params: dict[str, str]
    tags: dict[str, str]
    config: dict[str, str]  # the tools' settings (conventions.capture)
    workdir: str
    group: str  # the sweep id for a trial, else the job id
    parent: Parent | None = None
    script: str = ""
    git_commit: str = ""
    logdir: Path | None = None  # TensorBoard: where event files are written here
    mirror: str | None = None  # TensorBoard: the object-store URI they are copied to
    home: Path | None = None  # where the W&B exporter keeps its run directory


@dataclass(frozen=True)
class Ending:
    state: str  # the job's final state: SUCCEEDED, FAILED, CANCELLED, PREEMPTED, ...
    exit_code: int | None
    root_cause: str = ""
    ended: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)


class Exporter(Protocol):
    kind: str

    def open(self, run: RunInfo, state: TrackState) -> None:
        """Create or continue the run; fill ``state.run_id``, ``state.url``, ``state.extra``."""

    def params(self, run: RunInfo) -> None: ...

    def send(self, points: Sequence[Point]) -> int:
        """Returns how many of ``points`` the tracker will not keep (counted as dropped)."""

    def finish(self, ending: Ending) -> None: ...

    def artifacts(self, files: Sequence[tuple[Path, str]]) -> None:
        """``(local file, path in the run)`` pairs."""

    def close(self) -> None: ...
