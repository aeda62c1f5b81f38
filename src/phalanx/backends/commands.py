"""The one seam through which phalanx starts external processes.

Tests replace these functions to observe or fake what would run (``tests/backends/fake_slurm.py``,
``tests/backends/fake_ssh.py``); everything else calls them, never ``subprocess`` directly:

- ``spawn``: a long-running process (a node agent, a worker), output to a log;
- ``run``: a short command to completion (``sbatch``, ``squeue``, ``ssh -G``, a preflight);
- ``link``: a long-running process spoken to through its stdin and stdout (an ssh session
  to a node's remote end);
- ``pipe``: one command's output into another's input (``tar -c | ssh HOST tar -x``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Mapping, Sequence


def spawn(argv: Sequence[str], env: Mapping[str, str], log: Path, cwd: str | None = None,
          stdio: tuple[int, int, int] | None = None, pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (so terminal signals reach only the supervisor),
    stdin closed, stdout+stderr appended to ``log``; or, with ``stdio``, on those three
    descriptors (a lone foreground process lent the terminal: ``launch/console.py``).
    ``pass_fds`` stay open in it (a control line)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    if stdio is not None:
        return subprocess.Popen(list(argv), env={**os.environ, **env}, cwd=cwd, stdin=stdio[0], stdout=stdio[1],
                                stderr=stdio[2], start_new_session=True,
                                pass_fds=tuple(pass_fds))
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(argv),
            env={**os.environ, **env},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )


def run(argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run a short command to completion; its exit status, stdout and stderr (text) are the
    caller's to judge. Blocking, at most ``timeout`` seconds. A missing program or a timeout
    comes back as exit status 127 or 124 with the reason in stderr, never as an exception."""
    try:
        return subprocess.run(
            list(argv), env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout,
        )
    except FileNotFoundError as exc:
        return subprocess.CompletedProcess(list(argv), 127, "", f"{argv[0]}: command not found ({exc.strerror})")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"{argv[0]}: no answer within {timeout:g}s")


def link(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session with its stdin and stdout as pipes (binary) for the
    caller, stderr appended to ``log``. Non-blocking. Closing its stdin is how the caller says
    goodbye."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as err:
        return subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                start_new_session=True)


def pipe(source: Sequence[str] | None, sink: Sequence[str], timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    """``source``'s stdout into ``sink``'s stdin (``sink`` reads nothing when ``source`` is
    None); blocking, at most ``timeout`` seconds (then ``sink`` is killed: status 124).
    Returns ``sink``'s exit status and stderr; ``source`` gets SIGPIPE if ``sink`` dies."""
    src = subprocess.Popen(list(source), stdout=subprocess.PIPE) if source else None
    try:
        dst = subprocess.Popen(list(sink), stdin=src.stdout if src else subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError as exc:
        if src is not None:
            src.kill()
            src.wait()
        return subprocess.CompletedProcess(list(sink), 127, "", f"{sink[0]}: command not found ({exc.strerror})")
    if src is not None:
        assert src.stdout is not None
        src.stdout.close()  # only the sink reads the stream now
    try:
        _, err = dst.communicate(timeout=timeout)
        code = dst.returncode
    except subprocess.TimeoutExpired:
        dst.kill()
        _, err = dst.communicate()
        code, err = 124, f"{err}{sink[0]}: no answer within {timeout:g}s"
    if src is not None:
        src.wait()
    return subprocess.CompletedProcess(list(sink), code, "", err)
