"""Inside a pod: ``python3 -m phalanx.backends.kubernetes.pod --launch FILE --node-rank-from VAR``.

The container's command. The image has python3 and the user's framework, nothing of
phalanx: this module comes from the code bundle (``PYTHONPATH=/phx/lib``) and imports only the
standard library (and, through the node agent, torch). It

1. picks this node's part of the plan from the launch file (every node's, from the attempt's
   ConfigMap) by ``$VAR``, the node rank the pod's controller gave it (``JOB_COMPLETION_INDEX``,
   ``RANK``, ``PET_NODE_RANK``), and drops the controller's node-level variables (``RANK``,
   ``WORLD_SIZE``, ``MASTER_ADDR``, ``PET_*``) so the script sees only torchrun's;
2. runs the node agent (``phalanx.launch.agent``) and forwards SIGTERM/SIGINT to it: deleting
   the pod (``stop``, eviction, preemption) is SIGTERM, then SIGKILL after the pod's grace;
3. meanwhile waits, bounded, until node 0's DNS name resolves (``--wait-for``): a worker may
   start before node 0 is scheduled, and its Service record appears only then. The agent starts
   first, so its interpreter and imports overlap the wait, and its rendezvous waits as long for
   node 0 to listen; a name that never resolves stops the agent and fails the node, saying why;
4. mirrors the node's files (agent log, rank logs, results, metrics) and what its ranks write
   to the output and state directories onto stdout, one JSON frame per line (the frames of
   ``launch.remote``, bytes as text or base64), so the supervisor rebuilds them from the pod's
   log stream and ``kubectl logs`` stays readable; ``{"exit": code}`` is the last line;
5. writes the node's result, trimmed, to the termination message as well
   (``/dev/termination-log``, at most 4096 bytes), so a finished pod says how it ended even
   when its log is gone; a rank killed while the container's cgroup counted an OOM kill is
   named as OOM-killed.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from ...core.contracts import LaunchFile, NodeResult, write_launch, write_node_result
from ...core.paths import JobPaths
from ...launch.frames import Mirror
from ...launch.remote import SCAN_INTERVAL

TERMINATION_LOG = "/dev/termination-log"
MESSAGE_MAX = 4096  # bytes of a termination message the kubelet keeps
FRAME_BYTES = 256 * 1024  # bytes per frame line: the kubelet splits lines over 16 KiB, keep them few
# Variables a controller sets with node-level meaning; torchrun sets the process-level ones.
CONTROLLER_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK")


class LineMirror(Mirror):
    """``launch.remote.Mirror`` with every frame on one line: bytes go inside it, as ``"t"``
    (UTF-8 text) or ``"d"`` (base64), split into pieces of at most FRAME_BYTES."""

    def frame(self, frame: dict[str, Any], data: bytes | None = None) -> bool:
        if data is None or len(data) <= FRAME_BYTES or "o" not in frame:
            return self._line(frame, data)
        for start in range(0, len(data), FRAME_BYTES):
            piece = {**frame, "o": int(frame["o"]) + start}
            if not self._line(piece, data[start:start + FRAME_BYTES]):
                return False
        return True

    def _line(self, frame: dict[str, Any], data: bytes | None) -> bool:
        if data is not None:
            try:
                frame = {**frame, "t": data.decode("utf-8")}
            except UnicodeDecodeError:
                frame = {**frame, "d": base64.b64encode(data).decode()}
        line = json.dumps(frame, separators=(",", ":")).encode() + b"\n"
        with self.lock:
            if self.closed:
                return False
            try:
                self.out.write(line)
                self.out.flush()
            except (OSError, ValueError):
                self.closed = True
            return not self.closed


def read_launch(path: str, node_rank: int) -> dict[str, Any]:
    """This node's launch.json (``launch.agent``'s format) from the attempt's launch file."""
    raw = Path(path).read_bytes()
    data = json.loads(gzip.decompress(raw) if path.endswith(".gz") else raw)
    nodes = data["nodes"]
    if not 0 <= node_rank < len(nodes):
        raise ValueError(f"node rank {node_rank} is not one of the {len(nodes)} nodes of this job")
    return {"node": nodes[node_rank], "job_dir": data["job_dir"], "attempt": data["attempt"], "grace": data["grace"],
            "sample_interval": data.get("sample_interval", 5.0)}


class NameWait:
    """Whether node 0's name resolves yet, asked in the entry's loop while the agent starts (a
    worker may start before node 0 is scheduled, and its Service record appears only then):
    ``failed()`` tries at most every 0.2 s until the name resolves (then never again), and
    is True once ``timeout`` seconds have passed without it. Says so in the node's log."""

    def __init__(self, host: str, timeout: float, note: Any) -> None:
        self.host, self.note = host, note
        self.deadline = time.monotonic() + timeout
        self.next = 0.0
        self.resolved = False
        self.said = False

    def failed(self) -> bool:
        if self.resolved or time.monotonic() < self.next:
            return False
        self.next = time.monotonic() + 0.2
        try:
            socket.getaddrinfo(self.host, None)
        except OSError as exc:
            if not self.said:
                self.note(f"waiting for node 0's name {self.host} to resolve ({exc.strerror or exc}); its pod may not "
                          "be scheduled yet")
                self.said = True
            return time.monotonic() >= self.deadline
        self.resolved = True
        if self.said:
            self.note(f"{self.host} resolves now")
        return False


def oom_kills(cgroup: Path) -> int | None:
    """The OOM kills this container's cgroup has counted (v2 ``memory.events``, v1
    ``memory.oom_control``); None when neither can be read."""
    for name, key in (("memory.events", "oom_kill"), ("memory/memory.oom_control", "oom_kill")):
        try:
            for line in (cgroup / name).read_text().splitlines():
                word, _, value = line.partition(" ")
                if word == key and value.strip().isdigit():
                    return int(value)
        except OSError:
            continue
    return None


def name_oom(result: dict[str, Any], kills: int) -> None:
    """Ranks killed by SIGKILL while the cgroup counted ``kills`` OOM kills were OOM-killed."""
    for failure in result.get("failures") or []:
        if failure.get("signal") == "SIGKILL" and not failure.get("message"):
            failure["message"] = "OOM-killed: the container reached its memory limit (cgroup memory.events oom_kill)"
    if kills:
        result["oom_kills"] = kills


def termination_message(result: dict[str, Any]) -> str:
    """The node's result in at most MESSAGE_MAX bytes: tracebacks and long texts go first."""
    slim = {k: v for k, v in result.items() if k not in ("ranks",)}
    failures = [{k: v for k, v in f.items() if k in ("rank", "local_rank", "exitcode", "signal", "timestamp", "message")}
                for f in slim.get("failures") or []]
    slim["failures"] = failures
    text = json.dumps(slim, separators=(",", ":"), sort_keys=True)
    while len(text.encode()) > MESSAGE_MAX and slim["failures"]:
        for f in slim["failures"]:
            f.pop("message", None)
        if len(json.dumps(slim).encode()) > MESSAGE_MAX:
            slim["failures"] = slim["failures"][: max(0, len(slim["failures"]) // 2)]
            slim["truncated"] = True
        text = json.dumps(slim, separators=(",", ":"), sort_keys=True)
    return text[:MESSAGE_MAX]


class Pod:
    """One run of the entry: the agent, its mirror, its result."""

    def __init__(self, launch: dict[str, Any], out: IO[bytes], termination_log: str, cgroup: Path) -> None:
        self.launch = launch
        self.node = launch["node"]
        self.node_rank = int(self.node["node_rank"])
        paths, attempt = JobPaths(Path(launch["job_dir"])), int(launch["attempt"])
        self.attempt_dir = paths.attempt(attempt)
        self.node_dir = paths.node_dir(attempt, self.node_rank)
        self.node_dir.mkdir(parents=True, exist_ok=True)
        self.launch_path = paths.node_launch(attempt, self.node_rank)
        self.result_path = paths.node_result(attempt, self.node_rank)
        self.agent_log = paths.agent_log(attempt, self.node_rank)
        write_launch(self.launch_path, LaunchFile.from_dict(launch, "the attempt's launch plan"))
        env = self.node["env"]
        trees = {"output": Path(env["PHALANX_OUTPUT_DIR"]), "state": Path(env["PHALANX_STATE_DIR"])}
        for tree in trees.values():
            tree.mkdir(parents=True, exist_ok=True)
        self.mirror = LineMirror(self.attempt_dir, self.node_rank, out, trees)
        self.termination_log = termination_log
        self.cgroup = cgroup
        self.agent: subprocess.Popen[bytes] | None = None
        self.stop_signal: int | None = None
        self.signalled_at: float | None = None  # when the first stop signal came
        self.signal_told = False  # its frame was sent

    def note(self, text: str) -> None:
        """A line of the pod's own in the node's agent.log (mirrored like the rest)."""
        with open(self.agent_log, "a") as log:
            log.write(f"phalanx pod: {text}\n")

    def run(self, wait_for: str | None, dns_timeout: float) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._forward)  # PID 1 ignores signals it has no handler for
        kills = oom_kills(self.cgroup)
        started = time.time()
        os.makedirs(self.node["cwd"], exist_ok=True)
        name = NameWait(wait_for, dns_timeout, self.note) if wait_for else None
        if name is not None and self.node.get("torchrun_argv") is None:
            # Processes the agent starts itself would meet node 0's name at once: they start once it resolves.
            while not name.resolved:
                if name.failed():
                    return self.finish({"exitcode": 1, "failures": [], "error":
                                        f"node 0's name {wait_for} did not resolve within {dns_timeout:g}s"}, started=started)
                self.mirror.scan()
                time.sleep(0.1)
        # A torchrun node's agent starts at once: its interpreter and imports overlap the wait for node
        # 0's name, and its rendezvous connects only once node 0 listens (longer than this entry waits,
        # which says why when the name never resolves).
        wait = ["--rdzv-wait", f"{dns_timeout + 60:g}"] if name is not None and not name.resolved else []
        with open(self.agent_log, "ab") as log:
            self.agent = subprocess.Popen(
                [sys.executable, "-m", "phalanx.launch.agent", "--launch", str(self.launch_path), *wait],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.node["cwd"], start_new_session=True,
            )
        if self.stop_signal is not None:  # asked to stop while starting: the agent starts stopping
            self._forward(self.stop_signal, None)
        while self.agent.poll() is None:
            if name is not None and name.failed():
                self._stop_agent()
                return self.finish({"exitcode": 1, "failures": [], "error":
                                    f"node 0's name {wait_for} did not resolve within {dns_timeout:g}s"}, started=started)
            self.mirror.scan()
            self._tell_signal()
            time.sleep(SCAN_INTERVAL)
        code = self.agent.returncode
        code = 128 - code if code < 0 else code
        try:
            result = json.loads(self.result_path.read_text())
        except (OSError, ValueError):
            result = {"exitcode": code, "failures": [], "error": f"the node agent ended ({code}) without a result; see agent.log"}
        after = oom_kills(self.cgroup)
        if kills is not None and after is not None and after > kills:
            name_oom(result, after - kills)
        return self.finish(result, started)

    def _stop_agent(self) -> None:
        """SIGTERM to the agent and what it started; SIGKILL if that has not ended it in 10 s."""
        assert self.agent is not None
        for signum, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.agent.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.agent.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def finish(self, result: dict[str, Any], started: float) -> int:
        result.setdefault("node_rank", self.node_rank)
        result.setdefault("host", self.node.get("host"))
        result.setdefault("started", started)
        result.setdefault("finished", time.time())
        if self.stop_signal is not None and not result.get("failures") and "stopped_by" not in result:
            result["stopped_by"] = signal.Signals(self.stop_signal).name
        write_node_result(self.result_path, NodeResult.from_dict(result, str(self.result_path)))
        try:
            Path(self.termination_log).write_text(termination_message(result))
        except OSError as exc:
            self.note(f"cannot write the termination message to {self.termination_log}: {exc.strerror}")
        self._tell_signal()
        self.mirror.scan(final=True)
        code = int(result.get("exitcode", 1)) & 0xFF
        self.mirror.frame({"exit": code})
        return code

    def _tell_signal(self) -> None:
        """Say at once, in its own frame, that the pod was told to stop (and when): a pod taken
        by the cluster (preempted: deleted, SIGTERM) may leave the API before the supervisor
        lists it with its DisruptionTarget condition, and its peers' failures that follow must
        be seen as casualties. Sent from the main loop, never from the signal handler (the
        mirror's lock may be held when the signal comes)."""
        if self.stop_signal is not None and self.signalled_at is not None and not self.signal_told:
            self.signal_told = True
            self.mirror.frame({"signal": signal.Signals(self.stop_signal).name, "at": self.signalled_at})

    def _forward(self, signum: int, _frame: Any) -> None:
        if self.signalled_at is None:
            self.signalled_at = time.time()
        self.stop_signal = self.stop_signal or signum
        if self.agent is not None and self.agent.poll() is None:
            try:
                os.killpg(self.agent.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass


def _frames_out() -> IO[bytes]:
    """Stdout for frames alone; anything else printing to fd 1 goes to stderr (the container's
    log takes both, line by line, so a stray print never splits a frame)."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m phalanx.backends.kubernetes.pod")
    parser.add_argument("--launch", required=True, help="every node's launch plan (launch.json or launch.json.gz)")
    parser.add_argument("--node-rank-from", required=True, metavar="VAR", help="the variable holding this pod's node rank")
    parser.add_argument("--wait-for", metavar="HOST", help="node 0's DNS name: wait until it resolves")
    parser.add_argument("--dns-timeout", type=float, default=600.0, help="seconds to wait for --wait-for")
    parser.add_argument("--termination-log", default=os.environ.get("PHX_TERMINATION_LOG", TERMINATION_LOG))
    parser.add_argument("--cgroup", default="/sys/fs/cgroup", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = _frames_out()
    value = os.environ.get(args.node_rank_from, "")
    if not value.isdigit():
        print(f"phalanx pod: ${args.node_rank_from} holds {value!r}, not a node rank", file=sys.stderr, flush=True)
        raise SystemExit(2)
    try:
        launch = read_launch(args.launch, int(value))
    except (OSError, ValueError, KeyError) as exc:
        print(f"phalanx pod: cannot read the launch plan {args.launch}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    for name in [*CONTROLLER_VARS, *(k for k in os.environ if k.startswith("PET_"))]:
        os.environ.pop(name, None)
    code = Pod(launch, out, args.termination_log, Path(args.cgroup)).run(args.wait_for, args.dns_timeout)
    out.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
