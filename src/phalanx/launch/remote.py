"""The remote end of an SSH node: ``python -m phalanx.launch.remote``, started over ssh.

It starts the node agent on this host and is the node's only line to the supervisor:

- stdin, first line: JSON ``{"launch": <the node's launch.json>, "stream": bool, "trees":
  {name: dir}}``, with ``"secrets": {VAR: VALUE}`` when the job has secrets: they go into the
  agent's environment only (never into the launch file written here, an argument or a log); then
  control lines ``signal N`` (forwarded to the agent) and ``kill``. End of
  input means the supervisor or the connection is gone: the agent is stopped (SIGTERM, its
  grace, SIGKILL), so nothing is left running on this host when the link breaks;
- stdout (binary, frames only: anything else printing there goes to stderr): frames
  (:class:`~phalanx.launch.frames.Mirror`), read by :class:`~phalanx.launch.frames.Receiver`
  on the supervisor's side, and last ``{"exit":
  code}``. A frame is one JSON line; one that carries file data has ``"b": length`` and is
  followed by exactly that many raw bytes (no base64, no JSON around them: that cost 4x scp's
  time). Frames without ``"r"`` mirror this node's files of the attempt into the supervisor's
  job directory: ``{"f": path, "o": offset, "b"}`` (appended bytes of logs), ``{"f": path,
  "w": 1, "b"}`` (a small file, whole). Frames with ``"r": name`` mirror one of the ``trees``
  (the state and output directories, without a shared filesystem) into the supervisor's copy of
  it: a changed file is sent whole, in chunks ``{"r", "f", "o", "b"}`` of at most :data:`CHUNK`
  bytes, then ``{"r", "f", "n": size, "m": mtime_ns}`` (complete: it replaces the old file) or
  ``{"r", "f", "abort": 1}`` (it changed while being read: dropped, sent again later); ``{"r",
  "f", "x": 1}``: the file was removed. Both ends must be the same phalanx version (the ssh
  backend's preflight checks it).

A tree's files present at start (pushed there by the supervisor) are the baseline, not sent.
A file is sent once it is stable (the same size, mtime and inode at two scans in a row) or at
the final scan, which comes before the exit frame. Temporary names (dot-files, ``*.tmp*``) are
never sent.

With ``PHALANX_AUTO_IFNAME`` in the node env, GLOO/NCCL_SOCKET_IFNAME are set to the interface
that routes to the rendezvous host (on that host itself: the one holding its address, since the
route there is ``lo``), unless the user set them (``netif.interface_for``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from ..core.contracts import LaunchFile, write_launch
from ..core.paths import JobPaths
from .frames import PROTOCOL, Mirror
from .netif import interface_for
from .procs import signal_group

__all__ = ["PROTOCOL", "main"]

SCAN_INTERVAL = 0.2


def _expand_home(value: Any, prefix: str) -> Any:
    if not (prefix == "~" or prefix.startswith("~/")):
        return value
    if isinstance(value, str):
        inside = value == prefix or value.startswith(prefix.rstrip("/") + "/")
        return os.path.expanduser(value) if inside else value
    if isinstance(value, list):
        return [_expand_home(v, prefix) for v in value]
    if isinstance(value, dict):
        return {k: _expand_home(v, prefix) for k, v in value.items()}
    return value


def main() -> None:
    first = sys.stdin.readline()
    if not first:
        raise SystemExit(2)
    # Paths phalanx made under the remote home may start with ~ (that host's home, unknown to
    # the planner): expand those here, and only those (a script's own "~/x" argument stays as typed).
    request = json.loads(first)
    secrets = {str(k): str(v) for k, v in (request.pop("secrets", None) or {}).items()}
    request = _expand_home(request, str(request.get("home") or ""))
    data = request["launch"]
    env = data["node"]["env"]
    if env.pop("PHALANX_AUTO_IFNAME", None):
        master = env.get("PHALANX_NODE_ADDRS", "").split(",")[0]
        ifname = interface_for(master) if master else None
        if ifname:
            for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                env.setdefault(key, ifname)
    # The launch file the supervisor wrote, placed on this host as the agent expects it.
    launch = LaunchFile.from_dict(data, "the launch file sent over ssh")
    node, paths, attempt = launch.node, JobPaths(Path(launch.job_dir)), launch.attempt
    launch_path = paths.node_launch(attempt, node.node_rank)
    write_launch(launch_path, launch)
    os.makedirs(node.cwd, exist_ok=True)
    # PHALANX_OUTPUT_DIR exists before the script starts, as it does for local jobs.
    os.makedirs(paths.output_dir, exist_ok=True)
    trees = {str(name): Path(path) for name, path in (request.get("trees") or {}).items()}
    # Before the agent starts: what the trees hold now is the baseline the supervisor has.
    out = _frames_out()
    mirror = Mirror(paths.attempt(attempt), node.node_rank, out, trees) if request.get("stream", True) else None
    with open(paths.agent_log(attempt, node.node_rank), "ab") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "phalanx.launch.agent", "--launch", str(launch_path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=node.cwd, start_new_session=True,
            env={**os.environ, **secrets},
        )
    grace = launch.grace
    lost = threading.Event()

    def control() -> None:
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["signal"] and len(words) == 2:
                signal_group(agent.pid, int(words[1]))
            elif words[:1] == ["kill"]:
                signal_group(agent.pid, signal.SIGKILL)
        lost.set()  # end of input: nobody controls this node any more

    threading.Thread(target=control, daemon=True).start()
    stop_deadline: float | None = None
    while agent.poll() is None:
        if lost.is_set() and stop_deadline is None:
            signal_group(agent.pid, signal.SIGTERM)
            stop_deadline = time.monotonic() + grace + 5
        if stop_deadline is not None and time.monotonic() > stop_deadline:
            signal_group(agent.pid, signal.SIGKILL)
        if mirror:
            mirror.scan()
        time.sleep(SCAN_INTERVAL)
    code = agent.returncode
    exit_frame = {"exit": 128 - code if code < 0 else code}
    if mirror:
        mirror.scan(final=True)  # everything the node wrote arrives before its exit code
        mirror.frame(exit_frame)
    else:
        out.write(json.dumps(exit_frame).encode() + b"\n")
        out.flush()


def _frames_out() -> IO[bytes]:
    """This process's stdout, for frames alone: whatever else writes to file descriptor 1 from
    now on (a library's print, a C extension) goes to stderr, the supervisor's ``ssh.log``,
    instead of between a frame's header and its bytes."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return out


if __name__ == "__main__":
    main()
