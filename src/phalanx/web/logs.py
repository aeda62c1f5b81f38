"""A rank's log for the dashboard: its tail, what was appended since (follow), and search over
the whole file; a failed job's collateral traces folded. Every path goes through
``jobview.job_file`` (never a file outside the job)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from ..core.paths import JobPaths
from ..core.state import JobState, is_terminal
from ..errors import UsageError
from ..store import JobRecord
from .jobview import job_file

LOG_CHUNK = 256 * 1024  # bytes of log per request: the tail first, older parts on demand
MAX_LOG_CHUNK = 4 * 1024 * 1024
MAX_MATCHES = 1000


def _log_path(record: JobRecord, attempt: int | None, rank: int) -> tuple[int, Path]:
    paths = JobPaths(Path(record.job_dir))
    attempt = record.attempt if attempt is None else attempt
    if attempt < 0 or rank < 0:
        raise UsageError("attempt and rank must be 0 or more", "e.g. ?rank=0&attempt=0")
    return attempt, job_file(record, paths.rank_log(attempt, rank))


def read_log(record: JobRecord, rank: int, attempt: int | None = None, offset: int | None = None,
             limit: int = LOG_CHUNK) -> dict[str, Any]:
    """A piece of a rank's log: from ``offset`` (default: the last ``limit`` bytes, from a line
    start) up to the last complete line, or to the end once the job has ended."""
    attempt, path = _log_path(record, attempt, rank)
    limit = max(1, min(int(limit), MAX_LOG_CHUNK))
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            start = max(0, size - limit) if offset is None else max(0, min(int(offset), size))
            fh.seek(start)
            data = fh.read(limit)
    except FileNotFoundError:
        return {"rank": rank, "attempt": attempt, "offset": 0, "next": 0, "size": 0, "text": "", "exists": False}
    if offset is None and start > 0:
        cut = data.find(b"\n") + 1  # begin at a line start
        start, data = start + cut, data[cut:]
    if not is_terminal(record.state) or start + len(data) < size:
        data = data[: data.rfind(b"\n") + 1]  # a line still being written comes next time
    shown, fold = _folded(record, attempt, rank, start, data)
    return {"rank": rank, "attempt": attempt, "offset": start, "next": start + len(data), "size": size,
            "text": shown.decode("utf-8", errors="replace"), "fold": fold, "exists": True}


def _folded(record: JobRecord, attempt: int, rank: int, start: int, data: bytes) -> tuple[bytes, dict[str, Any] | None]:
    """``data`` (from ``start`` in the rank's log) split where a rank that lost its peer after
    the root cause began its collateral trace (``api/failure.py``): what is shown, and the rest
    under its one line (the page folds it)."""
    if record.state is not JobState.FAILED or not data:
        return data, None
    from ..api.failure import failure

    failed = failure(record, attempt)
    lost = next((p for p in failed.peer_lost if p.rank == rank), None) if failed is not None else None
    if lost is None or lost.fold_at is None or lost.fold_at >= start + len(data):
        return data, None
    cut = max(0, lost.fold_at - start)
    return data[:cut], {"line": lost.line, "error": lost.error, "lines": lost.folded_lines,
                        "text": data[cut:].decode("utf-8", errors="replace")}


def search_log(record: JobRecord, rank: int, query: str, attempt: int | None = None,
               max_matches: int = MAX_MATCHES) -> dict[str, Any]:
    """Lines of a rank's log containing ``query`` (case-insensitive), with line numbers."""
    attempt, path = _log_path(record, attempt, rank)
    needle = query.lower().encode()
    matches: list[dict[str, Any]] = []
    truncated = False
    try:
        with open(path, "rb") as fh:
            for number, line in enumerate(fh, 1):
                if needle in line.lower():
                    if len(matches) >= max_matches:
                        truncated = True
                        break
                    matches.append({"line": number, "text": line.rstrip(b"\r\n").decode("utf-8", errors="replace")})
    except FileNotFoundError:
        pass
    return {"rank": rank, "attempt": attempt, "query": query, "matches": matches, "truncated": truncated}


def follow_log(get: Callable[[], JobRecord], rank: int, attempt: int | None, offset: int | None,
               send: Callable[[dict[str, Any]], None], gone: threading.Event) -> None:
    """The dashboard's ``follow``: each new piece of a rank's log (``read_log``'s pieces) sent as
    it is written, woken by the file changing (``monitor/filewatch.Watch``), not by asking
    again; ``{"end": true}`` once the job has ended and everything was sent. Blocking; ends
    early when ``gone`` is set (the page went away)."""
    from ..monitor.filewatch import Watch
    from ..monitor.tail import LIVENESS_S

    record = get()
    attempt, path = _log_path(record, attempt, rank)
    with Watch(fallback=0.5) as watch:
        while not gone.is_set():
            watch.add(path.parent.parent, lambda name, is_dir: is_dir)  # the rank's directory appearing
            watch.add(path.parent, lambda name, is_dir: name == path.name)
            piece = read_log(record, rank, attempt, offset)
            if piece["text"] or piece.get("fold") or offset is None:
                send(piece)
            offset = piece["next"]
            if is_terminal(record.state) and offset >= piece["size"]:
                send({"end": True, "state": record.state.value})
                return
            watch.wait(LIVENESS_S)
            record = get()


def log_events(get: Callable[[], JobRecord], rank: int, attempt: int | None, offset: int | None) -> AsyncIterator[bytes]:
    """``follow_log`` as the bytes of Server-Sent Events: it runs in a thread of its own (it
    blocks on the file changing), its pieces cross to the event loop through a bounded queue,
    a comment every 15 s keeps a quiet answer open, and the thread stops once the page is gone.
    Call on the event loop."""
    import asyncio
    import json

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=32)
    gone = threading.Event()

    def send(item: Any) -> None:
        if loop.is_closed():  # the server is shutting down: nobody is left to read
            return
        put = queue.put(item)
        try:
            future = asyncio.run_coroutine_threadsafe(put, loop)
        except RuntimeError:  # closed between the check and the call
            put.close()
            return
        while not gone.is_set():
            try:
                future.result(timeout=1.0)
                return
            except TimeoutError:
                continue
        future.cancel()

    def work() -> None:
        from ..errors import PhalanxError

        try:
            follow_log(get, rank, attempt, offset, send, gone)
        except PhalanxError as exc:
            send({"error": str(exc)})
        finally:
            send(None)

    async def events() -> AsyncIterator[bytes]:
        threading.Thread(target=work, name="phalanx-ui-follow", daemon=True).start()
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), 15.0)
                except asyncio.TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                if item is None:
                    return
                yield b"data: " + json.dumps(item).encode() + b"\n\n"
        finally:
            gone.set()

    return events()
