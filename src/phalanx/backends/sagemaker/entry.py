"""What every SageMaker instance runs: ``python3 -m phalanx.backends.sagemaker.entry``.

Standard library only: the training image has Python and the user's framework, nothing of phalanx
but the unpacked bundle on ``PYTHONPATH`` (no psutil, no yaml, no typer). Of phalanx it uses the
job-directory contract only (``core/paths.JobPaths``, ``core/contracts``), which is standard
library too.

1. Reads ``/opt/ml/input/config/resourceconfig.json``: the hosts ``algo-1..N`` and which one
   this is; node rank = its index, node 0 (``algo-1``) hosts the rendezvous.
2. Takes this node's part of the plan from the phalanx channel's ``launch.json`` and runs
   phalanx's node agent on it (torchrun, or one process per rank for TF/JAX), with phalanx's
   grace handling: SIGTERM (StopTrainingJob, a spot interruption) reaches every rank.
3. Streams what the node does to stdout, which SageMaker sends to CloudWatch Logs (one stream per
   instance): each rank's output as ``[rank R] <line>``, the agent's own output as it is, and the
   small files the supervisor needs (the node's result, each rank's error and start record) as
   ``[phalanx] {"file": KIND, ...}`` lines. ``watch`` on the supervisor's side parses them back
   into the job directory (``parse_line``).
With secrets (``--secret VAR=NAME --secrets-from aws``), before the agent starts, each NAME is read
from AWS Secrets Manager with the training job's role (``awssecrets.py``) and handed to the agent's
environment only; a secret that cannot be read fails the node, naming it.

4. On failure writes ``/opt/ml/output/failure`` (SageMaker's FailureReason: the failing rank and
   its error) and exits with the node's exit code.

Every ``/opt/ml`` path is read under ``$PHALANX_SM_ROOT`` when that is set (tests run several
instances on one machine).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from pathlib import Path

from phalanx.backends.sagemaker import layout
from phalanx.core.contracts import LaunchFile, NodeResult, read_node_result, write_launch
from phalanx.core.paths import JobPaths
from phalanx.core.plan import NodePlan
from phalanx.errors import ContractError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, TextIO

RANK_LINE = re.compile(r"^\[rank (\d+)\] (.*)$", re.DOTALL)
FRAME = "[phalanx] "
MAX_LINE = 200_000  # CloudWatch takes events up to 256 KiB; longer lines are split
SCAN = 0.2


def parse_line(line: str) -> tuple[str, Any]:
    """One log line of an instance -> ("rank", (rank, text)), ("frame", dict) or ("agent", text)."""
    if line.startswith(FRAME):
        try:
            frame = json.loads(line[len(FRAME):])
        except ValueError:
            return "agent", line
        if isinstance(frame, dict) and "file" in frame:
            return "frame", frame
        return "agent", line
    match = RANK_LINE.match(line)
    if match:
        return "rank", (int(match.group(1)), match.group(2))
    return "agent", line


def under_root(root: str, data: Any) -> Any:
    """``data`` with every ``/opt/ml`` path moved below ``root`` (nothing to do when root is empty)."""
    if not root:
        return data
    text = json.dumps(data)
    moved = re.sub(r"(?<![\w.\-/])/opt/ml(?=[/\"])", lambda _: json.dumps(root)[1:-1] + "/opt/ml", text)
    return json.loads(moved)


def gpu_count() -> int:
    devices = [d for d in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", d)] if os.path.isdir("/dev") else []
    return len(devices)


class Streamer:
    """Tails this node's rank logs and records into ``out``, one line per event."""

    def __init__(self, paths: JobPaths, attempt: int, out: TextIO) -> None:
        self.paths, self.attempt = paths, attempt
        self.out = out
        self.lock = threading.Lock()
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}
        self.sent: set[str] = set()

    def emit(self, line: str) -> None:
        with self.lock:
            for start in range(0, max(len(line), 1), MAX_LINE):
                self.out.write(line[start:start + MAX_LINE] + "\n")
            self.out.flush()

    def frame(self, kind: str, data: Any, rank: int | None = None) -> None:
        record: dict[str, Any] = {"file": kind, "data": data}
        if rank is not None:
            record["rank"] = rank
        self.emit(FRAME + json.dumps(record, sort_keys=True))

    def scan(self, final: bool = False) -> None:
        paths, attempt = self.paths, self.attempt
        for rank in paths.ranks(attempt):
            self._tail(rank, str(paths.rank_log(attempt, rank)), final)
            for kind, file in (("proc", paths.rank_proc(attempt, rank)), ("error", paths.rank_error(attempt, rank))):
                self._record(kind, rank, str(file))

    def _tail(self, rank: int, path: str, final: bool) -> None:
        try:
            with open(path, "rb") as fh:
                fh.seek(self.offsets.get(path, 0))
                data = fh.read(8 << 20)
        except OSError:
            return
        self.offsets[path] = self.offsets.get(path, 0) + len(data)
        data = self.partial.pop(path, b"") + data
        lines = data.split(b"\n")
        rest = lines.pop()
        if rest and final:
            lines.append(rest)
        elif rest:
            self.partial[path] = rest
        for raw in lines:
            self.emit(f"[rank {rank}] " + raw.decode(errors="replace").rstrip("\r"))

    def _record(self, kind: str, rank: int, path: str) -> None:
        if path in self.sent or not os.path.exists(path):
            return
        try:
            with open(path) as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return  # being written: next scan
        self.sent.add(path)
        self.frame(kind, data, rank)


# What a rank raises when a peer on another instance went away mid-collective (gloo, NCCL).
PEER_GONE = re.compile(r"closed by peer|reset by peer|broken pipe|communicator was aborted|ncclRemoteError|remote process exited",
                       re.IGNORECASE)
PEER_WAIT = 20.0  # seconds a casualty instance leaves the instance that failed to end the job first


def _rank_error(paths: JobPaths, attempt: int, rank: Any) -> dict[str, Any] | None:
    try:
        with open(paths.rank_error(attempt, int(rank))) as fh:
            error = json.load(fh)
    except (OSError, ValueError, TypeError):
        return None
    return error if isinstance(error, dict) else None


def cut_off_by_peer(result: dict[str, Any], paths: JobPaths, attempt: int) -> bool:
    """Whether every rank that failed on this node raised because a peer went away: this node is
    a casualty of a failure elsewhere."""
    failures = result.get("failures") or []
    errors = [_rank_error(paths, attempt, f.get("rank")) for f in failures]
    return bool(failures) and all(e is not None and PEER_GONE.search(f"{e.get('type')}: {e.get('message')}") for e in errors)


def failure_text(result: dict[str, Any], paths: JobPaths, attempt: int) -> str:
    """What SageMaker reports as FailureReason: the first failing rank and its error."""
    failures = sorted(result.get("failures") or [], key=lambda f: f.get("timestamp", 0))
    if not failures:
        return result.get("error") or f"phalanx node agent exited with code {result.get('exitcode')}"
    first = failures[0]
    rank = first.get("rank")
    error = _rank_error(paths, attempt, rank)
    if error is not None:
        what = f"{error.get('type')}: {error.get('message')}"
    else:
        what = f"exit code {first.get('exitcode')}" + (f" ({first['signal']})" if first.get("signal") else "")
    return f"rank {rank} on node {result.get('node_rank')} ({result.get('host')}) failed: {what}"


def prepare(root: str) -> tuple[dict[str, Any], str, int, list[str]]:
    """This node's launch file (written where the agent reads it), its path, rank and the hosts."""
    with open(root + layout.RESOURCE_CONFIG) as fh:
        resources = json.load(fh)
    hosts = list(resources["hosts"])
    node_rank = hosts.index(resources["current_host"])
    with open(f"{root}{layout.DATA}/{layout.CHANNEL}/{layout.LAUNCH}") as fh:
        launch = under_root(root, json.load(fh))
    if len(launch["nodes"]) != len(hosts):
        raise SystemExit(f"phalanx: the plan has {len(launch['nodes'])} nodes but SageMaker started {len(hosts)} hosts")
    node = launch["nodes"][node_rank]
    env = node["env"]
    for key in launch.get("runtime_env", []):
        env[key] = str(gpu_count() if key == "SM_NUM_GPUS" else os.cpu_count() or 1)
    ifname = resources.get("network_interface_name")
    if ifname:
        env.setdefault("SM_NETWORK_INTERFACE_NAME", ifname)
        for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if key not in env and key not in os.environ:
                env[key] = ifname
    env["SM_RESOURCE_CONFIG"] = json.dumps(resources, sort_keys=True)
    job_dir = launch["job_dir"]
    for path in (env.get("PHALANX_STATE_DIR"), env.get("PHALANX_OUTPUT_DIR"), env.get("SM_OUTPUT_DATA_DIR")):
        if path:
            os.makedirs(path, exist_ok=True)
    launch_path = JobPaths(Path(job_dir)).node_launch(launch["attempt"], node_rank)
    launch_path.parent.mkdir(parents=True, exist_ok=True)
    write_launch(launch_path, LaunchFile(NodePlan.from_dict(node), job_dir, launch["attempt"], launch["grace"],
                                         launch.get("sample_interval", 5.0)))
    return launch, str(launch_path), node_rank, hosts


def fetch_secrets(node: "dict[str, Any]", environ: "dict[str, str] | None" = None) -> "dict[str, str]":
    """The node's secrets (``VAR: NAME``) read from AWS Secrets Manager in the node env's region,
    with this instance's credentials (``awssecrets``: standard library only). Raises ValueError
    naming the secret that could not be read (never a value)."""
    from phalanx.backends.sagemaker.awssecrets import get_secret_values

    refs = node.get("secrets") or {}
    env = node.get("env") or {}
    if not refs:
        return {}
    if env.get("PHALANX_SECRETS_FROM") != "aws":
        raise ValueError("the plan names secrets but no place to read them from (--secrets-from aws)")
    source = dict(os.environ if environ is None else environ)
    region = env.get("PHALANX_SECRETS_REGION") or source.get("AWS_REGION") or source.get("AWS_DEFAULT_REGION") or "us-east-1"
    return get_secret_values(refs, region, source)


def run(root: str, out: TextIO, wait: Callable[[float], None] = time.sleep) -> int:
    launch, path, node_rank, hosts = prepare(root)
    secrets = fetch_secrets(launch["nodes"][node_rank])
    paths, attempt = JobPaths(Path(launch["job_dir"])), int(launch["attempt"])
    streamer = Streamer(paths, attempt, out)
    streamer.emit(f"phalanx: node {node_rank} of {len(hosts)} ({hosts[node_rank]}), job {launch['job_id']} attempt {launch['attempt']}")
    # In the node's working directory (the unpacked code), as every backend starts its agents.
    agent = subprocess.Popen([sys.executable, "-u", "-m", "phalanx.launch.agent", "--launch", path], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=launch["nodes"][node_rank]["cwd"],
                             env={**os.environ, **secrets})

    stopped = threading.Event()

    def forward(signum: int, _frame: Any) -> None:  # StopTrainingJob / spot: the agent runs its grace period
        stopped.set()
        if agent.poll() is None:
            agent.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(signum, forward)

    def pump() -> None:
        assert agent.stdout is not None
        for raw in iter(agent.stdout.readline, b""):
            streamer.emit(raw.decode(errors="replace").rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    while agent.poll() is None:
        streamer.scan()
        wait(SCAN)
    reader.join(timeout=5)
    streamer.scan(final=True)
    try:
        reported = read_node_result(paths.node_result(attempt, node_rank))
    except ContractError:
        reported = None
    if reported is None:
        code = agent.returncode
        reported = NodeResult.synthesize(node_rank, 128 - code if code < 0 else code,
                                         f"the node agent ended without a result (exit status {code})", host=hosts[node_rank])
    result = reported.to_dict()
    streamer.frame("result", result)
    if reported.exitcode != 0 and not reported.stopped_by:
        if len(hosts) > 1 and cut_off_by_peer(result, paths, attempt):
            # SageMaker reports the failure file of the instance that ends first. A rank cut off
            # by a peer that raised often ends first: leave that peer's instance the time to end
            # the job with its own reason (SageMaker then stops this one, SIGTERM ends the wait).
            streamer.emit(f"phalanx: this node's ranks lost a peer; waiting up to {PEER_WAIT:g}s for its instance to report first")
            stopped.wait(PEER_WAIT)
        with open(root + layout.FAILURE, "w") as fh:
            fh.write(failure_text(result, paths, attempt)[:1024])
    return reported.exitcode


def main() -> None:
    root = os.environ.get(layout.ROOT_ENV, "").rstrip("/")
    try:
        code = run(root, sys.stdout)
    except (OSError, ValueError, KeyError) as exc:
        message = f"phalanx: cannot start this instance's node: {type(exc).__name__}: {exc}"
        print(message, flush=True)
        try:
            with open(root + layout.FAILURE, "w") as fh:
                fh.write(message[:1024])
        except OSError:
            pass
        code = 1
    sys.stdout.flush()
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
