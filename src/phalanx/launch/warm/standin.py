"""``python -m MODULE ARGS``, forked from the warm pool; the stand-in for the forked process.

    python [-u] -m phalanx.launch.warm.standin [--dir DIR] [--idle SECONDS] [--preload torch,...] -- MODULE ARGS...

Started exactly where the cold ``python -m MODULE ARGS`` would have been (by torchrun, the node
agent or the supervisor), it records what that process would have started with (environment,
working directory, standard streams, umask, resource limits, signal dispositions and mask,
``sys.argv``/``sys.path``), asks its environment's pool (starting it if there is none) to fork a
child that takes all of that over, and then stands in for the child until it ends:

- every signal it gets is passed on to the child's process group (torchrun and the supervisor
  signal process groups), so the child sees SIGTERM, SIGINT, SIGUSR2... as the cold one would;
- it ends as the child ended: the same exit status, or killed by the same signal;
- it dies with its parent (``PR_SET_PDEATHSIG``), and when it dies, whatever killed it, the pool
  sends the child the signal a cold process would have got from its own ``PR_SET_PDEATHSIG``
  (SIGTERM for the node agent, SIGKILL otherwise), so no child outlives its stand-in.

Whenever the pool cannot serve it faithfully (or there is no pool and none can start), it
replaces itself with the cold process (``exec``): same pid, same everything, a little later.
The reason is noted in the pool's log (``phalanx pool status``), never in the job's output.
"""

import sys

# What the interpreter had loaded when it came to run this module; less this module's own package
# (``phalanx.launch.warm``), which ``python -m phalanx.launch.bootstrap`` (the cold start) never loads.
_BASELINE = tuple(name for name in sys.modules if name != __package__)
# Likewise the path importer cache, less the entry importing this module made for its own directory.
_IMPORTER_CACHE = tuple(path for path in sys.path_importer_cache if path != __file__.rpartition("/")[0])


def _inherited() -> "list[int]":
    """The descriptors this process was given (inheritable ones: all of the cold process's)."""
    import os

    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.get_inheritable(int(name)):
                found.append(int(name))
        except OSError:
            pass  # the listing's own
    return sorted(found)


_INHERITED = _inherited()

# Only C modules and what the interpreter has loaded already: this runs before every warm start
# (``signal``, ``socket`` and ``json`` would pull in ``enum`` and ``re``: tens of milliseconds).
import _signal as signal  # noqa: E402 - after the baseline: this module's own imports are not the cold start's
import _socket  # noqa: E402
import io  # noqa: E402
import os  # noqa: E402

from . import proto as warm_proto  # noqa: E402

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

START_TIMEOUT = 600.0  # a pool importing torch on a loaded machine takes seconds, rarely minutes
# Not passed on: what cannot be caught, what only this process's own faults raise, SIGCHLD
# (about this process's children), SIGPIPE and SIGXFSZ (its own writes).
NOT_FORWARDED = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
                 signal.SIGILL, signal.SIGTRAP, signal.SIGSYS, signal.SIGPIPE, signal.SIGXFSZ}
FORWARDED = sorted(s for s in signal.valid_signals() if s not in NOT_FORWARDED and s < signal.SIGRTMIN)
DEATHSIG = {"phalanx.launch.agent": signal.SIGTERM}  # the agent's own PR_SET_PDEATHSIG; else SIGKILL


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG(SIGKILL), as ``procs.die_with_parent`` (not imported: it loads ``signal``)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> "NoReturn":
    options, module, args = _parse(argv)
    started = _capture()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    _die_with_parent()
    cold = _cold_argv(module, args)
    environ = os.environ
    directory = options.get("--dir") or warm_proto.pool_dir(environ)
    key = warm_proto.pool_key(environ)
    log = os.path.join(directory, f"{key}.log")
    try:
        reply = _ask(directory, key, options, module, args, started, cold)
    except Exception as exc:  # noqa: BLE001 - whatever went wrong, the cold start is still right
        reply = {"cold": f"{type(exc).__name__}: {exc}"}
    if "pid" not in reply:
        if warm_proto.private_dir(directory) is None:  # never write into a directory that is not ours
            warm_proto.note(log, f"cold start of {module} (pid {os.getpid()}): {reply.get('cold')}")
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.execv(sys.executable, cold)
    _stand_in(reply["pid"], reply["channel"], mask)


def _parse(argv: list[str]) -> tuple[dict[str, str], str, list[str]]:
    options: dict[str, str] = {}
    words = list(argv)
    while words and words[0] != "--":
        if len(words) < 2 or words[0] not in ("--dir", "--idle", "--preload"):
            sys.stderr.write(f"usage: {__doc__.strip().splitlines()[2].strip()}\n")  # type: ignore[union-attr]
            raise SystemExit(2)
        options[words[0]] = words[1]
        words = words[2:]
    if len(words) < 2:
        sys.stderr.write("phalanx.launch.warm.standin: no module given after --\n")
        raise SystemExit(2)
    return options, words[1], words[2:]


def _capture() -> "dict[str, Any]":
    """What this interpreter started with: what the cold one would have started with."""
    import resource

    signals = {}
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        signals[int(signum)] = "ign" if handler is signal.SIG_IGN else "int" if handler is signal.default_int_handler else "dfl"
    umask = os.umask(0o022)
    os.umask(umask)
    stdio = []
    streams: "list[Any]" = [sys.stdin, sys.stdout, sys.stderr]
    for stream in streams:
        stdio.append(None if stream is None else {
            "encoding": stream.encoding, "errors": stream.errors, "line_buffering": stream.line_buffering,
            "write_through": stream.write_through, "buffered": isinstance(stream.buffer, io.BufferedIOBase),
        })
    return {
        "signals": signals,
        "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "umask": umask,
        "rlimits": {name: list(resource.getrlimit(getattr(resource, name)))
                    for name in sorted(dir(resource)) if name.startswith("RLIMIT_")},
        "stdio": stdio, "fd_numbers": _INHERITED, "session_leader": os.getsid(0) == os.getpid(),
        "path": list(sys.path), "importer_cache": list(_IMPORTER_CACHE),
    }


def _cold_argv(module: str, args: list[str]) -> list[str]:
    """The command line of the cold start: this one's, with this module's part taken out."""
    orig = list(sys.orig_argv)
    for i in range(1, len(orig) - 1):
        if orig[i] == "-m" and orig[i + 1] == __spec__.name:  # type: ignore[name-defined]
            return [orig[0], *orig[1:i], "-m", module, *args]
    return [sys.executable, "-m", module, *args]


def _ask(directory: str, key: str, options: dict[str, str], module: str, args: list[str],
         started: "dict[str, Any]", cold: list[str]) -> "dict[str, Any]":
    """The pool's answer: ``{"pid", "channel"}`` when it forked the child, else ``{"cold": why}``."""
    problem = warm_proto.private_dir(directory)
    if problem:
        return {"cold": problem}
    preload = [m for m in options.get("--preload", "").split(",") if m]
    sock = _connect(directory, key, float(options.get("--idle", 600)), preload, cold)
    if isinstance(sock, str):
        return {"cold": sock}
    fds = started["fd_numbers"]
    cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    words = args[1:] if args[:1] == ["--jax-init"] else args  # the bootstrap's options first:
    words = words[3:] if words[:1] == ["--frozen"] else words  # [--jax-init] [--frozen CODE_DIR ROOT]
    script_dir = [os.path.dirname(os.path.abspath(words[1]))] if words[:1] == ["--script"] and len(words) > 1 else []
    request = {
        "op": "run", "protocol": warm_proto.PROTOCOL, "interpreter": warm_proto.interpreter(),
        "baseline": list(_BASELINE), "module": module, "args": args, "preload": preload,
        "deathsig": int(DEATHSIG.get(module, signal.SIGKILL)), "orig_argv": cold, "cold_argv": cold,
        "env": list(os.environ.items()), "shadow_dirs": [os.getcwd(), *script_dir], "client": os.getpid(),
        **started,
    }
    channel = warm_proto.Channel(sock)
    sock.settimeout(START_TIMEOUT)
    try:
        channel.send(request, [*fds, cwd])
    finally:
        os.close(cwd)
    received = channel.receive()
    if received is None:
        return {"cold": "the pool closed the connection"}
    reply, _ = received
    assert isinstance(reply, dict)
    if "pid" in reply:
        sock.settimeout(None)
        reply["channel"] = channel
    return reply


def _connect(directory: str, key: str, idle: float, preload: "list[str]", cold: "list[str]") -> "_socket.socket | str":
    """A connection to this environment's pool, or why there is none (then one is starting)."""
    path = os.path.join(directory, f"{key}.sock")
    sock = _try_connect(path)
    if sock is not None:
        return sock
    import fcntl

    lock = _high(os.open(os.path.join(directory, f"{key}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a live pool holds it, from its start
        except BlockingIOError:
            return "the pool of this environment is starting"
        allocation = _allocation()
        if allocation is None:
            return "under SLURM with no slurmstepd or salloc above this process: a pool could outlive the allocation"
        options = cold[1:cold.index("-m")] if "-m" in cold else []
        argv = [sys.executable, *options, "-m", "phalanx.launch.bootstrap", "--warm-pool", "--socket", path,
                "--lock-fd", str(lock), "--idle", f"{idle:g}", "--preload", ",".join(preload),
                *(["--allocation", allocation] if allocation else [])]
        _spawn_detached(argv, warm_proto.pool_environment(os.environ), lock, os.path.join(directory, f"{key}.log"))
        return "no pool was running; one is starting for the next runs"
    finally:
        os.close(lock)  # the pool holds the lock through its own copy now


def _allocation() -> "str | None":
    """Under SLURM (``SLURM_JOB_ID`` set): the allocation's process above this one, as PID:START
    (``slurmstepd`` on a node, ``salloc`` where it runs the shell), which the pool must not
    outlive; None when there is none to be found. Elsewhere: ""."""
    if "SLURM_JOB_ID" not in os.environ:
        return ""
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            return None
        comm = stat[stat.index(b"(") + 1:stat.rindex(b")")]
        fields = stat[stat.rindex(b")") + 2:].split()
        if comm in (b"slurmstepd", b"salloc"):
            return f"{pid}:{int(fields[19])}"
        pid = int(fields[1])
    return None


def _high(fd: int) -> int:
    """``fd`` moved to 10 or above, out of the way of the standard descriptors."""
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return int(moved)


def _spawn_detached(argv: "list[str]", env: "dict[str, str]", lock: int, log_path: str) -> None:
    """Start ``argv`` as a daemon (its own session, not our child, nothing of ours inherited but
    ``lock``, which passes to it with the lock held); returns at once."""
    log = _high(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600))
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.set_inheritable(lock, True)
                os.closerange(3, lock)
                os.closerange(lock + 1, 1 << 16)
                os.chdir("/")
                os.execve(sys.executable, argv, env)
        finally:
            os._exit(0)
    os.close(log)
    os.waitpid(pid, 0)


def _try_connect(path: str) -> "_socket.socket | None":
    sock = warm_proto.unix_socket()
    try:
        sock.connect(path)
        return sock
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None


def _stand_in(pid: int, channel: warm_proto.Channel, mask: "Any") -> "NoReturn":
    """Pass signals on to the child until it ends, then end the same way."""
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except OSError:
        pidfd = None

    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # signals held back until now go on as well
    received = channel.receive()
    if received is not None and isinstance(received[0], dict) and "exit" in received[0]:
        status = int(received[0]["exit"])
        if os.WIFEXITED(status):
            os._exit(os.WEXITSTATUS(status))
        _die_of(os.WTERMSIG(status))
    # The pool is gone (its children die with it): wait for the child, then report it killed.
    if pidfd is not None:
        import select

        select.select([pidfd], [], [])  # readable when the child has exited
    _die_of(signal.SIGKILL)


def _die_of(signum: int) -> "NoReturn":
    import resource

    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
    except (OSError, ValueError):
        pass
    os._exit(128 + signum)


def deferred(fd: int) -> "list[str]":
    """``--defer FD``: started ahead by a node agent, before its rank is known
    (``launch/workers.py``, a retry's workers ready while the rendezvous runs): wait on FD for
    ``{"argv", "env", "log"}``, the stand-in's exact command line (``python -u -m
    phalanx.launch.warm.standin OPTIONS -- MODULE ARGS``) and environment, then become that stand-in:
    environment, ``sys.orig_argv``, standard output and error (LOG), and the descriptors it holds.
    What it captured at its start (the modules of the interpreter's start-up, the importer cache)
    is a fresh ``python -m phalanx.launch.warm.standin``'s, as the cold stand-in's. The end of FD
    without a message: not needed, it exits."""
    import json  # after the baseline, while waiting: the stand-in's own, not the child's

    chunks = []
    while True:
        data = os.read(fd, 1 << 16)
        if not data:
            break
        chunks.append(data)
    os.close(fd)
    if not chunks:
        os._exit(0)
    command = json.loads(b"".join(chunks))
    argv = [str(a) for a in command["argv"]]
    if command.get("log"):
        out = os.open(command["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
    os.environ.clear()
    os.environ.update(command["env"])
    sys.orig_argv = argv
    sys.argv = [sys.argv[0], *argv[4:]]
    global _INHERITED
    _INHERITED = _inherited()
    return argv[4:]


if __name__ == "__main__":
    main(deferred(int(sys.argv[2])) if sys.argv[1:2] == ["--defer"] else sys.argv[1:])
