"""Watching child processes without busy-waiting, and stopping process groups.

``ChildWatcher`` wakes the main loop the moment a child exits (SIGCHLD) or a stop signal
arrives (SIGTERM/SIGINT/...), through ``signal.set_wakeup_fd``; otherwise it sleeps until
the next tick. Used by the node agent and the supervisor alike. Main thread only.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from _thread import allocate_lock  # not threading: workers import this module, and no script sees it
from collections.abc import Callable, Iterable, Sequence  # not typing: workers import this module

TYPE_CHECKING = False  # mypy reads this as True; workers start without importing typing
if TYPE_CHECKING:
    from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)

# The write end of the active watcher's wake-up pipe, for ``wake`` (one watcher at a time: the
# wake-up fd of ``signal`` is one per process too). The lock keeps a late ``wake`` from writing
# into a closed pipe's number, which an open() may have reused.
_wake_fd: int | None = None
_wake_lock = allocate_lock()


class ChildWatcher:
    def __init__(self, stop_signals: Iterable[int] = STOP_SIGNALS) -> None:
        self.stop_requests: list[int] = []
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._old_fd = signal.set_wakeup_fd(self._write)
        global _wake_fd
        with _wake_lock:
            self._old_wake, _wake_fd = _wake_fd, self._write
        self._old_handlers: dict[int, Any] = {signal.SIGCHLD: signal.signal(signal.SIGCHLD, _ignore)}
        for signum in stop_signals:
            self._old_handlers[signum] = signal.signal(signum, self._on_stop)

    def _on_stop(self, signum: int, _frame: object) -> None:
        self.stop_requests.append(signum)

    def wait(self, timeout: float, also: Sequence[int] = ()) -> list[int]:
        """Sleep until a signal arrives (child exit or stop request), ``wake`` is called, one of
        the file descriptors ``also`` is readable, or ``timeout`` passes; returns those of
        ``also`` that are readable."""
        ready, _, _ = select.select([self._read, *also], [], [], max(0.0, timeout))
        if self._read in ready:
            try:
                while os.read(self._read, 512):
                    pass
            except BlockingIOError:
                pass
        return [fd for fd in ready if fd != self._read]

    def close(self) -> None:
        global _wake_fd
        with _wake_lock:
            _wake_fd = self._old_wake
        signal.set_wakeup_fd(self._old_fd)
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)
        os.close(self._read)
        os.close(self._write)

    def __enter__(self) -> "ChildWatcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wake() -> None:
    """Wake the active watcher's ``wait`` now; from any thread (a reader thread that got news
    for the main loop). Nothing when no watcher is active."""
    with _wake_lock:
        if _wake_fd is not None:
            try:
                os.write(_wake_fd, b"w")
            except OSError:  # full: it is awake anyway
                pass


def die_with_parent(signum: int) -> None:
    """Ask Linux to send ``signum`` to this process when its parent dies (PR_SET_PDEATHSIG),
    so no process outlives the one that started it. Survives exec."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signum, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), signum)


def _ignore(_signum: int, _frame: object) -> None:
    pass


def signal_group(pgid: int, signum: int) -> None:
    """Signal a process group; a group that is gone is not an error."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def wait_until(done: Callable[[], bool], watcher: ChildWatcher, deadline: float) -> bool:
    """Wait (signal-driven) until ``done()`` or the deadline; returns ``done()``."""
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            return done()
        watcher.wait(min(left, 0.5))
    return True


def exit_code(returncode: int) -> int:
    """Popen's negative 'killed by signal N' as the shell's 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_name(returncode: int) -> str | None:
    if returncode >= 0 and not 128 < returncode < 160:
        return None
    num = -returncode if returncode < 0 else returncode - 128
    try:
        return signal.Signals(num).name
    except ValueError:
        return None
