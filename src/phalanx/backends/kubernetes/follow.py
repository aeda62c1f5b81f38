"""One attempt in the cluster, watched for its node handles.

A thread lists the attempt's pods (by label) every ``every`` seconds and keeps each node's
state, so the handles' ``poll`` and ``running`` never block. For each pod whose node container
started, a second thread follows its log (``follow=true``) and rebuilds the node's files in
the local job directory from ``pod.py``'s frames; a node's end is reported once its log has
arrived (or ``drain`` seconds after the container ended), with the node's own ``result.json``,
else its termination message, else what the pod's status says (``node.result_from``).

A node is taken (preempted, evicted, drained) when its pod shows ``DisruptionTarget``, or when
its pod says, in a frame of its own, that it got SIGTERM while phalanx had not asked (the pod
may leave the API between two listings); a node stopped or failing after another one was
taken first is that one's casualty (the Job controller deletes the rest, ``backoffLimit: 0``).

Stopping: ``signal`` deletes the pods with the pod grace period (the kubelet sends SIGTERM,
the ranks get ``--grace``, then SIGKILL); ``kill`` deletes the workload (foreground: pods
first) and every object of the attempt at once. When every node has ended, the attempt's
objects are deleted, unless it failed and ``--keep-failed`` asked to keep them.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ...core.contracts import NodeResult, read_node_result, read_scheduler, write_node_result, write_scheduler
from ...core.paths import JobPaths
from . import node as pods
from .client import ApiError, Client
from .manifests import selector
from .ref import Ref


@dataclass
class Ending:
    """A node that has ended: when (seconds since the epoch), whether its log has arrived, and
    how to report it."""

    when: float
    ready: bool
    report: Callable[[], None]


class Attempt:
    every = 1.0  # seconds between pod listings once every node's log is followed
    starting_every = 0.25  # until then: a started pod's first lines reach the user sooner
    drain = 10.0  # seconds a finished pod's log may still take to arrive

    def __init__(self, client: Client, ref: Ref, paths: JobPaths, ranks: list[list[int]], grace_seconds: int,
                 trees: dict[str, Path], pending_timeout: float | None = None, keep_failed: bool = False) -> None:
        self.client = client
        self.ref = ref
        self.paths = paths
        self.ranks = ranks  # global ranks per node
        self.grace_seconds = grace_seconds
        self.trees = trees
        self.pending_timeout = pending_timeout
        self.keep_failed = keep_failed
        self.lock = threading.RLock()
        self.codes: dict[int, NodeResult] = {}  # node rank -> its result, as poll() reports it
        self.staged: dict[int, NodeResult] = {}  # recorded, not reported yet
        self.views: dict[int, pods.PodView] = {}
        self.pods: dict[int, str] = {}  # node rank -> its pod's name
        self.frames: dict[str, pods.Frames] = {}
        self.followers: dict[str, threading.Thread] = {}
        self.ended_at: dict[int, float] = {}  # node rank -> when this watcher saw it end
        # node rank -> (signal, when): its pod was told to stop while phalanx had not asked
        # (pod.py's frame): taken by the cluster, even if its DisruptionTarget was never listed.
        self.told_to_stop: dict[int, tuple[str, float]] = {}
        self.started = time.monotonic()
        self.signalled: str | None = None
        self.failed_first = False  # a node had failed when the stop came
        self.killed = False
        self.cleaned = False
        self.queue_note = ""
        self.wake = threading.Event()
        # Started by the first question, not here: a command that only looks (status of a LOST
        # job finds its handles) must not follow logs or clean up.
        self.thread = threading.Thread(target=self._loop, name=f"k8s-{ref.name}", daemon=True)

    @property
    def nnodes(self) -> int:
        return len(self.ranks)

    # -- what the handles ask --------------------------------------------------------------

    def _watching(self) -> None:
        with self.lock:
            if not self.thread.is_alive() and not self.cleaned and self.thread.ident is None:
                path = self.paths.scheduler_job(self.ref.attempt)
                if read_scheduler(path) is None:  # attached by its labels: written down now it is watched
                    write_scheduler(path, self.ref.record(found_by="labels"))
                self.thread.start()

    def poll(self, node_rank: int) -> NodeResult | None:
        self._watching()
        with self.lock:
            return self.codes.get(node_rank)

    def running(self, node_rank: int) -> bool:
        self._watching()
        with self.lock:
            v = self.views.get(node_rank)
            return node_rank in self.codes or (v is not None and v.state in (pods.RUNNING, pods.ENDED))

    def signal(self, signum: int) -> None:
        """Once per attempt: every pod is deleted with its grace period (SIGTERM first)."""
        import signal as signals

        with self.lock:
            if self.signalled or self.killed:
                return
            self.signalled = signals.Signals(signum).name
            # A node had failed: this is the supervisor's fail-fast, not a stop (--keep-failed keeps it).
            self.failed_first = any(result.exitcode != 0 for result in self.codes.values())
            names = {n: name for n, name in self.pods.items()
                     if n not in self.codes and (self.views.get(n) or pods.PodView(pods.QUEUED)).state != pods.ENDED}
        for name in names.values():
            self._delete_pod(name, self.grace_seconds)
        self.wake.set()

    def kill(self) -> None:
        """Delete everything of the attempt at once (pods without grace). Idempotent."""
        with self.lock:
            if self.killed:
                return
            self.killed = True
            self.signalled = self.signalled or "SIGKILL"
        try:
            for pod in self.client.list("Pod", labels=selector(self.ref.job_id, self.ref.attempt)):
                self._delete_pod(pod["metadata"]["name"], 0)
        except ApiError:
            pass
        self.delete_objects(grace=0)
        with self.lock:
            for n in range(self.nnodes):
                if n not in self.codes and n not in self.staged:
                    self._record(n, pods.result_from(self.views.get(n) or pods.PodView(pods.QUEUED), None,
                                                     self.ref.container, n, self.ranks[n], stopped_by="SIGKILL"))
            self._publish()
        self.wake.set()

    def delete_objects(self, grace: int | None = None) -> None:
        """The workload (its pods first) and the objects beside it; those the workload owns
        would go with it, these calls make sure. Idempotent."""
        for kind in (self.ref.api_kind, "ConfigMap", "Secret", "Service"):
            try:
                self.client.delete(kind, self.ref.name, propagation="Foreground", grace=grace)
            except ApiError:
                pass  # gone already, or not ours to delete: nothing more can be done from here

    # -- the watching thread ---------------------------------------------------------------

    def _loop(self) -> None:
        while not self.cleaned:
            try:
                self.refresh()
            except ApiError:
                pass  # the API server is busy or away: ask again next time
            except Exception as exc:  # noqa: BLE001 - a broken watcher fails the attempt rather than hang it
                self._broken(exc)
                return
            starting = len(self.followers) + len(self.codes) < self.nnodes
            self.wake.wait(min(self.every, self.starting_every) if starting else self.every)
            self.wake.clear()

    def refresh(self) -> None:
        listed = self.client.list("Pod", labels=selector(self.ref.job_id, self.ref.attempt))
        by_rank: dict[int, dict[str, Any]] = {}
        for pod in sorted(listed, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or ""):
            rank = pods.node_rank_of(pod, self.ref.kind)
            if rank is not None and 0 <= rank < self.nnodes:
                by_rank[rank] = pod  # the newest pod of each index
        waiting = self._workload_waiting() if len(by_rank) < self.nnodes and not self.killed else ""
        endings: list[Ending] = []
        for n in range(self.nnodes):
            if n not in self.codes:
                ending = self._refresh_node(n, by_rank.get(n), waiting)
                if ending is not None:
                    endings.append(ending)
        # Nodes are reported in the order they ended (to the second, as the kubelet dates ends):
        # the first failure must reach the supervisor first, or a node that the Job controller
        # stopped because of it (backoffLimit 0) would look taken, not a casualty.
        first_unready = min((e.when for e in endings if not e.ready), default=None)
        cutoff = math.floor(first_unready) if first_unready is not None else math.inf
        with self.lock:
            for ending in sorted(endings, key=lambda e: e.when):
                if ending.ready and ending.when < cutoff:
                    ending.report()
            ends = {**self.codes, **self.staged}
        self._note_queue()
        if len(ends) == self.nnodes and not self.cleaned:
            self._clean_up(ends)  # before the last end is reported: the supervisor may exit right after
        with self.lock:  # all at once: a supervisor that polls sees them in one tick
            self._publish()

    def _refresh_node(self, n: int, pod: dict[str, Any] | None, waiting: str) -> Ending | None:
        if pod is None:
            if n in self.pods or self.signalled:
                return self._gone(n)
            self.views[n] = pods.PodView(pods.QUEUED, waiting or "waiting for the pod to be created")
            return self._pending_timeout(n, None)
        name = pod["metadata"]["name"]
        with self.lock:
            self.pods[n] = name
            if self.signalled and not (pod.get("metadata") or {}).get("deletionTimestamp"):
                threading.Thread(target=self._delete_pod, args=(name, self.grace_seconds), daemon=True).start()
        v = self._with_stop(n, pods.view(pod, self.ref.container))
        self.views[n] = v
        if v.state in (pods.RUNNING, pods.ENDED) and name not in self.followers:
            self._follow(n, name)
        if v.state == pods.ENDED:
            seen = self.ended_at.setdefault(n, time.time())
            follower = self.followers.get(name)
            ready = follower is None or not follower.is_alive() or time.time() - seen > self.drain
            return Ending(v.finished or seen, ready, lambda: self._finish(n, v, pod))
        if v.state == pods.FAILED_START:
            events = self._events(name)  # asked now: reports happen under the lock poll() takes
            return Ending(time.time(), True, lambda: self._failed_start(n, v, pod, events))
        if v.state == pods.QUEUED:
            return self._pending_timeout(n, pod)
        return None

    def _pending_timeout(self, n: int, pod: dict[str, Any] | None) -> Ending | None:
        v = self.views[n]
        if self.pending_timeout is None or self.signalled or time.monotonic() - self.started < self.pending_timeout:
            return None
        late = pods.PodView(pods.FAILED_START, f"no node took the pod within --pending-timeout {self.pending_timeout:g}s "
                            f"({v.message})")
        events = self._events(pod["metadata"]["name"]) if pod else []
        return Ending(time.time(), True, lambda: self._failed_start(n, late, pod, events))

    def _workload_waiting(self) -> str:
        """Why the workload has no pods yet: '' unless it is suspended (Kueue holds it)."""
        try:
            obj = self.client.get(self.ref.api_kind, self.ref.name)
        except ApiError as exc:
            return "the workload was deleted" if exc.code == 404 else ""
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        suspended = next((c for c in status.get("conditions") or [] if c.get("type") == "Suspended"), None)
        if spec.get("suspend") or (suspended and suspended.get("status") == "True"):
            queue = ((obj.get("metadata") or {}).get("labels") or {}).get("kueue.x-k8s.io/queue-name")
            return f"suspended, waiting for admission{f' to queue {queue}' if queue else ''}"
        return ""

    def _note_queue(self) -> None:
        """The attempt's scheduler.json says what it waits for (QUEUED and the scheduler's
        message), for status; rewritten only when that changes."""
        with self.lock:
            waiting = [(n, v) for n, v in self.views.items() if v.state == pods.QUEUED and n not in self.codes]
        note = "; ".join(sorted({v.message for _, v in waiting}))
        if note == self.queue_note:
            return
        self.queue_note = note
        path = self.paths.scheduler_job(self.ref.attempt)
        record = read_scheduler(path) or self.ref.record()
        write_scheduler(path, record.with_details(queued=note or None, queued_nodes=[n for n, _ in waiting]))

    def _follow(self, n: int, name: str) -> None:
        frames = pods.Frames(self.paths.attempt(self.ref.attempt), self.trees, tag=str(n))
        self.frames[name] = frames
        thread = threading.Thread(target=self._read_log, args=(n, name, frames), name=f"log-{name}", daemon=True)
        self.followers[name] = thread
        thread.start()

    def _read_log(self, n: int, name: str, frames: pods.Frames) -> None:
        while frames.exit is None and not self.cleaned:
            try:
                for line in self.client.logs(name, self.ref.container, follow=True):
                    frames.feed(line)
                    if frames.stop is not None and n not in self.told_to_stop:
                        with self.lock:  # neither phalanx's own stop nor the controller's clean-up after a failure
                            failed = [m for m, w in self.views.items() if m != n and w.state == pods.ENDED and w.exit_code]
                            if not self.signalled and not failed:
                                self.told_to_stop[n] = frames.stop
            except ApiError as exc:
                if exc.code == 404:
                    break
            except OSError:
                pass
            if frames.exit is not None or (self.views.get(n) or pods.PodView(pods.QUEUED)).state == pods.ENDED:
                break
            time.sleep(1.0)  # dropped while the container runs: read it again (frames skip what arrived)
        frames.close()

    def _gone(self, n: int) -> Ending:
        """The node's pod left the API (deleted by phalanx's stop, or by someone else), or a
        stop came before it existed: its end, once its log has arrived."""
        seen = self.ended_at.setdefault(n, time.time())
        follower = self.followers.get(self.pods.get(n, ""))
        ready = follower is None or not follower.is_alive() or time.time() - seen > self.drain
        last = self._with_stop(n, self.views.get(n) or pods.PodView(pods.QUEUED))
        gone = pods.PodView(pods.ENDED, last.message, reason="Deleted", taken=last.taken, taken_at=last.taken_at,
                            taken_exact=last.taken_exact,
                            termination=last.termination)
        return Ending(last.finished or seen, ready, lambda: self._finish(n, gone, None, vanished=not self.signalled))

    def _with_stop(self, n: int, v: pods.PodView) -> pods.PodView:
        """``v``, taken when the pod said it was told to stop while phalanx had not asked."""
        told = self.told_to_stop.get(n)
        if told is None or v.taken:
            return v
        v.taken = f"its pod got {told[0]} that phalanx did not send (deleted by the cluster: a preemption, eviction or drain)"
        v.taken_at, v.taken_exact = told[1], True
        return v

    def _finish(self, n: int, v: pods.PodView, pod: dict[str, Any] | None, vanished: bool = False) -> None:
        own = read_node_result(self.paths.node_result(self.ref.attempt, n))
        result = own.to_dict() if own is not None else None
        if result is None and vanished and not v.taken:
            result = {"node_rank": n, "exitcode": 255, "failures": [], "synthesized": True, "error":
                      f"pod {self.pods.get(n)} left the cluster before it ended (deleted by someone else?)"}
            self._note_unreported(n, v, result)
        elif result is None:
            result = pods.result_from(v, pod, self.ref.container, n, self.ranks[n],
                                      stopped_by=self.signalled if self.signalled and not v.taken else None)
            self._note_unreported(n, v, result)
        # Taken itself, unless another node was taken first: then this one's stop (the Job
        # controller deleting the rest, backoffLimit 0) and the failures after it are casualties.
        taken = [(m, t) for m, t in self.views.items() if m != n and t.taken and t.taken_at is not None]
        first = min(taken, key=lambda mt: mt[1].taken_at or 0.0) if taken else None
        if v.taken and (first is None or (v.taken_at or 0.0) <= (first[1].taken_at or 0.0)):
            result["k8s_taken"] = v.taken
        elif first is not None:
            result = pods.as_casualty(result, first[0], first[1].taken, first[1].taken_at or 0.0,
                                      slack=0.0 if first[1].taken_exact else 1.0)
        node = ((pod or {}).get("spec") or {}).get("nodeName")
        if node:  # the Kubernetes node, which a retry's anti-affinity names if this one was bad
            result.setdefault("node_name", node)
        with self.lock:
            self._record(n, result)

    def _failed_start(self, n: int, v: pods.PodView, pod: dict[str, Any] | None, events: list[str]) -> None:
        result = pods.result_from(v, pod, self.ref.container, n, self.ranks[n])
        if events:
            result["k8s_events"] = events
        self._note_unreported(n, v, result, events)
        with self.lock:
            self._record(n, result)

    def _record(self, n: int, result: dict[str, Any]) -> None:
        """The node's end, written to its result.json (``contracts.NodeResult``); reported by
        ``_publish`` (lock held)."""
        result.setdefault("node_rank", n)
        result.setdefault("failures", [])
        path = self.paths.node_result(self.ref.attempt, n)
        final = NodeResult.from_dict(result, str(path))
        write_node_result(path, final)
        self.staged[n] = final

    def _publish(self) -> None:
        """Report the recorded ends to ``poll`` (lock held)."""
        self.codes.update(self.staged)
        self.staged.clear()

    def _note_unreported(self, n: int, v: pods.PodView, result: dict[str, Any], events: list[str] | None = None) -> None:
        """Say why in the node's agent.log when nothing of the node arrived (its own log is
        mirrored, and not written to here); the pod's stray output goes into the result."""
        frames = self.frames.get(self.pods.get(n, ""))
        if frames is not None and frames.other:
            result["k8s_pod_output"] = frames.other
        if frames is not None and frames.frames:
            return
        lines = [*(f"pod: {line}" for line in (frames.other if frames else [])),
                 *(f"event: {e}" for e in events or []), f"phalanx: {result.get('error') or v.message or v.reason}"]
        log = self.paths.agent_log(self.ref.attempt, n)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as fh:
            fh.write("\n".join(lines) + "\n")

    def _events(self, pod: str) -> list[str]:
        try:
            events = self.client.list("Event", fields=f"involvedObject.name={pod}")
        except ApiError:
            return []
        warnings = [e for e in events if e.get("type") == "Warning"]
        return [f"{e.get('reason')}: {e.get('message')}" for e in warnings[-5:]]

    def _broken(self, exc: BaseException) -> None:
        """The watcher itself failed: every node not reported yet fails with the reason (the
        supervisor then stops the attempt), rather than the attempt hanging unwatched."""
        import traceback

        text = f"phalanx could not watch the pods: {exc!r}"
        with self.lock:
            for n in range(self.nnodes):
                if n not in self.codes:
                    log = self.paths.agent_log(self.ref.attempt, n)
                    log.parent.mkdir(parents=True, exist_ok=True)
                    with open(log, "a") as fh:
                        fh.write(traceback.format_exc())
                    self._record(n, {"exitcode": 1, "failures": [], "synthesized": True, "error": text})
            self._publish()

    def _delete_pod(self, name: str, grace: int) -> None:
        try:
            self.client.delete("Pod", name, propagation="Background", grace=grace)
        except ApiError:
            pass

    def _clean_up(self, ends: dict[int, NodeResult]) -> None:
        failed = any(result.exitcode != 0 for result in ends.values())
        keep = self.keep_failed and failed and (self.failed_first or not self.signalled) and not self.killed
        for thread in list(self.followers.values()):
            thread.join(timeout=self.drain)
        if not keep:
            self.delete_objects()
        self.cleaned = True
