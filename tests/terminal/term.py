"""A pseudo-terminal for tests, written with the standard library (pexpect-like).

``Tty(argv, cwd, env)`` starts ``argv`` as the session leader of a new pseudo-terminal, the way
a shell starts a foreground command: stdin, stdout and (unless ``stderr`` names a file) stderr are
the terminal, and the terminal's Ctrl-C (``interrupt()`` types it: the byte ^C, which the line
discipline turns into SIGINT for the foreground process group) reaches it as it would reach a
command typed at a shell. ``expect`` waits for a pattern in what the terminal showed;
``chunks`` keeps every read with its time, so a test can tell output that came live from output
that came all at once at the end.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import time


class Tty:
    def __init__(self, argv: list[str], cwd: str, env: dict[str, str], stderr: str | None = None,
                 cols: int = 100, rows: int = 30) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: exec at once (the test process may have threads)
            try:
                os.chdir(cwd)
                if stderr is not None:
                    err = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(err, 2)
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        import fcntl
        import struct
        import termios

        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.chunks: list[tuple[float, bytes]] = []
        self.seen = b""
        self.status: int | None = None

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: every holder of the terminal's other end is gone
            data = b""
        if not data:
            return False
        self.chunks.append((time.monotonic(), data))
        self.seen += data
        return True

    def expect(self, pattern: bytes | str, timeout: float = 60.0, start: int = 0) -> re.Match[bytes]:
        """The first match of ``pattern`` in the output from offset ``start``; waits for it.
        Fails with everything the terminal showed."""
        regex = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        deadline = time.monotonic() + timeout
        while True:
            found = regex.search(self.seen, start)
            if found:
                return found
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.5)):
                found = regex.search(self.seen, start)
                if found:
                    return found
                raise AssertionError(f"{regex.pattern!r} not shown within {timeout:g}s; the terminal showed:\n"
                                     + self.seen.decode(errors="replace"))

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def interrupt(self) -> None:
        """Ctrl-C, typed."""
        self.send(b"\x03")

    def wait(self, timeout: float = 120.0) -> int:
        """Read to the end, reap the command; its exit status as a shell shows it (128+N for a signal)."""
        deadline = time.monotonic() + timeout
        while self.status is None:
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"still running after {timeout:g}s; the terminal showed:\n"
                                     + self.seen.decode(errors="replace"))
            more = self._read(0.2)
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                while self._read(0.2) and len(self.chunks) < 100000:
                    if not select.select([self.fd], [], [], 0)[0]:
                        break
                code = os.waitstatus_to_exitcode(status)
                self.status = 128 - code if code < 0 else code
            elif not more:
                time.sleep(0.05)
        os.close(self.fd)
        return self.status

    def text(self) -> str:
        return self.seen.decode(errors="replace").replace("\r\n", "\n")

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
