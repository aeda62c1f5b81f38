"""A worker started ahead: ``python -u -m phalanx.launch.standby FD``.

It does Python's start-up and the bootstrap's imports now, then waits (blocked reading FD) for
the rank it becomes: a JSON ``{"argv": [...], "env": {...}, "log": path}``, where ``argv`` is the
cold start's command line ``[python, "-u", "-m", "phalanx.launch.bootstrap", MODE, TARGET,
ARGS...]``. It then becomes exactly that process: the environment replaced by ``env``, stdout and
stderr on ``log`` (where a cold worker's would be: its node agent's log), ``sys.orig_argv`` the
cold one, and the bootstrap run as ``__main__`` the way ``python -m`` runs it. The end of FD
without a message means "not needed": it exits quietly.

What a script could still tell apart from a cold start: the process began earlier (its start
time, its CPU time). The interpreter read its start-up variables (``PYTHON*``,
locale, ``LD_*``) from the environment it was started with; ``launch/workers.py`` hands a
standby only a rank whose environment agrees with it on those.

Keep the imports here what the bootstrap imports anyway: this is every such worker's ``__main__``.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys

import phalanx.launch.procs as procs  # noqa: F401 - the bootstrap's one phalanx import, done ahead

BOOTSTRAP = "phalanx.launch.bootstrap"


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        data = os.read(fd, 1 << 16)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def main() -> None:
    procs.die_with_parent(signal.SIGKILL)  # a standby its agent left behind must not linger
    fd = int(sys.argv[1])
    message = _read_all(fd)
    os.close(fd)
    if not message:
        os._exit(0)
    command = json.loads(message)
    argv = [str(a) for a in command["argv"]]
    if command.get("log"):
        out = os.open(command["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
    os.environ.clear()
    os.environ.update(command["env"])
    sys.orig_argv = argv
    sys.argv = [BOOTSTRAP, *argv[4:]]  # run_module puts the module's file first, as -m does
    runpy.run_module(BOOTSTRAP, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
