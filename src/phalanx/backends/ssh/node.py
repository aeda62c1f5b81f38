"""One node of an ssh job: the agent on a host, spoken to through one ssh session.

The session runs ``python -m phalanx.launch.remote`` on the host. Its stdin carries the launch
file (and the job's secret values, which thus travel inside the encrypted session and never on a
command line, in a file or in ``ps``), then control lines (``signal N``, ``kill``); its stdout carries the node's files as frames
(``launch/frames.py``), written here into the local job directory as they come, so ``collect``
has nothing left to do. Closing the session stops the node: nothing is left on the host.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
from dataclasses import replace
from pathlib import Path
from typing import IO

from ...core.contracts import LaunchFile, NodeResult
from ...core.paths import JobPaths
from ...launch.frames import Receiver
from .. import commands
from ..base import NodeHandle, synthesize


class SshNode(NodeHandle):
    """A node agent on a host, controlled through the ssh session's stdin; its files mirrored back."""

    kill_margin = 15.0

    def __init__(self, ssh_argv: list[str], launch: LaunchFile, paths: JobPaths, stream: bool,
                 trees: dict[str, tuple[str, Path]] | None = None, home: str = "",
                 secrets: dict[str, str] | None = None) -> None:
        node = launch.node
        self.node_rank = node.node_rank
        self.host = node.host
        self.paths, self.attempt = paths, launch.attempt
        self.exit: int | None = None
        self._result: NodeResult | None = None
        trees = trees or {}
        self.receiver = Receiver(paths.attempt(launch.attempt), {name: local for name, (_, local) in trees.items()},
                                 tag=str(node.node_rank))
        remote_cmd = f"exec {shlex.quote(node.agent_argv[0])} -m phalanx.launch.remote"
        self.proc = commands.link([*ssh_argv, remote_cmd], paths.ssh_log(launch.attempt, node.node_rank))
        assert self.proc.stdin is not None and self.proc.stdout is not None
        # ``home``: the remote home the plan's paths start with (``~/...``); the remote end expands
        # ``~`` only under it, so a script's own ``~/x`` argument reaches it as typed.
        request = {"launch": launch.to_dict(), "stream": stream, "home": home,
                   "trees": {name: remote for name, (remote, _) in trees.items()}}
        if secrets:
            request["secrets"] = secrets  # into the agent's environment there (launch/remote.py)
        self._send(json.dumps(request))
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _send(self, line: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((line + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def _read(self, stream: IO[bytes]) -> None:
        self.exit = self.receiver.receive(stream)

    def poll(self) -> NodeResult | None:
        """The node's result once its connection ended *and* every frame before it was
        written: the supervisor's state and output uploads then see complete files."""
        if self._result is None:
            if self.proc.poll() is None or self._reader.is_alive():
                return None
            if self.exit is not None:  # the agent's report came with its exit, unless it was killed
                self._result = synthesize(self.paths, self.attempt, NodeResult.synthesize(
                    self.node_rank, self.exit, f"node agent on {self.host} ended without a report", host=self.host))
                return self._result
            # The connection ended without the node's exit: the host is lost, whatever the
            # node had reported before (its end was not seen).
            lost = NodeResult.synthesize(self.node_rank, 255, f"the connection to {self.host} ended without the "
                                         f"node's exit (see {self.paths.ssh_log(self.attempt, self.node_rank)})",
                                         host=self.host)
            reported = synthesize(self.paths, self.attempt, lost)
            # A report that came before the link broke still says which ranks failed.
            self._result = reported if reported.synthesized else replace(reported, exitcode=255, stopped_by=None)
        return self._result

    def signal(self, signum: int) -> None:
        self._send(f"signal {int(signum)}")

    def kill(self) -> None:
        self._send("kill")
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
