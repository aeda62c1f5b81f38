"""Moving files between this machine and any fsspec store: concurrent, retried, atomic, checked.

Shared by input channels, output uploads and ``phalanx download``:

- **atomic**: a download goes to a temporary name (in a ``partial`` directory beside its
  destination) and is renamed into place only once complete and checked, so a complete file
  is never replaced by part of one. An upload to object storage is a single PUT, or a
  multipart upload that only becomes visible when completed; to a local path it is a
  temporary name and a rename.
- **retried**: every file up to ``ATTEMPTS`` times with backoff; the error names the file.
- **checked**: the size after every transfer (against the listing, or the source file); files
  whose sha256 is known (phalanx's own upload manifests) are hashed and compared as well.
- **progress**: a bar on a terminal, otherwise a line every ``REPORT_EVERY`` seconds for
  transfers that take that long.

Endpoints and credentials come from each store's standard configuration (for S3:
``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``..., ``~/.aws/config``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import MissingDependency, PhalanxError

ATTEMPTS = 4
BACKOFF = 0.5  # seconds before the first retry; doubles each time
CONCURRENCY = 32  # files in flight at once (async stores); local copies use fewer threads
REPORT_EVERY = 10.0
MULTIPART_CHUNK = 16 * 2**20  # bytes per part of a multipart upload to S3


class TransferError(PhalanxError):
    pass


def filesystem(uri: str) -> tuple[Any, str]:
    """The fsspec filesystem and path of ``uri`` (a local path or ``scheme://...``)."""
    try:
        import fsspec
    except ImportError:
        raise MissingDependency("fsspec", "storage") from None
    try:
        fs, path = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as exc:
        raise TransferError(f"cannot open '{uri}': {exc}", "install the store's fsspec package, e.g. pip install s3fs") from None
    return fs, path.rstrip("/") or path


def check_store(fs: Any, root: str, uri: str, fix: str, what: str = "", error: type[PhalanxError] | None = None) -> None:
    """Fail now, with a clear message, if the bucket (or a local top directory) of ``uri`` is not there."""
    error = error or TransferError
    if is_local(fs) or "://" not in uri or uri.startswith(("http://", "https://")):
        return
    bucket = root.split("/", 1)[0]
    try:
        fs.info(bucket)  # unlike exists(), tells a missing bucket from an unreachable store
    except FileNotFoundError:
        raise error(f"bucket '{bucket}' of '{uri}' does not exist", f"create it, or fix {fix}") from None
    except Exception as exc:  # noqa: BLE001 - the client's errors (no credentials, no route) are not OSErrors
        raise error(f"cannot reach the store of {what or repr(uri)}: {_why(exc)}",
                    "check the endpoint (AWS_ENDPOINT_URL) and the credentials") from None


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def os_path(fs: Any, path: str) -> str:
    """``path`` as the operating system names it when ``fs`` is this machine's disk (a ``file://``
    URL loses its scheme: os.replace and os.path read plain paths), else unchanged."""
    return str(fs._strip_protocol(path)) if is_local(fs) else path


def write_bytes(fs: Any, path: str, data: bytes) -> None:
    """Write a small object whole: one PUT on object storage, a temporary name and a rename locally."""
    path = os_path(fs, path)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    if is_local(fs):
        part = f"{path}.{secrets.token_hex(4)}.part"
        fs.pipe_file(part, data)
        fs.mv(part, path)
    else:
        fs.pipe_file(path, data)


def sha256_file(path: str | Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


@dataclass(frozen=True)
class Item:
    """One file to move: ``src`` and ``dst`` are a local path and a path on the store."""

    src: str
    dst: str
    size: int | None = None  # expected size (downloads: from the listing)
    sha256: str | None = None  # expected digest, when known
    grows: bool = False  # an append-only file (a log) that may grow while it is sent


# -- progress ---------------------------------------------------------------------


class Progress:
    """Bytes moved out of a known total: a bar on a terminal, else a line now and then."""

    def __init__(self, label: str, total: int, say: Callable[[str], None] | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.say = say
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Any = None
        self.started = time.monotonic()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes

    def __enter__(self) -> "Progress":
        if sys.stderr.isatty() and self.total > 0:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress as Bar, TextColumn, TransferSpeedColumn

            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                            console=Console(stderr=True), transient=True)
            self._task = self._bar.add_task(self.label, total=self.total)
            self._bar.start()
        self._thread = threading.Thread(target=self._report, name="phalanx-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        if self._bar is not None:
            self._bar.stop()

    def _report(self) -> None:
        next_line = self.started + REPORT_EVERY
        while not self._stop.wait(0.2 if self._bar is not None else 1.0):
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done)
            elif self.say and time.monotonic() >= next_line:
                next_line += REPORT_EVERY
                self.say(self.line())

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        return f"{self.label}: {human_size(self.done)} of {human_size(self.total)}{pct}, {human_size(self.done / elapsed)}/s"


def human_size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def _callback(progress: Progress | None) -> Any:
    """An fsspec callback that feeds ``progress``; ``undo()`` takes back a failed try's bytes."""
    from fsspec.callbacks import Callback

    class Counted(Callback):  # type: ignore[misc]
        moved = 0

        def relative_update(self, inc: int = 1) -> None:
            self.moved += inc
            if progress is not None:
                progress.add(inc)

        def absolute_update(self, value: int) -> None:
            self.relative_update(value - self.moved)

        def undo(self) -> None:
            if progress is not None:
                progress.add(-self.moved)
            self.moved = 0

    return Counted()


# -- transfers --------------------------------------------------------------------


def download(fs: Any, items: Sequence[Item], partial: Path, progress: Progress | None = None) -> None:
    """Fetch ``item.src`` (on ``fs``) to the local path ``item.dst`` for every item.

    Each file lands in ``partial`` first and is renamed into place when complete and checked.
    Raises TransferError naming the first file that could not be fetched.
    """
    partial.mkdir(parents=True, exist_ok=True)

    def fetch(item: Item) -> Any:
        tmp = partial / f"{Path(item.dst).name}.{secrets.token_hex(4)}"
        return tmp, lambda cb: _get_one(fs, item, str(tmp), cb)

    try:
        _run(fs, items, fetch, _finish_download, progress)
    finally:
        try:
            partial.rmdir()
        except OSError:
            pass


def _get_one(fs: Any, item: Item, tmp: str, cb: Any) -> Any:
    if fs.async_impl:
        return fs._get_file(item.src, tmp, callback=cb)
    fs.get_file(item.src, tmp, callback=cb)
    return None


def _finish_download(item: Item, tmp: Path) -> None:
    size = tmp.stat().st_size
    if item.size is not None and size != item.size:
        raise TransferError(f"'{item.src}' arrived with {size} bytes, expected {item.size}", "it was fetched again")
    if item.sha256 and sha256_file(tmp) != item.sha256:
        raise TransferError(f"'{item.src}' arrived with a different sha256 than recorded", "it was fetched again")
    Path(item.dst).parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, item.dst)


def upload(fs: Any, items: Sequence[Item], progress: Progress | None = None) -> None:
    """Send the local file ``item.src`` to ``item.dst`` on ``fs`` for every item; checks each
    arrived size. Raises TransferError naming the first file that could not be sent."""
    local = is_local(fs)

    def send(item: Item) -> Any:
        dst = f"{os_path(fs, item.dst)}.{secrets.token_hex(4)}.part" if local else item.dst
        return dst, lambda cb: _put_one(fs, item, dst, cb)

    def finish(item: Item, dst: str) -> None:
        expected = item.size if item.size is not None else os.path.getsize(item.src)
        arrived = os.path.getsize(dst) if local else int(fs.info(dst).get("size") or 0)
        if arrived != expected and not (item.grows and expected <= arrived <= os.path.getsize(item.src)):
            raise TransferError(f"'{item.dst}' holds {arrived} bytes after the upload, expected {expected}", "it was sent again")
        if local:
            os.replace(dst, os_path(fs, item.dst))

    _run(fs, items, send, finish, progress)


def _put_one(fs: Any, item: Item, dst: str, cb: Any) -> Any:
    if fs.async_impl:
        return fs._put_file(item.src, dst, callback=cb, **_put_options(fs, item))
    fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)
    fs.put_file(item.src, dst, callback=cb)
    return None


def _put_options(fs: Any, item: Item) -> dict[str, Any]:
    """S3: parts of 16 MiB (s3fs's 50 MiB default sends large files in few, slow parts), more
    for files so large that they would need over 9,000 parts (S3 allows 10,000)."""
    if "s3" not in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        return {}
    size = item.size if item.size is not None else os.path.getsize(item.src)
    return {"chunksize": max(MULTIPART_CHUNK, -(-size // 9000))}


def _run(fs: Any, items: Sequence[Item], start: Callable[[Item], Any], finish: Callable[[Item, Any], None],
         progress: Progress | None) -> None:
    """Move every item with retries: concurrently on the store's event loop when it has one,
    else on a few threads."""
    if not items:
        return
    if fs.async_impl:
        from fsspec.asyn import sync

        async def all_items() -> None:
            gate = asyncio.Semaphore(CONCURRENCY)

            async def one(item: Item) -> None:
                async with gate:
                    await _with_retries_async(item, start, finish, progress)

            await asyncio.gather(*(one(i) for i in items))

        sync(fs.loop, all_items)
        return
    with ThreadPoolExecutor(max_workers=min(4, len(items))) as pool:
        for future in [pool.submit(_with_retries, item, start, finish, progress) for item in items]:
            future.result()


def _retry_wait(item: Item, attempt: int, exc: BaseException) -> float:
    """Seconds to wait before the next try; raises when there is none (or no point in one)."""
    if attempt + 1 >= ATTEMPTS or isinstance(exc, (FileNotFoundError, PermissionError)):
        raise TransferError(f"copying '{item.src}' to '{item.dst}' failed after {attempt + 1} attempt(s): {_why(exc)}",
                            "check the connection and credentials, then run again") from exc
    return BACKOFF * 2**attempt


def _with_retries(item: Item, start: Callable[[Item], Any], finish: Callable[[Item, Any], None],
                  progress: Progress | None) -> None:
    for attempt in range(ATTEMPTS):
        cb = _callback(progress)
        tmp, go = start(item)
        try:
            go(cb)
            finish(item, tmp)
            return
        except Exception as exc:  # noqa: BLE001 - every failure of one try is retried
            cb.undo()
            _discard(tmp)
            time.sleep(_retry_wait(item, attempt, exc))


async def _with_retries_async(item: Item, start: Callable[[Item], Any], finish: Callable[[Item, Any], None],
                              progress: Progress | None) -> None:
    loop = asyncio.get_running_loop()
    for attempt in range(ATTEMPTS):
        cb = _callback(progress)
        tmp, go = start(item)
        try:
            await go(cb)
            await loop.run_in_executor(None, finish, item, tmp)  # hashing and renames off the loop
            return
        except Exception as exc:  # noqa: BLE001 - every failure of one try is retried
            cb.undo()
            _discard(tmp)
            await asyncio.sleep(_retry_wait(item, attempt, exc))


def _discard(tmp: Any) -> None:
    """Remove a try's temporary local file (object-store uploads leave nothing to remove)."""
    if isinstance(tmp, Path) or (isinstance(tmp, str) and tmp.endswith(".part") and os.path.isabs(tmp)):
        try:
            os.unlink(tmp)
        except OSError:
            pass


# -- listings ---------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteFile:
    rel: str  # path below the listed root ("" root itself is a file: its base name)
    path: str  # full path on the store
    size: int
    version: str  # ETag, mtime or similar: changes when the content does


def list_files(fs: Any, root: str) -> list[RemoteFile]:
    """Every file at or below ``root`` (a single file lists as itself). FileNotFoundError if none."""
    info = fs.info(root)
    if info.get("type") != "directory":
        return [_remote(info, root, root.rstrip("/").rsplit("/", 1)[-1])]
    found = fs.find(root, detail=True)
    prefix = root.rstrip("/") + "/"
    return sorted(
        (_remote(meta, path, path[len(prefix):]) for path, meta in found.items()
         if meta.get("type") != "directory" and path.startswith(prefix)),
        key=lambda f: f.rel,
    )


def local_path(root: Path, rel: str) -> Path:
    """``root / rel`` for a name that came from a store; refuses names that would leave ``root``."""
    if rel.startswith("/") or ".." in rel.split("/"):
        raise TransferError(f"refusing '{rel}': the name leaves {root}", "rename the object at the source")
    return root / rel


def _remote(meta: dict[str, Any], path: str, rel: str) -> RemoteFile:
    version = meta.get("ETag") or meta.get("etag") or meta.get("md5Hash") or meta.get("mtime") or meta.get("LastModified") or ""
    return RemoteFile(rel=rel, path=path, size=int(meta.get("size") or 0), version=str(version).strip('"'))
