"""The warm pool: one interpreter with the heavy imports done, forking a child per start.

Started by the first ``warm_exec`` client of an environment (``warm_proto`` says what an
environment is) as ``python -u -m phalanx.launch.bootstrap --warm-pool ...`` (see ``warm_pool``),
it imports what it is asked to (the client's cold start goes ahead meanwhile), then listens on its
socket until it has been idle (no child, no client) for ``--idle`` seconds, or is stopped
(``phalanx pool stop``, SIGTERM): then it takes no more requests and exits once its last child has
ended. While it lives it holds an exclusive lock on ``<key>.lock``, handed over by the client that
started it, so that one environment has one pool.

Per request it forks a child that becomes the client's cold start (``warm_child``), sends the
client the child's pid, then its wait status. The client stands in for the child: when the client
goes away before its child (killed, or its parent died), the pool sends the child's process group
the signal the cold process would have got from its own ``PR_SET_PDEATHSIG``. Children die with
the pool (SIGKILL): nobody could tell their exit status any more.

It answers "start cold" instead whenever forking would not give a faithful copy: a thread or a
descriptor some import left open, CUDA initialised, an installed module changed on disk since it
was imported (the pool then retires), another interpreter, environment or start-up, resource
limits it cannot grant, a client that does not lead its own session, a module in the script's
directory that would shadow one it holds, a client in another cgroup (a memory limit the pool is not
under), namespace, or with other credentials, capabilities, CPU set or priority. It never runs
anything of the script itself, and serves only its own user (``SO_PEERCRED``, and a socket in a 0700
directory). Under SLURM it ends with the allocation that started it (``--allocation``: the
``slurmstepd`` or ``salloc`` its first client ran under), taking its children with it.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import sys
import time

from . import checks as warm_checks, child as warm_child, proto as warm_proto
from .recorder import Recorder, Restorer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Order = tuple[dict[str, Any], list[int], socket.socket, warm_proto.Channel]


CHECK_MS = 2000  # how often the pool looks whether its socket is still there


class Child:
    def __init__(self, pid: int, conn: socket.socket, channel: warm_proto.Channel, deathsig: int) -> None:
        self.pid = pid
        self.conn = conn
        self.channel = channel
        self.deathsig = deathsig
        self.orphaned = False


class Pool:
    def __init__(self, path: str, idle: float, lock_fd: int, recorder: Recorder) -> None:
        self.path = path
        self.log = path[: -len(".sock")] + ".log"
        self.idle = idle
        self.lock_fd: int | None = lock_fd
        self.recorder = recorder
        self.listener: socket.socket | None = None
        self.started = time.time()
        self.children: dict[int, Child] = {}
        self.by_fd: dict[int, Child] = {}
        self.preloaded: list[str] = []
        self.unavailable: list[str] = []
        self.learnt: list[str] = []
        self.refusal: str | None = None
        self.changes: warm_checks.Changes | None = None
        self.served = 0
        self.fallbacks = 0
        self.last_fallback = ""
        self.stopping = False
        self.last_active = time.monotonic()
        self.environment = warm_proto.pool_environment(os.environ)
        self.interpreter = warm_proto.interpreter()
        self.poller = select.poll()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.restorer = Restorer(recorder, self._learner())
        self.allocation: warm_checks.Allocation | None = None  # the SLURM allocation it ends with (``within``)

    # -- what it holds ------------------------------------------------------------------------

    def preload(self, names: list[str]) -> None:
        """Import ``names`` (recorded), then check that the pool can still fork faithfully."""
        import importlib

        todo = [n for n in names if n not in self.preloaded and n not in self.unavailable]
        if not todo and self.changes is not None:
            return
        descriptors = warm_checks.descriptors()
        self.restorer.uninstall()
        self.restorer.unhide()
        self.recorder.start()
        try:
            for name in todo:
                try:
                    importlib.import_module(name)
                    self.preloaded.append(name)
                except BaseException as exc:  # noqa: BLE001 - a child imports it itself then
                    self.unavailable.append(name)
                    warm_proto.note(self.log, f"cannot preload {name}: {type(exc).__name__}: {exc}")
        finally:
            self.recorder.stop()
        warm_checks.settle()
        self.refusal = (self.refusal or self.recorder.unexplained() or warm_checks.foreign(warm_checks.descriptors() - descriptors)
                        or warm_checks.threads() or warm_checks.command_lines_shown(warm_child.show_as))
        self.changes = warm_checks.Changes(list(sys.modules.values()))
        self.restorer.hide()  # once here, not in every child: see Restorer
        self.restorer.install()
        warm_child.freeze()
        warm_proto.note(self.log, f"holding {', '.join(self.preloaded) or 'the bootstrap'} ({len(self.restorer.hidden)} modules kept aside)"
                        + (f"; cannot fork: {self.refusal}" if self.refusal else ""))

    # -- serving ------------------------------------------------------------------------------

    def listen(self) -> None:
        self.listener = socket.socket(fileno=warm_proto.listen(self.path).detach())
        self.listener.setblocking(False)
        self.socket_inode = os.stat(self.path).st_ino  # to remove our socket, never a successor's
        self.poller.register(self.listener, select.POLLIN)
        self.poller.register(self._wake_r, select.POLLIN)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.set_wakeup_fd(self._wake_w)

    def serve(self) -> list[str] | None:
        """The pool's loop; returns None when the pool is done, and in a forked worker child its
        bootstrap arguments. A child returns straight up the stack: nothing between the fork and
        the caller may run pool code (no ``finally`` on the way)."""
        while True:
            self._reap()
            if self.stopping and not self.children:
                return None
            if not self.children and time.monotonic() - self.last_active > self.idle:
                warm_proto.note(self.log, f"idle for {self.idle:g}s: exiting")
                return None
            if self.learnt:  # blocks this loop for an import, once: later starts gain it every time
                learnt, self.learnt = self.learnt, []
                self.preload(learnt)
                if self.refusal:  # what a run taught it spoilt it: make way for a fresh pool
                    self.retire(f"cannot fork after importing {', '.join(learnt)}: {self.refusal}")
            self._check_socket()
            for fd, _events in self.poller.poll(self._timeout()):
                if fd == self._wake_r:
                    _drain(fd)
                elif self.allocation is not None and fd == self.allocation.fd:  # its process has exited
                    self.allocation_over()
                elif self.listener is not None and fd == self.listener.fileno() and not self.stopping:
                    order = self._accept()
                    if order is not None:
                        if not self.restorer.hidden_cleanly():  # the pool imported something since
                            self.restorer.hide()
                        pid = os.fork()
                        if pid == 0:
                            return self._child(*order)
                        self._forked(pid, *order)
                elif fd in self.by_fd:
                    self._client_event(self.by_fd[fd])

    def within(self, allocation: str) -> None:
        """End with the SLURM allocation whose process is PID:START (``warm_checks.Allocation``)."""
        self.allocation = warm_checks.Allocation.of(allocation) if allocation else None
        if self.allocation is None:
            return
        if self.allocation.fd is None:  # gone already, or its pid is another's now
            self.allocation_over()
        else:
            self.poller.register(self.allocation.fd, select.POLLIN)

    def allocation_over(self) -> None:
        """The allocation that started the pool has ended: nothing of it may run on, the pool's
        children (its ranks) included."""
        self.retire("the SLURM allocation that started it ended")
        for pid in list(self.children):
            _kill_group(pid, signal.SIGKILL)
        if self.allocation is not None and self.allocation.fd is not None:
            self.poller.unregister(self.allocation.fd)
            self.allocation.close()
        self.allocation = None

    def _timeout(self) -> int:
        if self.children:
            return CHECK_MS
        return min(CHECK_MS, max(0, int((self.idle - (time.monotonic() - self.last_active)) * 1000)) + 50)

    def _check_socket(self) -> None:
        """Retire when our socket is gone or another replaced it: the directory was removed (the
        user's ``XDG_RUNTIME_DIR`` goes when their last session ends), or a pool that cannot be
        found must not wait for work that can never reach it."""
        if self.stopping or self.listener is None:
            return
        try:
            ours = os.stat(self.path).st_ino == self.socket_inode
        except OSError:
            ours = False
        if not ours:
            self.retire(f"its socket {self.path} was removed or replaced")

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum != signal.SIGCHLD:
            self.retire("stopped by a signal")

    def retire(self, why: str) -> None:
        """Take no more requests and let another pool start for this environment; exit when
        the last child has ended."""
        if self.stopping:
            return
        self.stopping = True
        warm_proto.note(self.log, f"retiring: {why}")
        if self.listener is not None:
            try:
                if os.stat(self.path).st_ino == self.socket_inode:
                    os.unlink(self.path)
            except OSError:
                pass
            self.poller.unregister(self.listener)
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    def _accept(self) -> Order | None:
        """Read one request; the fork order when the pool should fork a child for it."""
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return None
        self.last_active = time.monotonic()
        channel = warm_proto.Channel(conn)
        fds: list[int] = []
        try:
            client, uid, _gid = warm_proto.peer(conn)
            if uid != os.geteuid():
                warm_proto.note(self.log, f"refused a client of uid {uid}")
                conn.close()
                return None
            conn.settimeout(10.0)
            received = channel.receive()
            if received is None:
                conn.close()
                return None
            request, fds = received
            assert isinstance(request, dict)
            request["peer"] = client  # as the kernel saw it connect, not as the client says
            op = request.get("op")
            if op == "run":
                why = self._unfit_after_preload(request, fds)
                if why is None:
                    return request, fds, conn, channel
                self.fallbacks += 1
                self.last_fallback = why
                warm_proto.note(self.log, f"cold start for {request.get('module')} (client {request.get('client')}): {why}")
                channel.send({"cold": why})
            elif op == "status":
                channel.send(self.status())
            elif op == "stop":
                self.retire("asked to stop")
                channel.send({"stopping": True, "children": len(self.children)})
            elif op == "learn":
                self.learnt += [m for m in request.get("modules", [])
                                if isinstance(m, str) and m.partition(".")[0] in warm_proto.PRELOADABLE
                                and m not in self.learnt and m not in self.unavailable]
        except (OSError, ValueError, AssertionError, KeyError, TypeError) as exc:
            warm_proto.note(self.log, f"bad request: {type(exc).__name__}: {exc}")
        for fd in fds:
            os.close(fd)
        conn.close()
        return None

    def _unfit_after_preload(self, request: dict[str, Any], fds: list[int]) -> str | None:
        why = self.unfit(request, fds)
        if why is None and any(m not in self.preloaded for m in request.get("preload", [])):
            self.preload(request["preload"])
            why = self.unfit(request, fds)
        return why

    def _child(self, request: dict[str, Any], fds: list[int], conn: socket.socket, _channel: object) -> list[str]:
        """In the forked child: become the client's cold start. Never raises."""
        try:
            sockets = [s for s in (self.listener, conn, *(c.conn for c in self.children.values())) if s is not None]
        except BaseException:  # noqa: BLE001 - nothing of the script has run: start it cold
            warm_child.cold(request)
        return warm_child.become(request, fds, self.restorer, sockets)

    def _forked(self, pid: int, request: dict[str, Any], fds: list[int], conn: socket.socket,
                channel: warm_proto.Channel) -> None:
        for fd in fds:
            os.close(fd)
        self.served += 1
        child = Child(pid, conn, channel, int(request["deathsig"]))
        self.children[pid] = child
        try:
            conn.settimeout(None)
            channel.send({"pid": pid})
        except OSError:
            child.orphaned = True  # the client went away already
            _kill_group(pid, signal.SIGKILL)
            conn.close()
            return
        self.by_fd[conn.fileno()] = child
        self.poller.register(conn, select.POLLIN)

    def _learner(self) -> Any:
        """In a child: tell the pool when the script imports a module worth holding next time."""
        path, held, told = self.path, set(self.preloaded), set()

        def on_miss(name: str) -> None:
            # torch imports much of itself lazily (torch._dynamo on the first optimizer step):
            # what a script's run brought in, the next run finds held.
            if name.partition(".")[0] not in warm_proto.PRELOADABLE or name in held or name in told:
                return
            told.add(name)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
                    sock.settimeout(1.0)
                    sock.connect(path)
                    warm_proto.Channel(sock).send({"op": "learn", "modules": [name]})
            except OSError:
                pass

        return on_miss

    def unfit(self, request: dict[str, Any], fds: list[int]) -> str | None:
        """Why this pool cannot fork a faithful copy of the client's cold start, or None."""
        why = warm_checks.request(request, fds, self.interpreter, self.recorder.baseline, self.environment)
        if why:
            return why
        why = self.refusal or warm_checks.threads() or warm_checks.cuda(self.restorer.hidden) or self._stale() or warm_checks.limits(request["rlimits"])
        held = {*self.preloaded, *self.recorder.loaded}
        return why or warm_checks.shadowed(request.get("shadow_dirs", []), held, set(self.recorder.baseline))

    def _stale(self) -> str | None:
        changed = self.changes.changed() if self.changes is not None else None
        if changed is None:
            return None
        self.retire(f"{changed} changed since it was imported")
        return f"{changed} changed since the pool imported it"

    def _client_event(self, child: Child) -> None:
        try:
            data = child.conn.recv(1)
        except OSError:
            data = b""
        if data:
            return  # a client sends nothing after its request; ignore noise
        self._forget(child)
        if child.pid in self.children and not child.orphaned:
            child.orphaned = True  # its stand-in is gone: the child goes as the cold one would
            _kill_group(child.pid, child.deathsig)

    def _forget(self, child: Child) -> None:
        fd = child.conn.fileno()
        if fd in self.by_fd:
            self.poller.unregister(fd)
            del self.by_fd[fd]
        child.conn.close()

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            self.last_active = time.monotonic()
            if child is None or child.conn.fileno() < 0:
                continue
            try:
                child.channel.send({"exit": status})
            except OSError:
                pass
            self._forget(child)

    def shutdown(self) -> None:
        """Leave nothing behind: no socket, no lock, no child."""
        self.retire("exiting")
        for pid in list(self.children):
            _kill_group(pid, signal.SIGKILL)

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(), "started": self.started, "executable": sys.executable,
            "preloaded": self.preloaded, "unavailable": self.unavailable, "modules": len(sys.modules) + len(self.restorer.hidden),
            "children": sorted(self.children), "served": self.served, "fallbacks": self.fallbacks,
            "last_fallback": self.last_fallback, "refusal": self.refusal, "stopping": self.stopping,
            "idle_exit": self.idle, "idle_for": 0 if self.children else time.monotonic() - self.last_active,
            "memory": warm_checks.memory(),
        }


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _kill_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str], recorder: Recorder) -> list[str]:
    """The pool's life; returns only in a forked worker child (its bootstrap arguments)."""
    parser = argparse.ArgumentParser(prog="python -m phalanx.launch.bootstrap --warm-pool")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--lock-fd", type=int, required=True)
    parser.add_argument("--idle", type=float, default=600.0)
    parser.add_argument("--preload", default="")
    parser.add_argument("--allocation", default="", help="PID:START of the SLURM allocation's process: end with it")
    args = parser.parse_args(argv)
    pool = Pool(args.socket, args.idle, args.lock_fd, recorder)
    pool.within(args.allocation)
    try:
        problem = warm_proto.private_dir(os.path.dirname(args.socket))
        if problem:
            raise OSError(problem)
        pool.preload([m for m in args.preload.split(",") if m])
        pool.listen()
        forked = pool.serve()
    except BaseException as exc:  # noqa: BLE001 - only the pool gets here: a child never raises
        warm_proto.note(pool.log, f"pool failed: {type(exc).__name__}: {exc}")
        pool.shutdown()
        os._exit(1)
    if forked is not None:
        return forked
    pool.shutdown()
    os._exit(0)
