"""A pod, read: its status as a node's state, its end as a node's ``result.json``, and its log
stream (``pod.py``'s frames) as the node's files in the local job directory. Pure apart from
``Frames`` writing files.

Field shapes are the API reference's (``PodStatus``, ``ContainerStatus``, ``PodCondition``):
https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#PodStatus .
What each signal means (the pod lifecycle and disruption pages,
https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/ and
https://kubernetes.io/docs/concepts/workloads/pods/disruptions/#pod-disruption-conditions):

- ``PodScheduled=False``, reason ``Unschedulable``: no node fits (the scheduler's message says
  why, e.g. ``Insufficient nvidia.com/gpu``): QUEUED, not running;
- a container waiting with ``ErrImagePull``/``ImagePullBackOff``/``InvalidImageName``: the
  image cannot be had, and the Job would wait forever (it does not fail on its own:
  kubernetes/kubernetes#66756): failed, naming the image;
- ``CreateContainerConfigError`` & co: the pod's configuration is wrong: failed;
- the fetch init container ended non-zero: the code bundle could not be fetched: failed,
  with its message;
- the node container ended: its exit code, its reason (``OOMKilled``), its termination
  message (the node's result, written by ``pod.py``);
- condition ``DisruptionTarget=True`` or reason ``Evicted``/``Preempting``: the pod was taken
  (preemption, eviction, node drain): the node stopped by SIGTERM, which the supervisor
  records as a preemption and retries within ``--max-retries``.
"""

from __future__ import annotations

import base64
import io
import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

from ...launch.frames import Receiver
from .manifests import COMPLETION_INDEX

QUEUED, STARTING, RUNNING, ENDED, FAILED_START = "queued", "starting", "running", "ended", "failed_start"
IMAGE_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"}
CONFIG_REASONS = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "ContainerCannotRun"}
TAKEN_REASONS = {"Evicted", "Preempting", "Shutdown", "NodeShutdown", "Terminated", "DeadlineExceeded"}


@dataclass
class PodView:
    """What a pod's status says about its node, now."""

    state: str  # QUEUED STARTING RUNNING ENDED FAILED_START
    message: str = ""
    exit_code: int | None = None
    reason: str = ""  # the container's (OOMKilled, Error, ...) or the pod's (Evicted)
    finished: float | None = None
    termination: str = ""  # the container's termination message
    taken: str = ""  # why the pod was taken (DisruptionTarget), if it was
    taken_at: float | None = None  # when (to the second, as the API server dates conditions)
    taken_exact: bool = False  # taken_at is the pod's own clock, not a condition's second
    extra: dict[str, Any] = field(default_factory=dict)


def parse_time(text: str | None) -> float | None:
    """An API timestamp (RFC 3339, ``...Z``) as epoch seconds; None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)


def taken_reason(pod: Mapping[str, Any]) -> tuple[str, float | None]:
    """Why the pod was taken from its node (preempted, evicted, drained), or '', and when."""
    status = pod.get("status") or {}
    disruption = _condition(status, "DisruptionTarget")
    if disruption and disruption.get("status") == "True":
        why = f"{disruption.get('reason', 'DisruptionTarget')}: {disruption.get('message', '')}".rstrip(": ")
        return why, parse_time(disruption.get("lastTransitionTime")) or time.time()
    if status.get("reason") in TAKEN_REASONS - {"DeadlineExceeded"}:
        return f"{status['reason']}: {status.get('message', '')}".rstrip(": "), time.time()
    return "", None


def view(pod: Mapping[str, Any], container: str) -> PodView:
    """The node's state from its pod."""
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    taken, taken_at = taken_reason(pod)
    main = next((c for c in status.get("containerStatuses") or [] if c.get("name") == container), None)
    for init in status.get("initContainerStatuses") or []:
        term = (init.get("state") or {}).get("terminated") or (init.get("lastState") or {}).get("terminated")
        if term and term.get("exitCode", 0) != 0 and not taken:
            text = (term.get("message") or "").strip()
            return PodView(FAILED_START, f"fetching the code failed (init container {init.get('name')} exited "
                           f"{term.get('exitCode')}): {text.splitlines()[-1] if text else term.get('reason', '')}",
                           reason=str(term.get("reason", "")), termination=text)
        problem = _waiting_problem(init, spec)
        if problem:
            return problem
    if main is not None:
        problem = _waiting_problem(main, spec)
        if problem:
            return problem
        term = (main.get("state") or {}).get("terminated")
        if main.get("restartCount", 0) and (main.get("lastState") or {}).get("terminated"):
            term = main["lastState"]["terminated"]  # restarted in place (OnFailure): its first end counts
        if term:
            return PodView(ENDED, exit_code=int(term.get("exitCode", 1)), reason=str(term.get("reason", "")),
                           finished=parse_time(term.get("finishedAt")), termination=str(term.get("message") or ""), taken=taken,
                           taken_at=taken_at)
        if (main.get("state") or {}).get("running"):
            return PodView(RUNNING, taken=taken, taken_at=taken_at)
    phase = status.get("phase", "Pending")
    if phase in ("Failed", "Succeeded"):  # ended without a container status (evicted before it ran)
        return PodView(ENDED, exit_code=0 if phase == "Succeeded" else 137, reason=str(status.get("reason", phase)),
                       message=str(status.get("message", "")), taken=taken, taken_at=taken_at)
    scheduled = _condition(status, "PodScheduled")
    if scheduled and scheduled.get("status") == "False":
        return PodView(QUEUED, f"{scheduled.get('reason', 'Unschedulable')}: {scheduled.get('message', '')}".rstrip(": "))
    if not spec.get("nodeName"):
        return PodView(QUEUED, "waiting for the scheduler")
    return PodView(STARTING, "starting (pulling the image, fetching the code)", taken=taken, taken_at=taken_at)


def _waiting_problem(status: Mapping[str, Any], spec: Mapping[str, Any]) -> PodView | None:
    waiting = (status.get("state") or {}).get("waiting") or {}
    reason = str(waiting.get("reason", ""))
    if reason in IMAGE_REASONS:
        image = status.get("image") or next((c.get("image") for c in [*(spec.get("initContainers") or []),
                                              *(spec.get("containers") or [])] if c.get("name") == status.get("name")), "?")
        return PodView(FAILED_START, f"cannot pull the image '{image}' ({reason}): {waiting.get('message', '')}".rstrip(": "),
                       reason=reason, extra={"image": image})
    if reason in CONFIG_REASONS:
        return PodView(FAILED_START, f"container {status.get('name')} cannot start ({reason}): {waiting.get('message', '')}",
                       reason=reason)
    return None


def node_rank_of(pod: Mapping[str, Any], kind: str) -> int | None:
    """The node a pod runs, as its controller numbered it (completion index, or replica)."""
    meta = pod.get("metadata") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    if kind == "pytorchjob":
        index = labels.get("training.kubeflow.org/replica-index")
        role = labels.get("training.kubeflow.org/replica-type", "")
        if index is None or not str(index).isdigit():
            return None
        return 0 if role.lower() == "master" else int(index) + 1
    index = labels.get(COMPLETION_INDEX, notes.get(COMPLETION_INDEX))
    return int(index) if index is not None and str(index).isdigit() else None


def memory_limit(pod: Mapping[str, Any], container: str) -> str | None:
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == container:
            return ((c.get("resources") or {}).get("limits") or {}).get("memory")
    return None


def result_from(v: PodView, pod: Mapping[str, Any] | None, container: str, node_rank: int, ranks: list[int],
                stopped_by: str | None = None) -> dict[str, Any]:
    """The node's result.json when the node itself left none (or only in its termination
    message): what the pod's status says about how it ended."""
    name = (pod or {}).get("metadata", {}).get("name", "?")
    now = v.finished or time.time()
    # Said here in the node's place (``NodeResult.synthesized``), except its own termination message.
    base: dict[str, Any] = {"node_rank": node_rank, "host": name, "failures": [], "finished": now, "k8s_pod": name,
                            "synthesized": True}
    if v.termination.startswith("{"):
        try:
            told = json.loads(v.termination)
            if isinstance(told, dict) and "exitcode" in told:
                return {**base, "synthesized": False, **told, "k8s_pod": name, "k8s_reason": v.reason}
        except ValueError:
            pass
    if v.taken:
        return {**base, "exitcode": 143, "stopped_by": "SIGTERM", "k8s_taken": v.taken,
                "error": f"pod {name} was taken from its node ({v.taken})"}
    if stopped_by:
        code = 137 if stopped_by == "SIGKILL" else 143
        return {**base, "exitcode": code, "stopped_by": stopped_by, "error": f"pod {name} was deleted by phalanx ({stopped_by})"}
    first = ranks[0] if ranks else node_rank
    if v.state == FAILED_START:
        return {**base, "exitcode": 1, "error": v.message,
                "failures": [{"rank": first, "exitcode": 1, "signal": None, "timestamp": now, "message": v.message}]}
    code = v.exit_code if v.exit_code is not None else 1
    if v.reason == "OOMKilled":
        limit = memory_limit(pod or {}, container)
        message = (f"node {node_rank} (pod {name}) was OOM-killed" + (f" (limit {limit})" if limit else "")
                   + ": Kubernetes ended its container (OOMKilled); every rank on it died")
        failures = [{"rank": r, "exitcode": 137, "signal": "SIGKILL", "timestamp": now, "message": message} for r in ranks]
        return {**base, "exitcode": 137, "failures": failures[:1] or [{"rank": first, "exitcode": 137, "signal": "SIGKILL",
                "timestamp": now, "message": message}], "error": message, "k8s_reason": "OOMKilled"}
    message = f"pod {name} ended {v.reason or 'with exit code'} {code}".replace("  ", " ")
    tail = v.termination.strip().splitlines()[-1:] if v.termination else []
    if tail:
        message += f": {tail[0]}"
    failures = [] if code == 0 else [{"rank": first, "exitcode": code, "signal": None, "timestamp": now, "message": message}]
    return {**base, "exitcode": code, "failures": failures, **({"error": message} if code else {})}


def as_casualty(result: dict[str, Any], taken_node: int, why: str, taken_at: float, slack: float = 1.0) -> dict[str, Any]:
    """``result`` of a node whose ranks failed only after another node was taken from the
    cluster (its peers vanished mid-collective, or the script stopped with them): a consequence
    of the preemption, not a failure of its own. Failures from before that stay failures."""
    failures = result.get("failures") or []
    if not failures or any(float(f.get("timestamp") or 0) < taken_at - slack for f in failures):
        return result  # ``slack``: the API server dates conditions to the second (none for a pod's own time)
    return {**result, "failures": [], "stopped_by": result.get("stopped_by") or "SIGTERM", "k8s_failures_after_taken": failures,
            "k8s_casualty": f"node {taken_node} was taken first ({why})"}


class Frames:
    """One pod's log stream applied to the local job directory (attempt files and the output
    and state trees). A stream read again from its start (a reconnect) adds nothing twice:
    appended bytes are placed by their offset. Not thread-safe: one reader per pod."""

    def __init__(self, attempt_dir: Path, trees: Mapping[str, Path], tag: str) -> None:
        self.attempt_dir = attempt_dir
        self.receiver = Receiver(attempt_dir, dict(trees), tag=tag)
        self.have: dict[str, int] = {}
        self.exit: int | None = None
        self.stop: tuple[str, float] | None = None  # the signal the pod was told to stop with, and when
        self.other: list[str] = []  # lines that are no frames (the entry's own errors): the last few
        self.frames = 0

    def feed(self, line: bytes) -> None:
        try:
            frame = json.loads(line)
        except ValueError:
            frame = None
        if not isinstance(frame, dict):
            text = line.decode(errors="replace").rstrip("\n")
            if text:
                self.other = [*self.other[-19:], text]
            return
        self.frames += 1
        if "exit" in frame:
            self.exit = int(frame["exit"])
            return
        if "signal" in frame:  # pod.py: the pod was told to stop (its own frame, before its end)
            self.stop = (str(frame["signal"]), float(frame.get("at") or time.time()))
            return
        carries = "t" in frame or "d" in frame
        data = frame.pop("t").encode() if "t" in frame else base64.b64decode(frame.pop("d", "") or "")
        if "r" not in frame and "o" in frame and isinstance(frame.get("f"), str):
            have = self._size(frame["f"])
            offset = int(frame["o"])
            if offset + len(data) <= have:
                return  # had it: a stream read again
            if offset < have:
                data, offset = data[have - offset:], have
            frame["o"] = have  # a gap (the kubelet rotated the log away) is closed up, not zero-filled
            self.have[frame["f"]] = have + len(data)
        try:
            self.receiver.apply({**frame, "b": len(data)} if carries else frame, io.BytesIO(data))
        except (OSError, ValueError, KeyError, TypeError, EOFError):
            pass  # a full disk or a bad frame: the mirror goes on

    def _size(self, rel: str) -> int:
        if rel not in self.have:
            try:
                self.have[rel] = (self.attempt_dir / rel).stat().st_size
            except OSError:
                self.have[rel] = 0
        return self.have[rel]

    def close(self) -> None:
        self.receiver.close()
