"""The line between the supervisor and a node agent that it keeps from one attempt to the next.

A failed attempt's retry used to start every node agent again: a new interpreter, ``import
torch`` and ``torch.distributed.run`` again (about a second), before the new rendezvous. A kept
agent runs attempt after attempt in the same process, so a retry costs what torchrun's own
in-place restart costs, and the supervisor still decides every retry.

The line is one socket pair, the agent's end passed as ``--control FD``; one JSON object per
line each way:

- supervisor -> agent: ``{"run": LAUNCH, "log": LOG}``: run the attempt of this launch file
  (``node_<n>/launch.json``), its own output going to LOG (the attempt's ``agent.log``); with
  ``"secrets": {VAR: VALUE}`` when the job has secrets, resolved for this attempt (a value changed
  since the agent started reaches the new workers; this line is the only place they travel);
- agent -> supervisor: ``{"ended": ATTEMPT, "exitcode": N}``: the attempt is over and its
  ``result.json`` written; the agent now waits for the next ``run``;
- end of the line: the supervisor closes its end when it starts no further attempt on the agent
  (``release``) or when it dies; the agent then exits. An agent whose end closes died
  (killed, its node lost): the supervisor starts a fresh one for the next attempt.

The agent decides nothing on its own: it never runs an attempt it was not told to run. Stop
signals stop the attempt that runs (as they stop a one-attempt agent); between attempts a stop
signal ends the agent. Both ends are this module, so the wire format has one owner.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any

from .procs import ChildWatcher, wake


class AgentLine:
    """The agent's end: report an attempt's end, wait for the next."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        os.set_inheritable(fd, False)  # the workers must not hold the line open
        self._buffer = b""

    def ended(self, attempt: int, exitcode: int) -> None:
        self._send({"ended": attempt, "exitcode": exitcode})

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.sock.sendall((json.dumps(message) + "\n").encode())
        except OSError:  # the supervisor is gone: next() sees the end of the line
            pass

    def next(self, watcher: ChildWatcher) -> tuple[str, str, dict[str, str]] | None:
        """Block until the supervisor says which attempt to run next: (launch file, log, the
        attempt's secret values). None when the line ends (released, or the supervisor died) or
        a stop signal arrives."""
        while not watcher.stop_requests:
            if b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                try:
                    command = json.loads(line)
                    secrets = {str(k): str(v) for k, v in (command.get("secrets") or {}).items()}
                    return str(command["run"]), str(command["log"]), secrets
                except (ValueError, KeyError, TypeError, AttributeError):
                    return None  # not our protocol: nothing sensible to run
            if watcher.wait(60.0, also=[self.sock.fileno()]):
                try:
                    data = self.sock.recv(65536)
                except OSError:
                    return None
                if not data:
                    return None
                self._buffer += data
        return None


class AgentControl:
    """The supervisor's end: tell a kept agent what to run, hear when each attempt ended.

    A reader thread takes the agent's reports and wakes the supervisor's loop (``procs.wake``),
    so an attempt's end is seen at once, as a child's exit is."""

    def __init__(self) -> None:
        self.sock, self.agent_end = socket.socketpair()
        self.sock.set_inheritable(False)
        self.ends: dict[int, int] = {}  # attempt -> exit code the agent reported
        self.closed = threading.Event()  # the agent's end closed: it exited or was killed
        self._reader: threading.Thread | None = None

    def started(self) -> None:
        """The agent runs and holds its end: drop ours of it and start listening."""
        self.agent_end.close()
        self._reader = threading.Thread(target=self._read, daemon=True, name="phalanx-agent-line")
        self._reader.start()

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    try:
                        message = json.loads(line)
                        self.ends[int(message["ended"])] = int(message["exitcode"])
                    except (ValueError, KeyError, TypeError):
                        continue
                    wake()
        except OSError:
            pass
        self.closed.set()
        wake()

    def run(self, launch: str, log: str, secrets: dict[str, str] | None = None) -> bool:
        """Ask the agent to run the attempt of ``launch`` (with these secret values); False when
        it is gone."""
        if self.closed.is_set():
            return False
        message: dict[str, Any] = {"run": launch, "log": log}
        if secrets:
            message["secrets"] = secrets
        try:
            self.sock.sendall((json.dumps(message) + "\n").encode())
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Let the agent go (it exits when it is between attempts). Idempotent."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
