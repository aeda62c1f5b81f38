"""Where a node agent's worker processes come from: a cold start (``Popen``), or a worker
prepared ahead.

A kept agent (``launch/control.py``) prepares the next attempt's workers while the failed one is
handed to the supervisor and the new rendezvous runs: ``Standbys`` starts interpreters that do
Python's start-up and the bootstrap's imports and then wait (``launch/standby.py``). When the
attempt starts its ranks, each takes a standby instead of a new interpreter; a rank that cannot
(another program, a different interpreter or start-up environment, output redirected by torch,
no standby left) starts cold, as before.

Under warm starts (``launch/warm/plan.py``) a rank's command is the warm pool's stand-in, ``python -u
-m phalanx.launch.warm.standin ... -- phalanx.launch.bootstrap ...``: the ready workers are then
stand-ins started ahead (``standin --defer FD``), which wait for the rank's command line and
environment and then ask the pool for the child as any stand-in does (``prepare(count, "warm")``).

This is the seam for other sources of ready workers (a pool of interpreters with torch imported,
forked on demand): anything with ``prepare``/``take``/``close`` as below can stand in for
``Standbys``. ``take`` returns a ``subprocess.Popen`` of a child of this agent that is the leader
of its own session (torch polls, waits for and ``killpg``-s what it gets).

torch's elastic agent starts its workers itself; ``supplied`` lets it take them from a source
while it runs, through the one function torch's ``SubprocessContext`` calls to make a worker
(``torch.distributed.elastic.multiprocessing.api.get_subprocess_handler`` in torch 2.13): a
subclass of torch's own ``SubprocessHandler`` whose ``_popen`` asks the source first. With a
torch that lacks that function nothing is replaced, and every worker starts cold.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Protocol, Sequence

BOOTSTRAP_ARGV = ("-u", "-m", "phalanx.launch.bootstrap")
STANDBY_ARGV = ("-u", "-m", "phalanx.launch.standby")
# A warm plan's workers are the warm pool's stand-ins (``launch/warm/standin.py``); one started ahead
# waits with ``--defer FD`` and becomes the stand-in the rank's command line names.
WARM_ARGV = ("-u", "-m", "phalanx.launch.warm.standin")
KINDS = {"cold": (BOOTSTRAP_ARGV, STANDBY_ARGV), "warm": (WARM_ARGV, (*WARM_ARGV, "--defer"))}

# What the interpreter reads from the environment as it starts (and the .pth files it runs then):
# a standby started with other values than the rank's would not be the same as a cold start.
_STARTUP_PREFIXES = ("PYTHON", "LC_", "LD_", "MALLOC_")
_STARTUP_KEYS = frozenset({"LANG", "LANGUAGE", "TZ", "PATH", "HOME", "TMPDIR", "VIRTUAL_ENV"})


def startup_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_KEYS}


class WorkerSource(Protocol):
    def prepare(self, count: int, kind: str = "cold") -> None:
        """Get ``count`` workers of ``kind`` ("cold": the bootstrap, "warm": the warm pool's
        stand-in) ready for the next attempt. Non-blocking."""

    def take(self, argv: Sequence[str], env: Mapping[str, str], log: str | None) -> subprocess.Popen[bytes] | None:
        """A ready worker that becomes ``argv`` with exactly ``env`` (its output on ``log``), or
        None: the caller starts ``argv`` cold."""

    def close(self) -> None:
        """Drop the workers nobody took (they exit). Idempotent."""


class Standbys:
    """Interpreters started ahead, each waiting for the rank it becomes (``launch/standby.py``).
    Started with this process's environment at ``prepare`` time, in its working directory."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self._ready: list[tuple[subprocess.Popen[bytes], int, dict[str, str], str]] = []

    def prepare(self, count: int, kind: str = "cold") -> None:
        """``count`` interpreters for ranks of ``kind``: "cold" (the bootstrap) or "warm" (the
        warm pool's stand-in)."""
        env = dict(os.environ)
        for _ in range(count - len(self._ready)):
            read, write = os.pipe()
            try:
                # Its own session, as torch starts workers, so that killpg reaches it alone. stdin,
                # stdout and stderr are this agent's, as a cold worker's would be.
                proc = subprocess.Popen([self.python, *KINDS[kind][1], str(read)], env=env, pass_fds=(read,),
                                        start_new_session=True)
            except OSError:
                os.close(write)
                return
            finally:
                os.close(read)
            self._ready.append((proc, write, startup_env(env), kind))

    def take(self, argv: Sequence[str], env: Mapping[str, str], log: str | None) -> subprocess.Popen[bytes] | None:
        kind = next((k for k, (program, _) in KINDS.items() if tuple(argv[:4]) == (self.python, *program)), None)
        if kind is None:
            return None
        wanted = startup_env(env)
        while self._ready:
            proc, write, started_with, ready_kind = self._ready.pop(0)
            if started_with != wanted or ready_kind != kind or proc.poll() is not None:
                _drop(proc, write)
                continue
            try:
                os.write(write, json.dumps({"argv": list(argv), "env": dict(env), "log": log}).encode())
            except OSError:  # it died meanwhile
                _drop(proc, write)
                continue
            os.close(write)
            return proc
        return None

    def close(self) -> None:
        ready, self._ready = self._ready, []
        for proc, write, _, _ in ready:
            _drop(proc, write)


def _drop(proc: subprocess.Popen[bytes], write: int) -> None:
    """An unused standby: it holds nothing worth an orderly exit (it may still be starting),
    so it is killed, with anything it started, and reaped here."""
    try:
        os.close(write)
    except OSError:
        pass
    if proc.poll() is None:  # not reaped yet, so its pid is still its own
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # it leads its own session
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


@contextmanager
def supplied(source: WorkerSource | None, log: str | None) -> Iterator[None]:
    """While in this block, torch's elastic agent takes its workers from ``source`` (cold where
    ``take`` says None); their output goes to ``log`` (this agent's, as a cold worker's would)."""
    api: Any
    try:
        from torch.distributed.elastic.multiprocessing import api
        from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler
    except ImportError:
        api = None
    if source is None or api is None or not hasattr(api, "get_subprocess_handler"):
        yield
        return
    ready_source: WorkerSource = source

    class ReadyHandler(SubprocessHandler):  # type: ignore[misc]
        def _popen(self, args: tuple[Any, ...], env: dict[str, str]) -> subprocess.Popen[bytes]:
            # Redirected output (torch's --redirects) goes to files this process opened: cold.
            ready = None if self._stdout or self._stderr else ready_source.take([str(a) for a in args], env, log)
            return ready if ready is not None else super()._popen(args, env)

    def handler(*args: Any, **kwargs: Any) -> Any:  # torch's signature, whatever its version's is
        return ReadyHandler(*args, **kwargs)

    original = api.get_subprocess_handler
    api.get_subprocess_handler = handler
    try:
        yield
    finally:
        api.get_subprocess_handler = original
