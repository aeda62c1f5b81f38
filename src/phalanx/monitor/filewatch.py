"""Wait for files to change instead of polling them: Linux inotify through ctypes, with a
fallback to polling wherever events cannot be trusted.

A follower asks :class:`Watch` to report changes to some names in some directories, then
``wait``\\ s: it returns when one of them changed, when another thread calls ``wake``, or at the
timeout. A quiet job costs nothing while a follower waits.

Events are only trusted on local filesystems: a file on NFS or Lustre that a process on another
host appends to (a SLURM rank writing to a shared ``$PHALANX_HOME``) raises no event here. On
any other filesystem, where inotify is missing (not Linux) or refused (the per-user limit of
instances reached), ``wait`` returns after ``fallback`` seconds, and the caller polls as it
would without events (``polling`` says so).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Callable

# inotify(7)
_IN_MODIFY, _IN_CLOSE_WRITE, _IN_MOVED_TO, _IN_CREATE = 0x2, 0x8, 0x80, 0x100
_IN_DELETE_SELF, _IN_Q_OVERFLOW, _IN_IGNORED, _IN_ONLYDIR = 0x400, 0x4000, 0x8000, 0x1000000
_MASK = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE_SELF | _IN_ONLYDIR
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)

# statfs(2) f_type of filesystems whose writes all happen on this machine (so raise events here).
LOCAL_FILESYSTEMS = frozenset({
    0xEF53,      # ext2/3/4
    0x58465342,  # xfs
    0x9123683E,  # btrfs
    0x01021994,  # tmpfs
    0x794C7630,  # overlayfs (containers)
    0x2FC12FC1,  # zfs
    0xF2F52010,  # f2fs
    0x52654973,  # reiserfs
    0x3153464A,  # jfs
})

_IN_ISDIR = 0x40000000
Filter = Callable[[str, bool], bool]  # (entry name, is a directory) -> does a change to it matter?


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1, libc.inotify_add_watch, libc.statfs  # noqa: B018  (present?)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def local_filesystem(path: Path) -> bool:
    """Is ``path`` on a filesystem on which every write raises an inotify event here?"""
    if _LIBC is None:
        return False
    buf = ctypes.create_string_buffer(512)  # struct statfs; f_type is its first field (a long)
    if _LIBC.statfs(os.fsencode(str(path)), buf) != 0:
        return False
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF in LOCAL_FILESYSTEMS


class Watch:
    """Changes to chosen names in chosen directories. Use as a context manager (closes its
    descriptors); ``wake`` may be called from any thread, the rest from one."""

    def __init__(self, fallback: float = 0.1) -> None:
        self.fallback = fallback
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._fd = -1
        self._dirs: dict[int, tuple[Path, Filter]] = {}
        self._paths: set[Path] = set()
        self._untrusted = False
        self._lock = threading.Lock()
        if _LIBC is not None:
            fd = _LIBC.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            self._fd = fd if fd >= 0 else -1  # EMFILE (instances used up): poll instead

    @property
    def polling(self) -> bool:
        """True when some change may raise no event: ``wait`` then returns every ``fallback`` s."""
        return self._fd < 0 or self._untrusted

    def add(self, directory: Path, names: Filter) -> bool:
        """Report changes (created, written, moved in) to entries of ``directory`` for which
        ``names(name, is_dir)`` is true. False when the directory does not exist (yet). Idempotent."""
        if directory in self._paths:
            return True
        if not directory.is_dir():
            return False
        if self._fd < 0:
            self._paths.add(directory)
            return True
        wd = _LIBC.inotify_add_watch(self._fd, os.fsencode(str(directory)), _MASK)  # type: ignore[union-attr]
        if wd < 0:
            if ctypes.get_errno() == errno.ENOENT:
                return False
            self._untrusted = True  # ENOSPC: the watch limit is reached; poll for this one
        else:
            self._dirs[wd] = (directory, names)
        if not local_filesystem(directory):
            self._untrusted = True
        self._paths.add(directory)
        return True

    def wait(self, timeout: float | None) -> bool:
        """Block until a watched name changes, ``wake`` is called, or ``timeout`` (None: no
        limit, unless ``polling``) passes. True when something may have changed."""
        if self.polling:
            timeout = self.fallback if timeout is None else min(timeout, self.fallback)
        deadline = None if timeout is None else time.monotonic() + timeout
        fds = [self._wake_r] + ([self._fd] if self._fd >= 0 else [])
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select(fds, [], [], left)
            if not ready:
                return self.polling
            woken = self._wake_r in ready and self._drain_wake()
            if (self._fd in ready and self._read_events()) or woken:
                return True
            # only names nobody asked about changed (a rank's metrics file): keep waiting

    def wake(self) -> None:
        """Make ``wait`` return now (from another thread: e.g. the job has ended)."""
        with self._lock:
            if self._wake_w >= 0:
                try:
                    os.write(self._wake_w, b"x")
                except BlockingIOError:
                    pass  # a wake-up is pending already

    def close(self) -> None:
        with self._lock:
            for fd in (self._fd, self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._fd = self._wake_r = self._wake_w = -1

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _drain_wake(self) -> bool:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass
        return True

    def _read_events(self) -> bool:
        relevant = False
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return relevant
            pos = 0
            while pos + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, pos)
                name = data[pos + _EVENT.size:pos + _EVENT.size + size].rstrip(b"\0").decode(errors="replace")
                pos += _EVENT.size + size
                if mask & (_IN_Q_OVERFLOW | _IN_DELETE_SELF | _IN_IGNORED):
                    relevant = True  # events were lost, or a directory went: look at everything
                    continue
                watched = self._dirs.get(wd)
                if watched is not None and watched[1](name, bool(mask & _IN_ISDIR)):
                    relevant = True
