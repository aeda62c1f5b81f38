"""A FAKE kubelet that plays recorded pod lifecycles without running anything.

Each pod plays the lifecycle ``choose(pod)`` names. Statuses are what a real kubelet reports
(API reference ``PodStatus``/``ContainerStatus``; texts as ``kubectl get pod -o yaml`` shows them),
and the node container's log holds what ``phalanx.backends.kubernetes.pod`` would print: one
JSON frame per line (the node's files), then ``{"exit": code}``; its termination message is the
node's result. The in-pod half itself runs for real in ``podsim.py``.

Lifecycles: ``succeed``; ``fail`` (rank raised ValueError); ``oom`` (container OOMKilled, 137,
nothing reported); ``preempt`` (DisruptionTarget PreemptionByScheduler, SIGTERM, the node
reports it was stopped); ``evict`` (the kubelet evicts under memory pressure: DisruptionTarget
TerminationByKubelet, phase Failed, reason Evicted, container killed); ``pull`` (ErrImagePull,
then ImagePullBackOff forever); ``fetch`` (the code fetch init container fails, 403);
``run`` (runs until deleted: then SIGTERM and the node reports it was stopped); ``sigbus`` (a rank
killed by SIGBUS, which points at the node).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .fakecluster import Cluster, container_status, node_of, terminated
from .fakeapi import now

STEP = 0.3  # seconds between the steps of a lifecycle
OOM = "OOMKilled"
EVICTED = ("The node was low on resource: memory. Threshold quantity: 100Mi, available: 91388Ki. Container node was using "
           "1813692Ki, request is 0, has larger consumption of memory.")
PULL = ('rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/library/pytorh:latest": failed to '
        'resolve reference "docker.io/library/pytorh:latest": pull access denied, repository does not exist or may require '
        'authorization: server message: insufficient_scope: authorization failed')


def frame(rel: str, text: str, offset: int | None = None) -> str:
    body = {"f": rel, "w": 1} if offset is None else {"f": rel, "o": offset}
    return json.dumps({**body, "t": text}) + "\n"


@dataclass
class Play:
    name: str
    started: float = field(default_factory=time.monotonic)
    step: int = 0
    stop_grace: int | None = None
    done: bool = False


class ScriptedKubelet:
    def __init__(self) -> None:
        self.plays: dict[str, Play] = {}
        self.choose: Callable[[dict[str, Any]], str] = lambda pod: "succeed"

    def stop(self, cluster: Cluster, pod: dict[str, Any], grace: int) -> None:
        play = self.plays.get(pod["metadata"]["uid"])
        if play is None or play.done or grace == 0:
            cluster.gone(pod)
        else:
            play.stop_grace = grace

    def sync(self, cluster: Cluster, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        play = self.plays.setdefault(uid, Play(self.choose(pod)))
        if play.done:
            if pod["metadata"].get("deletionTimestamp"):
                cluster.gone(pod)
            return
        node = node_of(pod)
        image = pod["spec"]["containers"][0]["image"]
        container = pod["spec"]["containers"][0]["name"]
        if play.stop_grace is not None and play.step >= 2:
            self._end(cluster, pod, play, 143, "Error", stopped=True)
            return
        if play.stop_grace is not None:
            play.done = True
            cluster.gone(pod)
            return
        due = int((time.monotonic() - play.started) / STEP)
        while play.step <= due and not play.done:
            self._advance(cluster, pod, play, node, image, container)
            play.step += 1

    def _advance(self, cluster: Cluster, pod: dict[str, Any], play: Play, node: int, image: str, container: str) -> None:
        step, name = play.step, play.name
        fetch = pod["spec"]["initContainers"][0]["name"]
        waiting = {"waiting": {"reason": "PodInitializing"}}
        if step == 0:
            if name == "pull":
                cluster.set_status(pod, lambda s: s.update(phase="Pending", initContainerStatuses=[container_status(
                    fetch, image, {"waiting": {"reason": "ErrImagePull", "message": PULL}})],
                    containerStatuses=[container_status(container, image, waiting)]))
                cluster.store.event(pod["metadata"]["namespace"], pod, "Failed", f"Failed to pull image \"{image}\": {PULL}")
                return
            cluster.set_status(pod, lambda s: s.update(phase="Pending", startTime=now(), initContainerStatuses=[
                container_status(fetch, image, {"running": {"startedAt": now()}})],
                containerStatuses=[container_status(container, image, waiting)]))
        elif step == 1:
            if name == "pull":
                cluster.set_status(pod, lambda s: s["initContainerStatuses"][0].update(
                    state={"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}}))
                play.step = 0  # and so on, forever
                play.started = time.monotonic() + 5 * STEP
                return
            if name == "fetch":
                message = ("Traceback (most recent call last):\n  ...\nurllib.error.HTTPError: HTTP Error 403: Forbidden\n")
                cluster.set_status(pod, lambda s: s.update(phase="Failed", initContainerStatuses=[container_status(
                    fetch, image, terminated(1, "Error", message))], containerStatuses=[container_status(container, image, waiting)]))
                play.done = True
                return
            log = cluster.log(pod, container)
            log.path.write_text(frame(f"node_{node}/agent.log", "phalanx pod: node agent started\n", 0)
                                + frame(f"rank_{node}/proc.json", json.dumps({"pid": 7, "rank": node, "node_rank": node,
                                                                              "host": pod["spec"].get("hostname")}))
                                + frame(f"rank_{node}/output.log", f"rank {node} starts\nstep=1 loss=0.5\n", 0))
            log.started = True
            cluster.set_status(pod, lambda s: s.update(
                phase="Running", podIP=f"10.244.0.{10 + node}",
                initContainerStatuses=[container_status(fetch, image, terminated(0, "Completed"))],
                containerStatuses=[container_status(container, image, {"running": {"startedAt": now()}})]))
        elif step == 2 and name != "run":
            self._finish(cluster, pod, play, node, container)

    def _finish(self, cluster: Cluster, pod: dict[str, Any], play: Play, node: int, container: str) -> None:
        name = play.name
        if name == "succeed":
            self._end(cluster, pod, play, 0, "Completed", result={"exitcode": 0, "failures": []})
        elif name == "fail":
            error = {"rank": node, "node_rank": node, "exitcode": 1, "type": "ValueError", "message": "boom",
                     "traceback": "Traceback (most recent call last):\nValueError: boom\n", "timestamp": time.time()}
            self._end(cluster, pod, play, 1, "Error", result={"exitcode": 1, "failures": [
                {"rank": node, "exitcode": 1, "signal": None, "timestamp": time.time()}]},
                extra=frame(f"rank_{node}/output.log", "ValueError: boom\n", len(f"rank {node} starts\nstep=1 loss=0.5\n"))
                + frame(f"rank_{node}/error.json", json.dumps(error)))
        elif name == "oom":
            self._end(cluster, pod, play, 137, OOM, report=False)
        elif name == "sigbus":  # the rank died of SIGBUS: memory gone bad under it, the node's fault
            self._end(cluster, pod, play, 135, "Error", result={"exitcode": 135, "failures": [
                {"rank": node, "exitcode": 135, "signal": "SIGBUS", "timestamp": time.time()}]})
        elif name == "preempt":
            cluster.set_status(pod, lambda s: _disrupt(s, "PreemptionByScheduler",
                                                       "default-scheduler: preempting to accommodate a higher priority pod"))
            self._end(cluster, pod, play, 143, "Error", stopped=True)
        elif name == "evict":
            cluster.set_status(pod, lambda s: (_disrupt(s, "TerminationByKubelet", EVICTED), s.update(reason="Evicted", message=EVICTED)))
            self._end(cluster, pod, play, 137, "ContainerStatusUnknown", report=False)

    def _end(self, cluster: Cluster, pod: dict[str, Any], play: Play, code: int, reason: str, result: dict[str, Any] | None = None,
             stopped: bool = False, report: bool = True, extra: str = "") -> None:
        node = node_of(pod)
        container = pod["spec"]["containers"][0]["name"]
        image = pod["spec"]["containers"][0]["image"]
        if stopped:
            result = {"exitcode": 143, "failures": [], "stopped_by": "SIGTERM"}
        message = ""
        if report and result is not None:
            result = {"node_rank": node, "host": pod["spec"].get("hostname"), **result}
            message = json.dumps(result, sort_keys=True)
            log = cluster.log(pod, container)
            with open(log.path, "a") as fh:
                fh.write(extra + frame(f"node_{node}/result.json", message) + json.dumps({"exit": code}) + "\n")
        cluster.log(pod, container).ended = True
        phase = "Succeeded" if code == 0 else "Failed"
        cluster.set_status(pod, lambda s: s.update(phase=phase, containerStatuses=[
            container_status(container, image, terminated(code, reason, message))]))
        play.done = True
        if pod["metadata"].get("deletionTimestamp") or play.stop_grace is not None:
            cluster.gone(pod)


def _disrupt(status: dict[str, Any], reason: str, message: str) -> None:
    conditions = status.setdefault("conditions", [])
    conditions.append({"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message,
                       "lastProbeTime": None, "lastTransitionTime": now()})
