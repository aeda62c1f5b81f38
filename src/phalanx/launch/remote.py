"""The remote end of an SSH node: ``python -m phalanx.launch.remote``, started over ssh.

It starts the node agent on this host and is the node's only line to the supervisor:

- stdin, first line: JSON ``{"launch": <the node's launch.json>, "stream": bool}``; then control
  lines ``signal N`` (forwarded to the agent) and ``kill``. End of input means the supervisor or
  the connection is gone: the agent is stopped (SIGTERM, its grace, SIGKILL), so nothing is
  left running on this host when the link breaks;
- stdout: JSON frames that mirror this node's files of the attempt into the supervisor's job
  directory: ``{"f": path, "o": offset, "d": base64}`` (appended bytes of logs),
  ``{"f": path, "w": base64}`` (a small file, whole), and last ``{"exit": code}``.

With ``PHALANX_AUTO_IFNAME`` in the node env, GLOO/NCCL_SOCKET_IFNAME are set to the interface
that routes to the rendezvous host, unless the user set them.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .netif import interface_for
from .procs import signal_group

SCAN_INTERVAL = 0.2
WHOLE_FILES = (".json",)  # rewritten in place (atomically): sent whole when they change


class Mirror:
    """Sends what changed in this node's files of the attempt since the last scan: its
    ``node_<n>/`` directory and the ``rank_<r>/`` directories of its ranks."""

    def __init__(self, root: Path, node_rank: int, out: Any) -> None:
        self.root = root
        self.node_rank = node_rank
        self.out = out
        self.sent: dict[str, tuple[int, float]] = {}
        self.rank_nodes: dict[str, int] = {}
        self.lock = threading.Lock()

    def _mine(self, top: str) -> bool:
        if top == f"node_{self.node_rank}":
            return True
        if not top.startswith("rank_"):
            return False
        if top not in self.rank_nodes:
            try:
                self.rank_nodes[top] = int(json.loads((self.root / top / "proc.json").read_text())["node_rank"])
            except (OSError, ValueError, KeyError):
                return False  # not started yet (or another host's, on a shared home)
        return self.rank_nodes[top] == self.node_rank

    def scan(self) -> None:
        if not self.root.exists():
            return
        for path in sorted(self.root.rglob("*")):
            if not path.is_file() or path.name.startswith(".") or ".tmp" in path.name:
                continue
            if not self._mine(path.relative_to(self.root).parts[0]):
                continue
            rel = path.relative_to(self.root).as_posix()
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            size, mtime = self.sent.get(rel, (0, 0.0))
            if path.suffix in WHOLE_FILES:
                if (st.st_size, st.st_mtime) != (size, mtime):
                    self._frame({"f": rel, "w": base64.b64encode(path.read_bytes()).decode()})
                    self.sent[rel] = (st.st_size, st.st_mtime)
            elif st.st_size > size:
                with open(path, "rb") as fh:
                    fh.seek(size)
                    data = fh.read(st.st_size - size)
                self._frame({"f": rel, "o": size, "d": base64.b64encode(data).decode()})
                self.sent[rel] = (size + len(data), st.st_mtime)

    def _frame(self, frame: dict[str, Any]) -> None:
        with self.lock:
            self.out.write(json.dumps(frame) + "\n")
            self.out.flush()


def main() -> None:
    first = sys.stdin.readline()
    if not first:
        raise SystemExit(2)
    # Paths in the plan may start with ~ (the remote home, unknown to the planner): expand here.
    home = os.path.expanduser("~")
    request = json.loads(first.replace('"~/', json.dumps(home + "/")[:-1]))
    launch = request["launch"]
    node = launch["node"]
    env = node["env"]
    if env.pop("PHALANX_AUTO_IFNAME", None):
        master = env.get("PHALANX_NODE_ADDRS", "").split(",")[0]
        ifname = interface_for(master) if master else None
        if ifname:
            for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                env.setdefault(key, ifname)
    attempt_dir = Path(launch["job_dir"]) / f"attempt_{launch['attempt']}"
    node_dir = attempt_dir / f"node_{node['node_rank']}"
    node_dir.mkdir(parents=True, exist_ok=True)
    launch_path = node_dir / "launch.json"
    launch_path.write_text(json.dumps(launch))
    os.makedirs(node["cwd"], exist_ok=True)
    with open(node_dir / "agent.log", "ab") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "phalanx.launch.agent", "--launch", str(launch_path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=node["cwd"], start_new_session=True,
        )
    grace = float(launch.get("grace", 30))
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
    mirror = Mirror(attempt_dir, int(node["node_rank"]), sys.stdout) if request.get("stream", True) else None
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
    if mirror:
        mirror.scan()
    code = agent.returncode
    sys.stdout.write(json.dumps({"exit": 128 - code if code < 0 else code}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
