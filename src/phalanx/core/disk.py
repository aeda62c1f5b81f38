"""Running out of disk: recognising it, naming what could not be written, and keeping enough
room to record a job's end when it happens (issue 17, "Faults").

A supervisor holds a small preallocated file (``Reserve``) in the job's directory. When a write
fails for lack of space it stops the ranks (which are what fills the disk), releases the reserve
and records the job FAILED with "disk full while writing <what> under <where>": SQLite needs
free pages for its WAL to commit even a one-row update, so without the reserve the end could not
be recorded and the job would stay RUNNING.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
from pathlib import Path

from ..errors import DiskFull

RESERVE_BYTES = 256 * 1024  # a WAL commit of the job's end (a few pages), attempts.jsonl, result files
# What a new job needs at least before its code snapshot: the reserve, its json files, store pages
START_BYTES = RESERVE_BYTES + 128 * 1024
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write refused for lack of space (or quota)."""
    if isinstance(exc, DiskFull):
        return True
    if isinstance(exc, OSError):
        return exc.errno in FULL_ERRNOS
    if isinstance(exc, sqlite3.OperationalError):
        return "disk is full" in str(exc)  # SQLITE_FULL: "database or disk is full"
    return False


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem holding ``path`` (its nearest existing parent)."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} bytes"


def as_disk_full(exc: BaseException, what: str | None = None, where: Path | None = None) -> DiskFull:
    """``exc`` (which ``is_full``) as a ``DiskFull`` naming the file: ``exc.filename`` when the
    OS gave one, else ``what``/``where``."""
    if isinstance(exc, DiskFull):
        return exc
    name = getattr(exc, "filename", None)
    if name:
        path = Path(name)
        what, where = what or path.name, path.parent
    where = where or Path(".")
    return DiskFull(what or "a file", str(where), f" ({size(free_bytes(where))} free)")


def need(where: Path, needed: int, what: str) -> None:
    """Refuse to start something needing ``needed`` bytes under ``where`` when fewer are free,
    saying how much was needed: better than failing half-way and leaving a half-made job."""
    free = free_bytes(where)
    if free is not None and free < needed:
        raise DiskFull(what, str(where), f": needs about {size(needed)}, {size(free)} free")


class Reserve:
    """``RESERVE_BYTES`` set aside at ``path`` (allocated, not sparse) until ``release``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError as exc:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise as_disk_full(exc, "space reserved to record the job's end", path.parent) if is_full(exc) else exc
        os.close(fd)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)
