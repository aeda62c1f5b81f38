"""How a job's files travel from the Ray nodes to the supervisor: through the Ray job's own log.

The driver's stdout is the Ray job's log, which the supervisor follows through the Jobs API (the
only port of the cluster it may reach). So the driver writes each node's frame stream
(``launch/remote.py``: rank logs, results, metrics, the state and output directories) into it as
text lines, and the supervisor turns them back into each node's byte stream for a ``Receiver``:

    PHX1 <node> <base64>    the next bytes of node <node>'s frames
    PHX1 <node> end         node <node>'s stream is complete (its exit frame came before)
    PHX1 - <json>           an event of the driver: {"pending": ...}, {"placed": [...]},
                            {"lost": {...}}, {"error": "one line"}

Any other line is the driver's (or Ray's) own output. Both ends must be the same phalanx: the
driver is shipped with the job, so they are. Pure: no Ray, no I/O.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, Callable

PREFIX = "PHX1 "
CHUNK = 48 * 1024  # bytes per line: about 64 KiB of text, well within what Ray's log tail reads at once
PYTHON = "@RAY_PYTHON@"  # in a plan: the interpreter Ray runs on the node (the actor substitutes it)


def data_lines(node: int, data: bytes) -> list[str]:
    return [f"{PREFIX}{node} {base64.b64encode(data[i:i + CHUNK]).decode()}\n" for i in range(0, len(data), CHUNK)]


def end_line(node: int) -> str:
    return f"{PREFIX}{node} end\n"


def event_line(event: dict[str, Any]) -> str:
    return f"{PREFIX}- {json.dumps(event, sort_keys=True)}\n"  # ASCII: json escapes the rest


def frame(header: dict[str, Any], data: bytes | None = None) -> bytes:
    """One frame as ``launch/remote.py`` writes it."""
    head = header if data is None else {**header, "b": len(data)}
    return json.dumps(head).encode() + b"\n" + (data or b"")


def lost_frames(node: int, place: dict[str, Any], message: str, attempt: int) -> bytes:
    """The frames a node whose Ray node died can no longer send: its result (killed from outside,
    as a preemption is: ``contracts.NodeResult``, synthesized) and its exit code."""
    from ...core.contracts import NodeResult
    from ...core.paths import JobPaths

    paths = JobPaths(Path("job"))  # the frame names the file relative to the attempt directory
    name = paths.node_result(attempt, node).relative_to(paths.attempt(attempt)).as_posix()
    result = NodeResult.synthesize(node, 137, message, stopped_by="SIGKILL",
                                   host=f"{place.get('ip')} (Ray node {str(place.get('node_id'))[:12]})",
                                   ray_node_id=place.get("node_id"), attempt=attempt)
    body = (json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n").encode()
    return frame({"f": name, "w": 1}, body) + frame({"exit": 137})


class Demux:
    """The supervisor's end: feed it the Ray job's log text as it comes (any chunking); it calls
    ``data(node, bytes)``, ``end(node)``, ``event(dict)`` and ``other(line)`` in order."""

    def __init__(self, data: Callable[[int, bytes], None], end: Callable[[int], None],
                 event: Callable[[dict[str, Any]], None], other: Callable[[str], None]) -> None:
        self.on_data, self.on_end, self.on_event, self.on_other = data, end, event, other
        self.partial = ""
        self.consumed = 0  # characters fed so far: a re-read of the log from its start skips them

    def feed(self, text: str) -> None:
        self.consumed += len(text)
        self.partial += text
        *lines, self.partial = self.partial.split("\n")
        for line in lines:
            self._line(line)

    def close(self) -> None:
        if self.partial:
            self._line(self.partial)
            self.partial = ""

    def _line(self, line: str) -> None:
        if not line.startswith(PREFIX):
            self.on_other(line)
            return
        who, _, rest = line[len(PREFIX):].partition(" ")
        try:
            if who == "-":
                event = json.loads(rest)
                if isinstance(event, dict):
                    self.on_event(event)
            elif rest == "end":
                self.on_end(int(who))
            else:
                self.on_data(int(who), base64.b64decode(rest, validate=True))
        except ValueError:
            self.on_other(line)  # not ours after all: kept as output
