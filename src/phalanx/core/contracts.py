"""The files that cross process and machine boundaries, as typed, versioned models.

Every such file has one model here, written by one function and read by one function (both
here), so a field cannot be spelled two ways by two writers, and a file that does not match
its model is refused on read with an error naming the file and the field:

=============================  ================  ===========================================  ==========================================
file (``core/paths.py``)       model             written by                                   read by
=============================  ================  ===========================================  ==========================================
``node_<n>/launch.json``       ``LaunchFile``    supervise (before ``Backend.start``; the     ``launch/agent``; ``supervise/leftover``
                                                 ssh remote end places the same content)      rebuilds an attempt's plan from it
``node_<n>/result.json``       ``NodeResult``    ``launch/agent``; a ``NodeHandle`` when      supervise (outcome), ``query`` (status),
                                                 the node never reported (synthesized)        the web timeline
``rank_<r>/error.json``        ``RankError``     ``launch/bootstrap`` (in the worker)         ``launch/agent`` (dating failures),
                                                                                              ``supervise/outcome`` (root cause)
``attempts.jsonl``             ``AttemptRecord`` ``supervise/history`` (one line per ended     ``query.attempt_history`` (status, web)
                                                 attempt)
``attempt_<k>/scheduler.json`` ``SchedulerRecord`` the scheduler backend at submission        the same backend's ``attach``;
                                                 (and as it watches: ``details``)             ``query.scheduler_job`` (status)
=============================  ================  ===========================================  ==========================================

Versions: a written file carries ``"version": N``. A file without one is version 1 (what
phalanx wrote before versions existed, so old job directories still read); a newer version
than this phalanx knows is refused with "upgrade phalanx". Unknown extra keys are kept
(``NodeResult.details``) or ignored, so a newer writer's additions do not break an old reader.

The bootstrap writes ``error.json`` itself (it runs inside every worker and imports nothing of
phalanx it can avoid), with exactly ``RankError``'s fields. This module imports only the standard
library and ``core``: the node agent and the ssh remote end use it on nodes that may lack
everything else.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

from ..errors import ContractError
from .jsonfields import HINT as _HINT
from .jsonfields import VERSION, Fields as _Reader
from .jsonfields import load as _load
from .paths import write_json
from .plan import NodePlan


class OutcomeKind(str, Enum):
    """How an attempt (and so a job) ended; the values are what ``attempts.jsonl`` holds."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STALLED = "stalled"  # no output for --stall-timeout: a failure, retried like one
    CANCELLED = "cancelled"  # phalanx stop, Ctrl-C
    PREEMPTED = "preempted"  # a signal phalanx did not send: the machine was taken
    PRUNED = "pruned"  # a sweep stopped a hopeless trial early
    DIVERGED = "diverged"  # a watched metric went nan/inf or spiked (--on-nan, --on-spike): a failure
    TIMEOUT = "timeout"  # --max-duration reached, or idle for --idle-timeout
    LOST = "lost"  # the supervisor vanished: nobody saw the attempt end


class StopReason(str, Enum):
    """Why the supervisor stopped an attempt that was still running."""

    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    PRUNED = "pruned"
    DIVERGED = "diverged"  # the job's health watch saw a bad number (health/anomaly.py)
    TIMEOUT = "timeout"  # --max-duration, --idle-timeout

    @property
    def outcome(self) -> OutcomeKind:
        return OutcomeKind(self.value)


# -- node_<n>/launch.json -----------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchFile:
    """What a node agent runs: its part of the plan, and where the job lives on its machine."""

    node: NodePlan
    job_dir: str  # on the node's machine (for ssh without a shared filesystem: the remote copy)
    attempt: int
    grace: float
    sample_interval: float = 5.0  # seconds between the node's resource samples

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "node": self.node.to_dict(), "job_dir": self.job_dir, "attempt": self.attempt,
                "grace": self.grace, "sample_interval": self.sample_interval}

    @classmethod
    def from_dict(cls, data: Any, where: str = "launch.json") -> "LaunchFile":
        r = _Reader(data, where)
        node = r.mapping("node")
        try:
            plan = NodePlan.from_dict(node)
        except (KeyError, TypeError, ValueError) as exc:
            raise ContractError(f"{where}: 'node' is not a node plan ({exc!r})", _HINT) from None
        return cls(plan, r.text("job_dir"), r.whole("attempt"), r.number("grace"), r.number("sample_interval", 5.0))


def write_launch(path: Path, launch: LaunchFile) -> None:
    write_json(path, launch.to_dict())


def read_launch(path: Path) -> LaunchFile | None:
    """The launch file at ``path``; None when there is none. Raises ContractError when invalid."""
    data = _load(path)
    return None if data is None else LaunchFile.from_dict(data, str(path))


# -- rank_<r>/error.json ------------------------------------------------------------------------


@dataclass(frozen=True)
class RankError:
    """A rank's uncaught exception, recorded by the bootstrap as the rank died."""

    rank: int
    timestamp: float  # exact: when the exception reached the top of the script
    type: str
    message: str
    traceback: str
    exitcode: int = 1
    local_rank: int | None = None
    node_rank: int | None = None
    host: str | None = None
    pid: int | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "error.json") -> "RankError":
        r = _Reader(data, where)
        return cls(r.whole("rank"), r.number("timestamp"), r.text("type"), r.text("message"), r.text("traceback"),
                   r.whole("exitcode", 1), r.whole("local_rank", None), r.whole("node_rank", None), r.text("host", None),
                   r.whole("pid", None))

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "rank": self.rank, "local_rank": self.local_rank, "node_rank": self.node_rank,
                "host": self.host, "pid": self.pid, "exitcode": self.exitcode, "type": self.type,
                "message": self.message, "traceback": self.traceback, "timestamp": self.timestamp}


def read_rank_error(path: Path) -> RankError | None:
    data = _load(path)
    return None if data is None else RankError.from_dict(data, str(path))


# -- node_<n>/result.json -----------------------------------------------------------------------


@dataclass(frozen=True)
class RankFailure:
    """One rank that failed on its own, as its node agent saw it."""

    rank: int
    exitcode: int
    timestamp: float  # when it died (see ``launch/exits.died_at``)
    local_rank: int | None = None
    pid: int | None = None
    signal: str | None = None  # "SIGSEGV" when a signal ended it
    # What the platform said of it, when it saw more than the agent could (Kubernetes: the
    # container was OOM-killed at its memory limit); the rank's error.json, if any, comes first.
    message: str | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "RankFailure":
        r = _Reader(data, where)
        return cls(r.whole("rank"), r.whole("exitcode"), r.number("timestamp"), r.whole("local_rank", None),
                   r.whole("pid", None), r.text("signal", None), r.text("message", None))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"rank": self.rank, "local_rank": self.local_rank, "pid": self.pid,
                                "exitcode": self.exitcode, "signal": self.signal, "timestamp": self.timestamp}
        if self.message is not None:
            data["message"] = self.message
        return data


@dataclass(frozen=True)
class RankExit:
    """How a rank the agent started itself ended (no torchrun in between)."""

    exitcode: int
    pid: int | None = None


@dataclass(frozen=True)
class Stray:
    """A process that a rank left running when it ended, and that had to be ended with its
    attempt (``launch/strays.py``)."""

    rank: int
    pid: int
    command: str
    how: str | None = None  # how it had left the rank's process group: "setsid", "own process group"
    killed: bool = False  # it outlived SIGTERM and the grace period: SIGKILL ended it

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "Stray":
        r = _Reader(data, where)
        return cls(r.whole("rank"), r.whole("pid"), r.text("command"), r.text("how", None), r.flag("killed"))

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": self.pid, "command": self.command, "how": self.how, "killed": self.killed}


_RESULT_KEYS = {"version", "node_rank", "host", "exitcode", "failures", "terminated", "ranks", "stopped_by",
                "started", "finished", "error", "synthesized", "agent_pid", "strays"}


@dataclass(frozen=True)
class NodeResult:
    """How one node of an attempt ended. Written by its agent at the end; synthesized (and
    written in the agent's place) by the node's handle when the node ended without reporting."""

    node_rank: int | None
    exitcode: int  # 128+N when a signal N ended the node
    host: str | None = None
    failures: tuple[RankFailure, ...] = ()  # ranks that failed on their own (not the casualties)
    terminated: tuple[int, ...] = ()  # ranks torchrun stopped because a peer failed
    ranks: Mapping[int, RankExit] = field(default_factory=dict)
    stopped_by: str | None = None  # the signal that stopped the node ("SIGTERM"), when one did
    started: float | None = None
    finished: float | None = None
    error: str | None = None  # why there is no ordinary report (never started, torch missing, ...)
    synthesized: bool = False  # the node never reported; its handle wrote this in its place
    details: Mapping[str, Any] = field(default_factory=dict)  # backend-specific (slurm_job, slurm_state)
    agent_pid: int | None = None  # the node agent that ran the attempt (a kept agent runs several)
    strays: tuple[Stray, ...] = ()  # processes its ranks left running, ended with the attempt

    @classmethod
    def from_dict(cls, data: Any, where: str = "result.json") -> "NodeResult":
        r = _Reader(data, where)
        failures = tuple(RankFailure.from_dict(f, f"{where} failures[{i}]") for i, f in enumerate(r.items("failures")))
        terminated = r.items("terminated")
        if not all(isinstance(t, int) for t in terminated):
            r.fail("terminated", "a list of rank numbers", terminated)
        ranks = {}
        for rank, info in r.mapping("ranks").items():
            ri = _Reader(info, f"{where} ranks[{rank}]")
            if not str(rank).isdigit():
                r.fail("ranks", "keyed by rank number", rank)
            ranks[int(rank)] = RankExit(ri.whole("exitcode"), ri.whole("pid", None))
        return cls(r.whole("node_rank", None), r.whole("exitcode"), r.text("host", None), failures, tuple(terminated),
                   ranks, r.text("stopped_by", None), r.number("started", None), r.number("finished", None),
                   r.text("error", None), r.flag("synthesized"),
                   {k: v for k, v in r.data.items() if k not in _RESULT_KEYS}, r.whole("agent_pid", None),
                   tuple(Stray.from_dict(s, f"{where} strays[{i}]") for i, s in enumerate(r.items("strays"))))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {**self.details, "version": VERSION, "node_rank": self.node_rank, "host": self.host,
                                "exitcode": self.exitcode, "failures": [f.to_dict() for f in self.failures]}
        if self.terminated:
            data["terminated"] = list(self.terminated)
        if self.ranks:
            data["ranks"] = {str(k): {"pid": v.pid, "exitcode": v.exitcode} for k, v in sorted(self.ranks.items())}
        for key in ("stopped_by", "started", "finished", "error", "agent_pid"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        if self.synthesized:
            data["synthesized"] = True
        if self.strays:
            data["strays"] = [s.to_dict() for s in self.strays]
        return data

    @classmethod
    def synthesize(cls, node_rank: int, exitcode: int, error: str, stopped_by: str | None = None,
                   host: str | None = None, **details: Any) -> "NodeResult":
        """The result of a node that ended without reporting (killed, lost, never started)."""
        return cls(node_rank, exitcode, host, stopped_by=stopped_by, finished=time.time(), error=error,
                   synthesized=True, details=details)


def write_node_result(path: Path, result: NodeResult) -> None:
    write_json(path, result.to_dict())


def read_node_result(path: Path) -> NodeResult | None:
    data = _load(path)
    return None if data is None else NodeResult.from_dict(data, str(path))


# -- stop.json ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StopRequest:
    """A user's ``phalanx stop`` (CLI, dashboard): when it asked, and whether the grace period is
    skipped (``--now``). Written by the stop that marked the job STOPPING (or asks ``--now``)
    before it signals the supervisor; read by the supervisor on that signal and by a later stop.
    ``relay``: asked on another machine than the supervisor's (a team server's replica there), so
    nobody signals: the supervisor finds the request itself (``supervise/relay.py``)."""

    at: float
    now: bool = False
    relay: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "at": self.at, "now": self.now, "relay": self.relay}

    @classmethod
    def from_dict(cls, data: Any, where: str = "stop.json") -> "StopRequest":
        r = _Reader(data, where)
        return cls(r.number("at"), r.flag("now"), r.flag("relay"))


def write_stop_request(path: Path, request: StopRequest) -> None:
    write_json(path, request.to_dict())


def read_stop_request(path: Path) -> StopRequest | None:
    data = _load(path)
    return None if data is None else StopRequest.from_dict(data, str(path))


# -- attempts.jsonl -----------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptRecord:
    """One ended attempt: how it ended and what the supervisor decided (retry or not, why)."""

    attempt: int
    started: float
    ended: float
    outcome: OutcomeKind
    exit_code: int | None  # None when nobody saw it end (LOST)
    message: str
    retry: bool
    reason: str
    # Nodes this attempt's end pointed at (``health/checks_cause.py``), each {"node": name,
    # "why": words, "left_out": whether the next attempt leaves it out}
    left_out: tuple[Mapping[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"attempt": self.attempt, "started": self.started, "ended": self.ended, "outcome": self.outcome.value,
                "exit_code": self.exit_code, "message": self.message, "retry": self.retry, "reason": self.reason}
        if self.left_out:
            data["left_out"] = [dict(n) for n in self.left_out]
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "attempts.jsonl") -> "AttemptRecord":
        r = _Reader(data, where)
        try:
            outcome = OutcomeKind(r.text("outcome"))
        except ValueError:
            r.fail("outcome", f"one of {', '.join(o.value for o in OutcomeKind)}", data.get("outcome"))
        left = tuple(dict(n) for n in r.items("left_out") if isinstance(n, Mapping) and isinstance(n.get("node"), str))
        return cls(r.whole("attempt"), r.number("started"), r.number("ended"), outcome, r.whole("exit_code", None),
                   r.text("message", ""), r.flag("retry"), r.text("reason", ""), left)


def append_attempt(path: Path, record: AttemptRecord) -> None:
    """One line, appended in one write (readers never see half a line for long)."""
    line = json.dumps({"version": VERSION, **record.to_dict()}) + "\n"
    with open(path, "a") as fh:
        fh.write(line)


def read_attempts(path: Path) -> list[AttemptRecord]:
    """Every complete line, oldest first; a line still being written is left for later."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    lines = text.split("\n")[:-1]  # the part after the last newline is not complete yet
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise ContractError(f"{path}:{number} is not valid JSON ({exc})", _HINT) from None
        out.append(AttemptRecord.from_dict(data, f"{path}:{number}"))
    return out


# -- attempt_<k>/scheduler.json -----------------------------------------------------------------


_SCHEDULER_KEYS = {"version", "scheduler", "job_id", "submitted", "found_by", "address"}


@dataclass(frozen=True)
class SchedulerRecord:
    """A scheduler's id for an attempt, written down at submission so that a later supervisor
    can find the attempt again (``Backend.attach``), and ``status`` can name it."""

    scheduler: str  # the backend's name
    job_id: str  # the scheduler's id ("4711", a Ray submission id, a SageMaker training job name)
    submitted: float | None = None
    found_by: str | None = None  # how a later supervisor found it, when the submitter did not write it
    address: str | None = None  # where the scheduler answers (a Ray dashboard), when it is not implied
    # What the backend keeps beside the id (SageMaker: its last status and billable time; Ray:
    # the nodes its actors were placed on). The backend's own; kept as read, like NodeResult.details.
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {**self.details, "version": VERSION, "scheduler": self.scheduler, "job_id": self.job_id}
        for key in ("submitted", "found_by", "address"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "scheduler.json") -> "SchedulerRecord":
        r = _Reader(data, where)
        raw = r.data.get("job_id")
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = str(raw)
        if not isinstance(raw, str):
            r.fail("job_id", "a string", raw)
        return cls(r.text("scheduler"), raw, r.number("submitted", None), r.text("found_by", None),
                   r.text("address", None), {k: v for k, v in r.data.items() if k not in _SCHEDULER_KEYS})

    def with_details(self, **details: Any) -> "SchedulerRecord":
        """This record with ``details`` added to (or replacing) the backend's own keys."""
        return replace(self, details={**self.details, **details})


def write_scheduler(path: Path, record: SchedulerRecord) -> None:
    write_json(path, record.to_dict())


def read_scheduler(path: Path) -> SchedulerRecord | None:
    data = _load(path)
    return None if data is None else SchedulerRecord.from_dict(data, str(path))
