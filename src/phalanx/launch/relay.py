"""The relay between a worker and its log, forked by the bootstrap before the script runs, where
the worker's output cannot go to ``output.log`` directly:

- rank 0 of a foreground run at a terminal (``PHALANX_TTY=COLSxROWS``): a pseudo-terminal of that
  size, so the script's ``isatty()`` is True (colours, progress bars) as under torchrun;
- a job with secrets (``--secret``): a pipe, so their values are masked (``phalanx.secrets.mask``)
  before a byte reaches the log, a value written in pieces or redrawn with ``\\r`` too.

The relay copies until every holder of the other end (the worker and any child it started) has
closed it, ignoring stop signals (a stop is the worker's business; the relay drains), and is
waited for briefly at the worker's exit (``drain``), so the log is whole when the agent reads it.
Standard library only, and imported only where a relay is needed.
"""

from __future__ import annotations

import os
import signal
import time

_RELAY: "list[int]" = []  # the pid of the relay writing this rank's log


def terminal_into(log_fd: int, size: str, secrets: "list[bytes]") -> int:
    """A pseudo-terminal of ``size`` (COLSxROWS) whose output a forked relay appends to the log,
    ``secrets`` masked. Returns the descriptor for fd 1 and 2 (the log itself where no
    pseudo-terminal can be had)."""
    try:
        import fcntl
        import struct
        import termios

        master, slave = os.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST  # bytes into the log as written (no \r\n for \n)
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        cols, _, rows = size.partition("x")
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", int(rows), int(cols), 0, 0))
    except (OSError, ValueError, ImportError):
        return log_fd
    _start(master, log_fd, slave, secrets)
    return slave


def masked_into(log_fd: int, secrets: "list[bytes]") -> int:
    """A pipe whose reading end a forked relay copies into the log with ``secrets`` masked;
    returns its writing end for fd 1 and 2 (the log itself where no pipe can be had)."""
    try:
        read, write = os.pipe()
    except OSError:
        return log_fd
    _start(read, log_fd, write, secrets)
    return write


def _start(source: int, log_fd: int, theirs: int, secrets: "list[bytes]") -> None:
    """Fork the process that copies ``source`` into ``log_fd`` until every holder of its other
    end (``theirs``: the worker and any child it starts) has closed it. No threads exist yet and
    nothing of the script has run."""
    pid = os.fork()
    if pid == 0:
        os.close(theirs)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(signum, signal.SIG_IGN)  # a stop is the worker's business; the relay drains
        masker = None
        if secrets:
            from phalanx.secrets.mask import Masker

            masker = Masker(secrets)
        while True:
            try:
                data = os.read(source, 65536)
            except OSError:  # EIO: the terminal's other end is closed everywhere
                data = b""
            out = (masker.feed(data) if data else masker.flush()) if masker is not None else data
            while out:
                out = out[os.write(log_fd, out):]
            if not data:
                os._exit(0)
    _RELAY.append(pid)
    os.close(source)
    os.close(log_fd)


def drain() -> None:
    """At the worker's exit: close its ends of the relay and give the relay a moment to write what
    is left (a child of the script that keeps the streams open keeps the relay going: it ends
    with that child)."""
    if not _RELAY:
        return
    for fd in (1, 2):
        try:
            os.close(fd)
        except OSError:
            pass
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            if os.waitpid(_RELAY[0], os.WNOHANG)[0]:
                return
        except ChildProcessError:  # reaped by the script itself
            return
        time.sleep(0.005)
