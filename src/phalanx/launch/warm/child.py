"""A child forked from the warm pool turns itself into what a cold start would have been.

The request holds what the client (``warm_exec``, itself a fresh interpreter started exactly
where the cold process would have been) saw when it started: the descriptors it was given and its
working directory (as descriptors), environment, umask, resource limits, signal dispositions and
mask, ``sys.argv``, ``sys.orig_argv``, ``sys.path`` and how its standard streams were built. The
child takes all of it over, leads a session of its own (as the client did: torchrun and phalanx
start every process with ``start_new_session``), closes every descriptor of the pool, and keeps
the pool's imports aside until the script imports them (``warm_imports``).

A worker then returns into the bootstrap's ``main()`` (see ``warm_pool``); any other module (the
node agent) is run here as ``python -m`` runs it.

Everything this module needs is imported in the pool, before the child hides the pool's modules:
an import after that would show in the script's ``sys.modules``.
"""

from __future__ import annotations

import atexit
import builtins
import ctypes
import fcntl
import gc
import io
import mmap
import os
import resource
import runpy
import signal
import sys
import threading
import traceback
import types

from .recorder import Restorer

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Any, Callable, NoReturn

DISPOSITIONS: dict[str, Any] = {"dfl": signal.SIG_DFL, "ign": signal.SIG_IGN, "int": signal.default_int_handler}
STREAMS = (("stdin", "<stdin>", "r"), ("stdout", "<stdout>", "w"), ("stderr", "<stderr>", "w"))
BOOTSTRAP = "phalanx.launch.bootstrap"


def learner(pool_socket: str, held: set[str]) -> "Callable[[str], None]":
    """Made in the pool, called in a child: tell the pool when the script imports a module worth
    holding next time (torch imports much of itself lazily, torch._dynamo on the first optimizer
    step: what a script's run brought in, the next run finds held). It uses the pool's own socket
    module: a child imports nothing for it."""
    import socket as pool_socket_module

    from . import proto as warm_proto

    told: set[str] = set()

    def on_miss(name: str) -> None:
        if name.partition(".")[0] not in warm_proto.PRELOADABLE or name in held or name in told:
            return
        told.add(name)
        try:
            with pool_socket_module.socket(pool_socket_module.AF_UNIX,
                                           pool_socket_module.SOCK_STREAM | pool_socket_module.SOCK_CLOEXEC) as sock:
                sock.settimeout(1.0)
                sock.connect(pool_socket)
                warm_proto.Channel(sock).send({"op": "learn", "modules": [name]})
        except OSError:
            pass

    return on_miss


def become(request: dict[str, Any], fds: list[int], restorer: Restorer, pool_sockets: list[socket.socket]) -> list[str]:
    """Take the client's place; the pool's imports are already kept aside (``restorer``, hidden
    and installed in the pool before the fork). For a worker (the pool's own module) return its
    arguments: the caller returns them up to the bootstrap's ``main()``, which goes on as the cold
    worker would. Any other module runs here, as ``python -m`` runs it, and this never returns."""
    module = request["module"]
    try:
        _take_over_process(request, fds, pool_sockets)
        # What the pool's start-up (a bootstrap's) left in the importer cache, less its own sys.path[0].
        started = set(restorer.rec.importers[1:])
        _take_over_interpreter(request, fresh_main=module != BOOTSTRAP, importers=started)
        restorer.started()
        signal.pthread_sigmask(signal.SIG_SETMASK, [signal.Signals(s) for s in request["mask"]])
    except BaseException:  # noqa: BLE001 - nothing of the script has run: start it cold
        cold(request)
    if module == BOOTSTRAP:
        return list(request["args"])
    _run(module)


def _take_over_process(request: dict[str, Any], fds: list[int], pool_sockets: list[socket.socket]) -> None:
    os.setsid()
    # Until the module sets its own, nothing outlives the pool. Not procs.die_with_parent: that
    # imports ctypes, and an import here would bring it back into sys.modules before its time.
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    signal.set_wakeup_fd(-1)
    for sock in pool_sockets:
        sock.detach()  # their descriptors are closed below; the objects must not close them again
    *given, cwd = fds
    os.fchdir(cwd)
    numbers = request["fd_numbers"]
    floor = max([*numbers, *fds, 2]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in given]  # out of the targets' way
    for fd, number in zip(moved, numbers):
        os.dup2(fd, number)  # inheritable, as the cold process got it
    keep = set(numbers)
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass
    os.environ.clear()
    os.environ.update(dict(request["env"]))
    show_as(request["orig_argv"], request["env"])  # before the limits: RLIMIT_DATA could refuse it
    os.umask(request["umask"])
    for name, (soft, hard) in request["rlimits"].items():
        limit = getattr(resource, name)
        if resource.getrlimit(limit) != (soft, hard):
            resource.setrlimit(limit, (soft, hard))
    for number, disposition in request["signals"].items():
        try:
            signal.signal(int(number), DISPOSITIONS[disposition])
        except (OSError, ValueError):
            pass


def _take_over_interpreter(request: dict[str, Any], fresh_main: bool, importers: set[str]) -> None:
    # The pool's bootstrap has argv[0] set to its file by runpy, as the cold worker has; a module
    # run from here gets it set by runpy again.
    sys.argv = ["-m" if fresh_main else sys.argv[0], *request["args"]]
    sys.orig_argv = list(request["orig_argv"])
    sys.path[:] = request["path"]
    keep = set(request["importer_cache"]) | (importers if not fresh_main else set())
    for key in [k for k in sys.path_importer_cache if k not in keep]:
        del sys.path_importer_cache[key]
    for fd, ((name, raw_name, mode), config) in enumerate(zip(STREAMS, request["stdio"])):
        stream = _stream(fd, raw_name, mode, config)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    if fresh_main:  # a module run as __main__ starts from the interpreter's initial, empty one
        main = types.ModuleType("__main__")
        main.__loader__ = sys.modules["_frozen_importlib"].BuiltinImporter
        main.__dict__["__annotations__"] = {}
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main


def _stream(fd: int, raw_name: str, mode: str, config: dict[str, Any] | None) -> io.TextIOWrapper | None:
    """A standard stream built as the interpreter builds it (``create_stdio``), with the settings
    the client's interpreter chose for the same descriptor."""
    if config is None:
        return None
    buffering = -1 if config["buffered"] or mode == "r" else 0
    buffer = io.open(fd, mode + "b", buffering, closefd=False)
    raw = buffer.raw if buffering else buffer  # type: ignore[attr-defined]
    raw.name = raw_name  # type: ignore[misc]
    stream = io.TextIOWrapper(buffer, config["encoding"], config["errors"], "\n",  # type: ignore[arg-type]
                              config["line_buffering"], config["write_through"])
    stream.mode = mode  # type: ignore[misc]
    return stream


def _run(module: str) -> NoReturn:
    """``python -m module``: run it as ``__main__``; an escaping exception ends the process as the
    interpreter would end it."""
    try:
        runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        _finish(None)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as Python does: die of the signal
        os.kill(os.getpid(), signal.SIGINT)
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints it
        sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]
        code = 1
    _finish(code)
    os._exit(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def _finish(code: int | None) -> None:
    """What the interpreter's exit does that a script can see: non-daemon threads joined, atexit
    callbacks run, standard streams flushed."""
    if "threading" in sys.modules:
        threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


def cold(request: dict[str, Any]) -> NoReturn:
    """The child could not become a faithful copy: start the module cold, in this process."""
    try:
        sys.stderr.flush()
    finally:
        try:
            env = dict(request["env"])
            env_b = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
            os.execve(sys.executable, request["cold_argv"], env_b)  # type: ignore[arg-type]
        finally:
            os._exit(70)


class _MmMap(ctypes.Structure):
    """``struct prctl_mm_map`` (linux/prctl.h)."""

    _fields_ = [(name, ctypes.c_uint64) for name in (  # type: ignore[assignment]
        "start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
        "arg_start", "arg_end", "env_start", "env_end")] + [
        ("auxv", ctypes.c_void_p), ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]


_SHOWN: list[mmap.mmap] = []  # the memory /proc/self/cmdline and /proc/self/environ now read from


def show_as(argv: list[str], env: list[list[str]]) -> None:
    """Make ``/proc/self/cmdline`` and ``/proc/self/environ`` (what ``ps``, psutil and the script
    itself read there) say what the cold process's would: the kernel reads them from the memory
    ``PR_SET_MM_MAP`` points it at. Raises OSError when the kernel refuses (no CHECKPOINT_RESTORE)."""
    args = b"".join(os.fsencode(a) + b"\0" for a in argv)
    environ = b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in env)
    # Private: the kernel reads these only from anonymous memory, and a shared mapping is a file.
    memory = mmap.mmap(-1, max(1, len(args) + len(environ)), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory.write(args + environ)
    base = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    with open("/proc/self/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()  # from field 3 on (comm may hold spaces)

    def field(number: int) -> int:
        return int(fields[number - 3])

    libc = ctypes.CDLL(None, use_errno=True)
    libc.sbrk.restype = ctypes.c_void_p
    layout = _MmMap(
        start_code=field(26), end_code=field(27), start_data=field(45), end_data=field(46), start_brk=field(47),
        brk=libc.sbrk(0) or field(47), start_stack=field(28), arg_start=base, arg_end=base + len(args),
        env_start=base + len(args), env_end=base + len(args) + len(environ), auxv=None, auxv_size=0,
        exe_fd=0xFFFFFFFF)
    if libc.prctl(35, 14, ctypes.byref(layout), ctypes.sizeof(layout), 0) != 0:  # PR_SET_MM, PR_SET_MM_MAP
        raise OSError(ctypes.get_errno(), "PR_SET_MM_MAP")
    _SHOWN.append(memory)


def freeze() -> None:
    """Before forking: objects the pool made stay out of the children's garbage collections, so
    the pages holding them stay shared."""
    gc.collect()
    gc.freeze()
