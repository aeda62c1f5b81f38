"""Long answers as one HTTP stream: a face call that blocks and writes as it goes (``logs -f``, a
foreground run, a stop that says what it waits for) runs in a thread of its own and its output
reaches the client as it is produced, as JSON lines (``application/x-ndjson``):

    {"out": "text"}        output (logs, a run's ranks), exactly as a local command prints it
    {"event": "text"}      one of phalanx's own lines (``phalanx: ...`` on stderr)
    {"started": {...}}     a foreground run's job, once it exists
    {"row": {...}}         one row of a listing
    {"result": ...}        the call's answer, last
    {"error": {...}}       instead of a result: what went wrong (``wire.error_body``)

and an empty line every ``HEARTBEAT`` seconds while nothing else comes, so a proxy does not
cut a quiet stream and a client that went away is noticed. The thread writes through a
``Sink``; once the client is gone every write raises ``Disconnected``, which ends the call
(a job a foreground run started keeps running, as after ``run -d``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, AsyncIterator, Callable

from ..api import wire
from ..errors import PhalanxError

HEARTBEAT = 10.0
_DONE = object()


class Disconnected(Exception):
    """The client of a stream went away."""


class Sink:
    """Where a streaming call writes (from its own thread). Blocks while the client is slow
    (a bounded queue), raises ``Disconnected`` once it is gone."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any], room: int = 64) -> None:
        self._loop, self._queue = loop, queue
        # The bound on what waits in the queue, kept on this side: a send with room hands its item
        # over without waiting for the event loop (a listing's rows go out as fast as they are made).
        self.room = threading.Semaphore(room)
        self.gone = threading.Event()

    def send(self, item: Any) -> None:
        while not self.room.acquire(timeout=1.0):
            if self.gone.is_set():
                raise Disconnected()
        if self.gone.is_set():
            raise Disconnected()
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is going away
            raise Disconnected() from None

    def out(self, text: str) -> None:
        if text:
            self.send({"out": text})
        elif self.gone.is_set():  # an empty write is a follower's heartbeat: stop if nobody listens
            raise Disconnected()

    def event(self, text: str) -> None:
        self.send({"event": text})


class Writer:
    """A file-like ``out`` for the face's calls that print (``follow_attempts``)."""

    def __init__(self, sink: Sink) -> None:
        self._sink = sink

    def write(self, text: str) -> int:
        self._sink.out(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def internal(exc: BaseException) -> dict[str, Any]:
    """A bug's answer: one line for the client, the traceback in the server's log."""
    import logging

    logging.getLogger("phalanx.server").error("internal error", exc_info=exc)
    return {"type": "PhalanxError", "message": f"the server failed: {type(exc).__name__}: {exc}",
            "hint": "this is a bug in phalanx: see the server's log and report it", "exit_code": 1}


def stream(work: Callable[[Sink], Any], name: str = "phalanx-stream") -> AsyncIterator[bytes]:
    """The JSON lines of ``work(sink)`` run in a thread: what it sends, then its result (or error)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()  # bounded by the sink's room
    sink = Sink(loop, queue)

    def run() -> None:
        try:
            last: Any = {"result": work(sink)}
        except Disconnected:
            return
        except PhalanxError as exc:
            last = {"error": wire.error_body(exc)}
        except Exception as exc:  # noqa: BLE001 - the client gets one line, the server log the rest
            last = {"error": internal(exc)}
        try:
            sink.send(last)
            sink.send(_DONE)
        except Disconnected:
            pass

    async def lines() -> AsyncIterator[bytes]:
        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), HEARTBEAT)
                except asyncio.TimeoutError:
                    yield b"\n"
                    continue
                # What else is waiting goes out in the same write (one chunk, not one per row).
                items = [item]
                while items[-1] is not _DONE and not queue.empty():
                    items.append(queue.get_nowait())
                for _ in items:
                    sink.room.release()
                done = items[-1] is _DONE
                chunk = b"".join(json.dumps(one, default=str).encode() + b"\n" for one in items if one is not _DONE)
                if chunk:
                    yield chunk
                if done:
                    return
        finally:
            sink.gone.set()

    return lines()
