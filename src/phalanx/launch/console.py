"""The terminal lent to a lone foreground process: ``phalanx run train.py`` at a shell.

Under python the script's stdin, stdout and stderr are the terminal's: ``breakpoint()`` and
``input()`` read from it, ``isatty()`` is True (colours, tqdm's ``\\r`` bars), and what goes to
stderr stays on stderr. phalanx also keeps the rank's log (``phalanx logs``, metrics, the stall
clock, the failure's last lines), so it lends the process:

- stdin: phalanx's own stdin, passed as it is (the terminal, a file, a pipe);
- stdout and stderr: a pseudo-terminal each where phalanx's own stream is a terminal (a pipe
  where it is not, as python's would be a file or a pipe), of the terminal's size, with output
  processing off (no ``\\r\\n`` for ``\\n`` in the log). A relay thread copies every byte, as it
  comes and partial lines too, to phalanx's stdout or stderr and appends it to the log. When the
  reader of phalanx's stream goes (``phalanx run gen.py | head -1``), the relay closes that
  pipe: the process's next write fails with EPIPE (BrokenPipeError) as python's would, and the
  job ends as python does.

With secrets (``--secret``) the relay masks their values in what it copies, to the terminal and
to the log alike, a value split across writes too (``phalanx.secrets.mask``): output that ends in
the first characters of a value waits for the next bytes (or the end) to show it is not one.

The process is told (``PHALANX_STDIO=relay``, which the bootstrap removes before the script
starts) not to point its output at the log itself. It stays in a session of its own: Ctrl-C
reaches phalanx, which passes one SIGINT on (``supervise/attempt.py``).
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
from pathlib import Path
from typing import Any

from ..secrets.mask import Masker

RELAY_ENV = "PHALANX_STDIO"
RELAY = "relay"
# For a job of several ranks at a terminal: rank 0's bootstrap gives itself a pseudo-terminal
# of this size (COLSxROWS) and relays it into its log (launch/relay.py).
TTY_ENV = "PHALANX_TTY"
READ_SIZE = 65536
DRAIN_S = 2.0  # after the process ended: how long its streams may still drain (its children may hold them)


class Console:
    """Where a lone process's streams go: ``stdout_fd``/``stderr_fd`` of this process."""

    def __init__(self, stdin_fd: int = 0, stdout_fd: int = 1, stderr_fd: int = 2) -> None:
        self.stdin_fd, self.stdout_fd, self.stderr_fd = stdin_fd, stdout_fd, stderr_fd
        self._relays: list[Streams] = []

    def terminal_size(self) -> tuple[int, int] | None:
        """(columns, rows) of the terminal phalanx's stdout is; None when it is not one."""
        try:
            size = os.get_terminal_size(self.stdout_fd)
        except OSError:
            return None
        return size.columns, size.lines

    def open(self, log: Path, secrets: list[str] | None = None) -> Streams:
        """The streams for one process, whose output is also appended to ``log``; the values of
        ``secrets`` masked in both."""
        streams = Streams(self, log, [os.fsencode(v) for v in secrets or ()])
        self._relays.append(streams)
        return streams

    def close(self) -> None:
        """Wait (briefly) for every relay to copy what is left; then let go of the streams."""
        for streams in self._relays:
            streams.join()
        self._relays.clear()


class Streams:
    """One process's stdin, stdout and stderr: ``child`` to hand to ``Popen``, then ``started()``."""

    def __init__(self, console: Console, log: Path, secrets: list[bytes] | None = None) -> None:
        self.log = log
        pairs = [_pair(target) for target in (console.stdout_fd, console.stderr_fd)]
        self.child = (console.stdin_fd, pairs[0][1], pairs[1][1])
        self._reads = {pairs[0][0]: console.stdout_fd, pairs[1][0]: console.stderr_fd}
        # One masker per stream: a value split between stdout and stderr is no value on either.
        self._maskers = {fd: Masker(secrets or []) for fd in self._reads}
        self._thread: threading.Thread | None = None
        self._stop = (-1, -1)
        # A write to the log that failed (the disk is full): the relay goes on to the terminal
        # (the process must not block on a pipe nobody reads); its supervisor fails the job.
        self.log_error: OSError | None = None

    def started(self) -> None:
        """The process has its ends: close ours (so its end of output reads as the end) and relay."""
        for fd in self.child[1:]:
            os.close(fd)
        self._stop = os.pipe()
        self._thread = threading.Thread(target=self._relay, name="phalanx-console", daemon=True)
        self._thread.start()

    def abandon(self) -> None:
        """The process could not be started: close everything."""
        for fd in (*self.child[1:], *self._reads):
            _close(fd)
        self._reads = {}

    def join(self) -> None:
        """Wait until the process's output has ended (at most :data:`DRAIN_S`: a child of the
        script may hold its end open), then stop relaying."""
        if self._thread is None:
            return
        self._thread.join(DRAIN_S)
        os.write(self._stop[1], b"x")
        self._thread.join()
        for fd in self._stop:
            _close(fd)
        self._thread = None

    def _relay(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        open_fds = dict(self._reads)
        try:
            with open(self.log, "ab", buffering=0) as log:
                while open_fds:
                    ready, _, _ = select.select([*open_fds, self._stop[0]], [], [])
                    if self._stop[0] in ready:
                        for fd in open_fds:  # what a masker held back: no more bytes come
                            self._copy(open_fds[fd], log, self._maskers[fd].flush())
                        return
                    for fd in ready:
                        try:
                            data = os.read(fd, READ_SIZE)
                        except OSError:  # EIO: the pseudo-terminal's other end is closed everywhere
                            data = b""
                        masker = self._maskers[fd]
                        reached = self._copy(open_fds[fd], log, masker.feed(data) if data else masker.flush())
                        if not data or not reached:
                            # The end of its output; or its reader is gone (`phalanx run gen.py |
                            # head -1`): so is the process's, as under python: its next write
                            # fails with EPIPE (BrokenPipeError). What it wrote after that reaches no one.
                            _close(fd)
                            open_fds.pop(fd)
        finally:
            for fd in open_fds:
                _close(fd)

    def _copy(self, target: int, log: Any, data: bytes) -> bool:
        """``data`` to the terminal (or phalanx's stream) and into the log; False (and nothing
        logged) when the stream's reader is gone (EPIPE, which only a pipe gives)."""
        if not data:
            return True
        if not _write_all(target, data):
            return False
        if self.log_error is None:
            try:
                log.write(data)
            except OSError as exc:
                exc.filename = exc.filename or str(self.log)
                self.log_error = exc
        return True


def lend(out: object) -> Console | None:
    """A console writing to ``out``'s descriptor and this process's stderr, reading this
    process's stdin; None when ``out`` has no descriptor (a test's StringIO)."""
    try:
        out_fd = out.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return None
    try:
        os.fstat(0)
        stdin_fd = 0
    except OSError:  # started with stdin closed: the process gets /dev/null, as python would read EOF
        stdin_fd = subprocess.DEVNULL
    return Console(stdin_fd, out_fd, 2)


def _pair(target: int) -> tuple[int, int]:
    """(our end, the process's end): a pseudo-terminal when ``target`` is a terminal, else a pipe."""
    if not os.isatty(target):
        read, write = os.pipe()
        return read, write
    import fcntl
    import termios

    master, slave = os.openpty()
    try:
        attrs = termios.tcgetattr(target)
        attrs[1] &= ~termios.OPOST  # oflag: bytes pass as written; the real terminal translates them
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        size = fcntl.ioctl(target, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    except (OSError, termios.error):
        pass  # a terminal that does not answer: defaults
    return master, slave


def _write_all(fd: int, data: bytes) -> bool:
    """Write all of ``data``; False when ``fd``'s reader is gone (EPIPE). A terminal that went
    away (EIO) is not that: the log still gets everything, as it does after a hang-up."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [])
        except BrokenPipeError:
            return False
        except OSError:
            return True
    return True


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
