"""The supervisor's side of one attempt on Ray: the Ray job's status and log -> node results and the
job directory's files.

:class:`RayJob` follows the Ray job's log (the driver relays each node's frames there, see
:mod:`.relay`) and writes every node's files into the local job directory as they come, through
the same ``Receiver`` the ssh backend uses: rank logs, results, metrics, and what the ranks write
to the state and output directories. So ``phalanx logs``, metrics and ``status`` work while the
job runs and after the cluster is gone. :class:`RayNode` is one node's handle on it.

The Jobs API's log tail blocks, so it runs in a thread and the frames are written as they come
(as the ssh backend's link does); ``collect(final=True)`` waits for the tail to have read the
job's whole log (the driver's last lines into ``batch.log``). ``poll`` never waits.

A node lost with its Ray node makes its peers' ranks fail at once (a broken connection), seconds
before Ray declares the node dead and the driver reports it. So that the loss is what the supervisor
sees first (the attempt was taken: preempted, retried), a node that ended with a failure is reported
once every other node has ended and every lost one has been reported in an earlier poll, or
``settle`` seconds after its end. Nothing waits on it: the driver itself stops the other nodes as
soon as one fails (its gang stop).

A node's result is the one its stream brought (its ``result.json``). When the Ray job ends without
a node's (the driver failed before the nodes started, the placement group timed out, the job was
stopped before a node reported), one is synthesized in the node's place (``base.synthesize``),
saying why, in ``result.json`` and ``agent.log``; the driver's own output is in the attempt's
``batch.log``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import IO, Any

from ...core.contracts import NodeResult, read_scheduler, write_scheduler
from ...core.paths import JobPaths
from ...errors import BackendError
from ...launch.frames import Receiver
from ..base import NodeHandle, synthesize
from . import relay
from .client import TERMINAL, RayClient


class RayJob:
    """One attempt's Ray job, shared by its node handles. Thread-safe where the tail thread and the
    supervisor meet (the results and the events)."""

    status_every = 2.0  # seconds between status requests (a sweep may watch many jobs)
    final_wait = 30.0  # seconds ``collect(final=True)`` waits for the rest of the job's log
    settle = 15.0  # seconds a node's failure may wait for its peers' ends (Ray declares a node dead in ~15 s)

    def __init__(self, client: RayClient, submission_id: str, paths: JobPaths, attempt: int, nnodes: int,
                 trees: dict[str, Path]) -> None:
        self.client = client
        self.submission_id = submission_id
        self.paths = paths
        self.attempt = attempt
        self.nnodes = nnodes
        self.codes: dict[int, int | None] = {}  # node -> exit code, once its stream ended
        self.results: dict[int, NodeResult] = {}  # node -> its result, once polled after its end
        self.ended_at: dict[int, float] = {}  # node -> when its stream ended (monotonic)
        self.lost: set[int] = set()  # nodes the driver reported lost with their Ray node
        self.reported: dict[int, int] = {}  # node -> how many polls have returned its result
        self.placed = False
        self.error: str | None = None  # the driver's one-line reason, when it gave up
        self.signalled: int | None = None
        self.killed_at: float | None = None
        self._status: tuple[str, str] = ("PENDING", "")
        self._asked_at = float("-inf")
        self._pipes: dict[int, IO[bytes]] = {}
        self._receivers: dict[int, threading.Thread] = {}
        self._trees = trees
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.followed = threading.Event()  # the tail saw the job's whole log
        self._tail = threading.Thread(target=self._follow, daemon=True, name=f"ray-tail-{submission_id}")
        self._tail.start()

    # -- the log ------------------------------------------------------------------------

    def _follow(self) -> None:
        """Follow the job's log until it ends; re-read from the start when the stream breaks
        (frames are idempotent, and what was fed already is skipped)."""
        demux = relay.Demux(self._data, self._end, self._event, self._other)
        while not self._stop.is_set():
            skip = demux.consumed
            seen = 0
            try:
                for chunk in self.client.tail(self.submission_id, self._stop):
                    if seen + len(chunk) <= skip:
                        seen += len(chunk)
                        continue
                    start = max(0, skip - seen)
                    seen += len(chunk)
                    demux.feed(chunk[start:])
                demux.close()
                break
            except BackendError:
                if self._ended():
                    # The job is over and its log may be gone with the cluster: read what there is.
                    try:
                        demux.feed(self.client.logs(self.submission_id)[demux.consumed:])
                        demux.close()
                    except Exception:  # noqa: BLE001 - nothing more to read
                        pass
                    break
                time.sleep(1.0)
        for node in list(self._pipes):
            self._end(node)
        for thread in list(self._receivers.values()):
            thread.join(timeout=30)
        self.followed.set()

    def _data(self, node: int, data: bytes) -> None:
        pipe = self._pipes.get(node)
        if pipe is None:
            if node in self._receivers or not 0 <= node < self.nnodes:
                return  # after its end, or not a node of this job
            read_fd, write_fd = os.pipe()
            pipe = self._pipes[node] = os.fdopen(write_fd, "wb")
            receiver = Receiver(self.paths.attempt(self.attempt), dict(self._trees), tag=str(node))
            thread = threading.Thread(target=self._receive, args=(node, receiver, os.fdopen(read_fd, "rb")), daemon=True)
            self._receivers[node] = thread
            thread.start()
        try:
            pipe.write(data)
            pipe.flush()
        except OSError:
            pass

    def _receive(self, node: int, receiver: Receiver, stream: IO[bytes]) -> None:
        code = receiver.receive(stream)
        stream.close()
        with self._lock:
            self.codes[node] = code
            self.ended_at[node] = time.monotonic()

    def _end(self, node: int) -> None:
        pipe = self._pipes.pop(node, None)
        if pipe is not None:
            pipe.close()

    def _event(self, event: dict[str, Any]) -> None:
        if "placed" in event:
            self.placed = True
            record = read_scheduler(self.paths.scheduler_job(self.attempt))
            if record is not None:  # where each node landed, for status and the root cause
                write_scheduler(self.paths.scheduler_job(self.attempt), record.with_details(nodes=event["placed"]))
        if "error" in event:
            self.error = str(event["error"])
        if isinstance(event.get("lost"), dict) and isinstance(event["lost"].get("node"), int):
            with self._lock:
                self.lost.add(event["lost"]["node"])
        self._other(relay.event_line(event).rstrip("\n"))

    def _other(self, line: str) -> None:
        with open(self.paths.batch_log(self.attempt), "a") as fh:
            fh.write(line + "\n")

    # -- status -------------------------------------------------------------------------

    def state(self) -> tuple[str, str]:
        if self._status[0] not in TERMINAL and time.monotonic() - self._asked_at >= self.status_every:
            self._asked_at = time.monotonic()
            self._status = self.client.status(self.submission_id)
        return self._status

    def _ended(self) -> bool:
        return self.state()[0] in TERMINAL | {"GONE"}

    def poll(self, node_rank: int) -> NodeResult | None:
        """The node's result once its stream ended and its files were written (its own report,
        or one synthesized when the stream ended without it); one synthesized in its place when
        the job ended without its stream. None while it runs."""
        if node_rank in self.results:
            self.reported[node_rank] = self.reported.get(node_rank, 0) + 1
            return self.results[node_rank]
        with self._lock:
            code = self.codes.get(node_rank)
        if code and not self._settled(node_rank):
            return None
        if code is None:
            if not self._ended() and not self._given_up():
                return None
            if not self.followed.is_set() and not self._given_up():
                return None  # the last frames are still arriving
            with self._lock:
                code = self.codes.get(node_rank)
            if code is None:
                return self._report_for(node_rank)
        result = self.results[node_rank] = synthesize(self.paths, self.attempt, NodeResult.synthesize(
            node_rank, code, f"node {node_rank} of Ray job {self.submission_id} ended (exit {code}) without a report",
            ray_job=self.submission_id))
        self.reported[node_rank] = 1
        return result

    def _settled(self, node_rank: int) -> bool:
        """Whether a node that ended with a failure may be reported now (see the module's
        docstring): it was lost itself, its peers have all ended and the lost ones among them
        were reported in an earlier poll (by the supervisor's previous tick), or it has waited
        ``settle`` seconds."""
        with self._lock:
            if node_rank in self.lost:
                return True
            waited = time.monotonic() - self.ended_at.get(node_rank, time.monotonic())
            peers_ended = all(self.codes.get(n) is not None for n in range(self.nnodes) if n != node_rank)
            lost = set(self.lost)
        if waited >= self.settle or self._given_up():
            return True
        return peers_ended and all(self.reported.get(n, 0) >= 2 for n in lost if n != node_rank)

    def collect(self, final: bool) -> None:
        """The frames are written as they come; at the end, wait for the tail to have read the
        whole log (it stops by itself once the job has ended), at most ``final_wait`` seconds."""
        if final:
            self.followed.wait(self.final_wait)

    def _given_up(self) -> bool:
        """Killed, and the cluster has not confirmed the end for a while: stop waiting for it."""
        return self.killed_at is not None and time.monotonic() - self.killed_at > 60

    def running(self) -> bool:
        return self.placed or self.state()[0] in TERMINAL

    def _report_for(self, node_rank: int) -> NodeResult:
        state, message = self.state()
        stopped_by = None
        if self.killed_at is not None:
            code, stopped_by = 128 + signal.SIGKILL, "SIGKILL"
        elif self.signalled is not None:
            code, stopped_by = 128 + self.signalled, signal.Signals(self.signalled).name
        else:
            code = 1
        why = self.error or (message.strip().splitlines() or [""])[-1] or f"the Ray job ended {state}"
        text = f"Ray job {self.submission_id} ended {state} before node {node_rank} reported: {why}"
        log = self.paths.agent_log(self.attempt, node_rank)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as fh:
            fh.write(f"phalanx: {text}\nphalanx: the driver's output: {self.paths.batch_log(self.attempt)}\n")
        result = synthesize(self.paths, self.attempt, NodeResult.synthesize(
            node_rank, code, text, stopped_by=stopped_by, ray_job=self.submission_id, ray_state=state))
        with self._lock:
            self.codes[node_rank] = result.exitcode
        self.results[node_rank] = result
        self.reported[node_rank] = 1
        return result

    # -- control ------------------------------------------------------------------------

    def signal(self, signum: int) -> None:
        """Once per job: ``ray job stop``; the driver gives every node the grace period."""
        if self.signalled is not None or self.killed_at is not None:
            return
        self.signalled = signum
        self.client.stop(self.submission_id)

    def kill(self) -> None:
        """Stop the Ray job (Ray escalates to SIGKILL after the job's stop wait). Idempotent."""
        if self.killed_at is None:
            self.killed_at = time.monotonic()
            self.client.stop(self.submission_id)


class RayNode(NodeHandle):
    """One node of a Ray job, as the supervisor sees it."""

    kill_margin = 20.0  # the driver's own escalation and Ray's stop wait

    def __init__(self, job: RayJob, node_rank: int) -> None:
        self.job = job
        self.node_rank = node_rank

    def poll(self) -> NodeResult | None:
        return self.job.poll(self.node_rank)

    def collect(self, final: bool = False) -> None:
        self.job.collect(final)

    def signal(self, signum: int) -> None:
        self.job.signal(signum)

    def kill(self) -> None:
        self.job.kill()

    def running(self) -> bool:
        return self.job.running()
