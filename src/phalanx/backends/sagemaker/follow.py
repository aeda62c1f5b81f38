"""One attempt's training job, followed from here: status, logs, results and outputs.

The network is a background thread's (so that neither ``poll`` nor ``collect`` ever waits on it):

- it asks DescribeTrainingJob every ``describe_every`` seconds (at once after a stop) and writes
  what it says into the attempt's ``scheduler.json`` (``contracts.SchedulerRecord``, its details):
  status, secondary status (Starting, Downloading, Training, Interrupted, MaxWaitTimeExceeded...),
  failure reason, billable seconds;
- it follows every CloudWatch stream of the job (``<job>/algo-<n>-<epoch>``, a new one per
  instance start: a spot restart adds streams) with ``nextForwardToken`` and sorts what the
  instances printed (``entry.parse_line``) into what a local node would have written: each
  rank's ``output.log`` lines (so phalanx's metric regexes run on them), each node's
  ``agent.log`` lines, each rank's ``error.json``/``proc.json``. ``collect`` (the supervisor's
  ``NodeHandle.collect``, every tick and once at the end) writes them into the job directory;
- once the job has ended, it reads the streams to their end, downloads the model and output
  archives into the job's output directory, and decides each node's result
  (``contracts.NodeResult``): the one its instance reported last, or one made from what SageMaker
  says (its FailureReason, a stop). ``result`` hands it to ``poll``, which writes ``result.json``.
"""

from __future__ import annotations

import os
import signal
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ...core.contracts import NodeResult, SchedulerRecord, read_scheduler, write_node_result, write_scheduler
from ...core.paths import JobPaths, write_json
from ...errors import ContractError
from .client import Aws
from .entry import parse_line
from .layout import LOG_GROUP, JobS3, host_of_stream, log_stream_prefix

TERMINAL = {"Completed", "Failed", "Stopped"}
# Secondary statuses in which no rank can run: the stall clock does not count them.
WAITING = {"Starting", "Pending", "Downloading", "DownloadingTrainingImage", "LaunchingMLInstances",
           "PreparingTrainingStack", "Interrupted", "Restarting"}
# Ends that took the job from outside, as a preemption does (the ranks got SIGTERM first).
TAKEN = {"MaxRuntimeExceeded", "MaxWaitTimeExceeded", "Stopped"}


class TrainingJobWatch:
    # Seconds between DescribeTrainingJob calls and between log reads (the environment may say
    # otherwise: tests against the fake plane ask more often).
    describe_every = 10.0
    logs_every = 2.0
    # After a kill (the supervisor's grace and margin are over) the job is given this long to end.
    abandon_after = 300.0
    # How long DescribeTrainingJob may not know a job this process created before that is its end.
    unknown_for = 120.0

    def __init__(self, aws: Aws, name: str, paths: JobPaths, attempt: int, nnodes: int, s3: JobS3,
                 again: bool = False) -> None:
        self.aws = aws
        # Watching an attempt again (``attach``): what the instances printed arrives again from the
        # start of their streams, so each log is rewritten at its first write, not appended to. Only
        # then: an attach that is only looked at (``status`` of a LOST job) changes no file.
        self._rewrite = again
        self._rewritten: set[Path] = set()
        self.name = name
        self.paths = paths
        self.attempt = attempt
        self.nnodes = nnodes
        self.s3 = s3
        self.describe_every = float(os.environ.get("PHALANX_SM_DESCRIBE_EVERY", self.describe_every))
        self.logs_every = float(os.environ.get("PHALANX_SM_LOGS_EVERY", self.logs_every))
        self.description: dict[str, Any] = {}
        self.results: dict[int, NodeResult] | None = None  # set once, when the job has ended
        self.written: set[int] = set()  # nodes whose result.json ``result`` has written
        # What the thread read and ``collect`` writes: (path, lines to append) or (path, JSON to write).
        self._inbox: list[tuple[Path, list[str] | dict[str, Any]]] = []
        self._inbox_lock = threading.Lock()
        self.signalled: int | None = None
        self.killed_at: float | None = None
        self.reported: dict[int, tuple[str, dict[str, Any]]] = {}  # node -> (stream, last result frame)
        self.tokens: dict[str, str | None] = {}
        self.streams: list[str] = []
        self.errors = 0
        self.began = time.monotonic()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"phalanx-sm-{name}", daemon=True)
        self._thread.start()

    # -- what the node handles ask ----------------------------------------------------------

    def result(self, node_rank: int) -> NodeResult | None:
        """The node's result once the job has ended (written to its ``result.json`` the first
        time it is asked for); None before. Never waits."""
        if self.results is None:
            if self.killed_at is not None and time.monotonic() - self.killed_at > self.abandon_after:
                self._give_up()
            return None
        result = self.results[node_rank]
        if node_rank not in self.written:
            self.written.add(node_rank)
            path = self.paths.node_result(self.attempt, node_rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_node_result(path, result)
        return result

    def collect(self, final: bool = False) -> None:
        """Write what the thread has read since the last call into the job directory. Every
        node's handle calls it; the first takes everything. The thread has read everything once
        the job has ended (``results`` is set after its last read), so the final call leaves
        nothing behind."""
        with self._inbox_lock:
            items, self._inbox = self._inbox, []
        for path, content in items:
            try:
                if isinstance(content, list):
                    _append(path, content, fresh=self._rewrite and path not in self._rewritten)
                    self._rewritten.add(path)
                else:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_json(path, content)
            except OSError:
                pass  # a full disk loses these lines, not the job

    def _put(self, path: Path, content: list[str] | dict[str, Any]) -> None:
        with self._inbox_lock:
            self._inbox.append((path, content))

    def running(self) -> bool:
        return self.description.get("SecondaryStatus", "Starting") not in WAITING

    def stop(self, signum: int) -> None:
        """StopTrainingJob, once (SageMaker sends every container SIGTERM, SIGKILL 120 s later)."""
        if self.signalled is None:
            self.signalled = signum
            threading.Thread(target=self._stop, daemon=True).start()

    def kill(self) -> None:
        """There is nothing harder than StopTrainingJob: ask for it (again), and stop waiting for
        the job ``abandon_after`` seconds from now."""
        self.stop(signal.SIGKILL)
        if self.killed_at is None:
            self.killed_at = time.monotonic()
            threading.Thread(target=self._stop, daemon=True).start()

    def _stop(self) -> None:
        try:
            self.aws.stop(self.name)
        except Exception as exc:  # noqa: BLE001 - said in the log; the next describe tells the truth
            self._note(0, f"StopTrainingJob {self.name} failed: {exc}")
        self._wake.set()

    # -- the thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        described = float("-inf")
        while self.results is None:
            now = time.monotonic()
            due = now - described >= self.describe_every or self._wake.is_set()
            self._wake.clear()
            try:
                if due:
                    described = now
                    self._describe()
                ended = self.description.get("TrainingJobStatus") in TERMINAL
                self._tail(final=ended, relist=due or ended or len(self.tokens) < self.nnodes)
                if ended:
                    self._finish()
                    return
                self.errors = 0
            except Exception as exc:  # noqa: BLE001 - the network comes and goes: keep watching
                self.errors += 1
                if self.errors in (1, 10, 100):
                    self._note(0, f"watching training job {self.name}: {type(exc).__name__}: {exc}")
            self._wake.wait(self.logs_every)

    def _describe(self) -> None:
        found = self.aws.describe(self.name)
        if found is None:
            # Just created, a job may not be visible to Describe yet; only a lasting absence is an end.
            if time.monotonic() - self.began < self.unknown_for:
                return
            found = {"TrainingJobStatus": "Failed", "SecondaryStatus": "Failed",
                     "FailureReason": f"SageMaker does not know training job {self.name}"}
        self.description = found
        path = self.paths.scheduler_job(self.attempt)
        try:
            record = read_scheduler(path) or SchedulerRecord("sagemaker", self.name)
        except ContractError:
            record = SchedulerRecord("sagemaker", self.name)
        resources = found.get("ResourceConfig") or {}
        write_scheduler(path, record.with_details(
            status=found.get("TrainingJobStatus"), secondary=found.get("SecondaryStatus"),
            failure_reason=found.get("FailureReason"), billable_seconds=found.get("BillableTimeInSeconds"),
            training_seconds=found.get("TrainingTimeInSeconds"), instance_count=resources.get("InstanceCount"),
            instance_type=resources.get("InstanceType"), updated=time.time(),
        ))

    def _tail(self, final: bool, relist: bool) -> None:
        # DescribeLogStreams has a low request rate per account: the streams are listed again only
        # with each describe (a spot restart adds streams) or while some instance has none yet.
        if relist:
            self.streams = self.aws.log_streams(LOG_GROUP, log_stream_prefix(self.name))
        for stream in self.streams:
            node = host_of_stream(self.name, stream)
            if node is None or node >= self.nnodes:
                continue
            for messages, token in self.aws.log_events(LOG_GROUP, stream, self.tokens.get(stream)):
                self._write(node, stream, messages)
                self.tokens[stream] = token
                if not final:
                    break  # one page per stream per round: the others are not kept waiting

    def _write(self, node: int, stream: str, messages: list[str]) -> None:
        agent: list[str] = []
        ranks: dict[int, list[str]] = {}
        for message in messages:
            kind, value = parse_line(message.rstrip("\n"))
            if kind == "rank":
                ranks.setdefault(value[0], []).append(value[1])
            elif kind == "frame":
                self._frame(node, stream, value)
            else:
                agent.append(value)
        for rank, lines in ranks.items():
            self._put(self.paths.rank_log(self.attempt, rank), lines)
        if agent:
            self._put(self.paths.agent_log(self.attempt, node), agent)

    def _frame(self, node: int, stream: str, frame: dict[str, Any]) -> None:
        kind, data, rank = frame.get("file"), frame.get("data"), frame.get("rank")
        if kind == "result" and isinstance(data, dict):
            previous = self.reported.get(node)
            if previous is None or previous[0] <= stream:  # the newest instance of this host speaks last
                self.reported[node] = (stream, data)
        elif kind in ("error", "proc") and isinstance(rank, int) and isinstance(data, dict):
            # The bootstrap's own files, relayed as they are (the ssh link mirrors them likewise).
            path = self.paths.rank_error(self.attempt, rank) if kind == "error" else self.paths.rank_proc(self.attempt, rank)
            self._put(path, data)

    # -- the end ------------------------------------------------------------------------------------

    def _finish(self) -> None:
        self._collect_outputs()
        status = self.description.get("TrainingJobStatus")
        secondary = self.description.get("SecondaryStatus")
        reason = self.description.get("FailureReason")
        results = {}
        for node in range(self.nnodes):
            reported = self.reported.get(node)
            result = dict(reported[1]) if reported else None
            if status == "Completed":
                result = result or {"exitcode": 0, "failures": []}
            elif status == "Stopped" or (self.signalled is not None and status != "Failed"):
                stopped = result if result and result.get("stopped_by") else None
                if stopped is None:
                    signame = "SIGKILL" if self.signalled == signal.SIGKILL else "SIGTERM"
                    code = 128 + int(signal.Signals[signame])
                    stopped = {"exitcode": code, "failures": [], "stopped_by": signame}
                    if self.signalled is None:
                        self._note(node, f"training job {self.name} ended {status} ({secondary}) before this node reported")
                result = stopped
            else:  # Failed
                if result is None or (int(result.get("exitcode", 1)) == 0 and not any(self._failed(r) for r in self.reported.values())):
                    result = {"exitcode": 1, "failures": []}
                    self._note(node, f"training job {self.name} failed: {reason or 'SageMaker gave no reason'}")
            result.update(node_rank=node, training_job=self.name, sagemaker_status=status, secondary_status=secondary)
            result.setdefault("host", f"algo-{node + 1}")
            if reason and status == "Failed":
                result.setdefault("error", reason)
            results[node] = self._typed(node, result)
        self.results = results

    def _typed(self, node: int, result: dict[str, Any]) -> NodeResult:
        """A node's result as the contract reads it; an instance's report that does not read is
        replaced by a failure saying so."""
        try:
            return NodeResult.from_dict(result, f"the result training job {self.name} reported for node {node}")
        except ContractError as exc:
            return NodeResult.synthesize(node, 1, exc.message, host=f"algo-{node + 1}", training_job=self.name)

    @staticmethod
    def _failed(reported: tuple[str, dict[str, Any]]) -> bool:
        return int(reported[1].get("exitcode", 0)) != 0

    def _collect_outputs(self) -> None:
        """The model and output archives (merged from every instance) into the job's outputs."""
        self.paths.output_dir.mkdir(parents=True, exist_ok=True)
        for uri in self.s3.artifacts(self.name):
            with tempfile.TemporaryDirectory(prefix="phalanx-sm-") as tmp:
                archive = Path(tmp) / "a.tar.gz"
                try:
                    if not self.aws.download(uri, str(archive)):
                        continue
                    with tarfile.open(archive, "r:gz") as tar:
                        tar.extractall(self.paths.output_dir, filter="data")
                except Exception as exc:  # noqa: BLE001 - outputs are the job's, the end is still the end
                    self._note(0, f"could not bring back {uri}: {type(exc).__name__}: {exc}")

    def _give_up(self) -> None:
        results = {}
        for node in range(self.nnodes):
            text = (f"training job {self.name} was still {self.description.get('SecondaryStatus')} {self.abandon_after:g} s "
                    f"after StopTrainingJob; check it with: aws sagemaker describe-training-job --training-job-name {self.name}")
            self._note(node, text)
            results[node] = NodeResult.synthesize(node, 128 + signal.SIGKILL, text, stopped_by="SIGKILL",
                                                  training_job=self.name)
        self.results = results
        self._wake.set()

    def _note(self, node: int, text: str) -> None:
        self._put(self.paths.agent_log(self.attempt, node), [f"phalanx: {text}"])


def _append(path: Path, lines: list[str], fresh: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w" if fresh else "a") as fh:
        fh.write("".join(line + "\n" for line in lines))

