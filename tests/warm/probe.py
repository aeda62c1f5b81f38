"""Writes what a script can see of how it was started to the JSON file named by its first argument.

tests/warm runs it cold (``python -u -m phalanx.launch.bootstrap --script probe.py``, or
``phalanx run --cold``) and warm, and compares. ``--torch`` imports torch afterwards and records
what changed; ``--print`` also prints a few lines (the output is compared too).
"""

import sys

MODULES = list(sys.modules)
MAIN_KEYS = list(globals())

import atexit  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import stat  # noqa: E402
import threading  # noqa: E402
import warnings  # noqa: E402


def _disposition(signum):
    handler = signal.getsignal(signum)
    names = {signal.SIG_DFL: "dfl", signal.SIG_IGN: "ign", signal.default_int_handler: "int", None: "none"}
    return names.get(handler, getattr(handler, "__qualname__", repr(handler)))


def _status():
    with open("/proc/self/status") as fh:
        return {k: v.strip() for k, _, v in (line.partition(":") for line in fh) if k in ("SigBlk", "SigIgn", "SigCgt", "NoNewPrivs")}


def _pdeathsig():
    import ctypes

    value = ctypes.c_int()
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
    return value.value


def _stream(stream):
    if stream is None:
        return None
    buffer = stream.buffer
    raw = getattr(buffer, "raw", buffer)
    return {"encoding": stream.encoding, "errors": stream.errors, "line_buffering": stream.line_buffering,
            "write_through": stream.write_through, "buffer": type(buffer).__name__, "mode": stream.mode,
            "name": stream.name, "raw_name": raw.name, "raw_mode": raw.mode, "closefd": raw.closefd,
            "newlines": repr(stream.newlines), "fileno": stream.fileno()}


def _fd(fd):
    import fcntl

    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return {"dev": info.st_dev, "ino": info.st_ino, "type": stat.S_IFMT(info.st_mode), "fl": fcntl.fcntl(fd, fcntl.F_GETFL),
            "fd": fcntl.fcntl(fd, fcntl.F_GETFD), "tty": os.isatty(fd)}


def snapshot():
    import resource

    umask = os.umask(0)
    os.umask(umask)
    return {
        "argv": sys.argv, "orig_argv": sys.orig_argv, "executable": sys.executable, "path": sys.path,
        "flags": list(sys.flags), "modules": MODULES, "main_keys": MAIN_KEYS, "file": __file__, "name": __name__,
        "main": repr(sys.modules["__main__"]), "spec": repr(__spec__), "cwd": os.getcwd(), "umask": umask,
        "environ": dict(os.environ), "environb_order": [k.decode("latin-1") for k in os.environb],
        "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in sorted(dir(resource)) if n.startswith("RLIMIT_")},
        "signals": {signal.Signals(s).name if s in signal.Signals._value2member_map_ else str(s): _disposition(s)
                    for s in sorted(signal.valid_signals()) if s not in (signal.SIGKILL, signal.SIGSTOP)},
        "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])), "status": _status(),
        "pgrp_is_pid": os.getpgrp() == os.getpid(), "sid_is_pid": os.getsid(0) == os.getpid(),
        "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")), "stdio": [_fd(fd) for fd in range(3)],
        "streams": [_stream(s) for s in (sys.stdin, sys.stdout, sys.stderr)],
        "dunder_streams": [s is d for s, d in ((sys.stdin, sys.__stdin__), (sys.stdout, sys.__stdout__), (sys.stderr, sys.__stderr__))],
        "pdeathsig": _pdeathsig(), "threads": [t.name for t in threading.enumerate()],
        "warnings": [repr(f) for f in warnings.filters], "atexit": atexit._ncallbacks(),
        "meta_path": [repr(f) if isinstance(f, type) else type(f).__qualname__ for f in sys.meta_path],
        "path_hooks": [getattr(h, "__qualname__", repr(type(h))) for h in sys.path_hooks],
        "importer_cache": sorted(sys.path_importer_cache),
        "recursion": sys.getrecursionlimit(), "switch": sys.getswitchinterval(), "gc": [gc.isenabled(), gc.get_threshold()],
        "dlopen": sys.getdlopenflags(), "hooks": [sys.excepthook is sys.__excepthook__, sys.displayhook is sys.__displayhook__],
        "nice": os.nice(0), "affinity": sorted(os.sched_getaffinity(0)), "main_thread": threading.main_thread().name,
        "import_func": repr(__import__("builtins").__import__),
        "stack": [(f.filename, f.lineno, f.name) for f in __import__("traceback").extract_stack()],
        "proc_cmdline": open("/proc/self/cmdline", "rb").read().decode("utf-8", "replace").split("\0"),
        "proc_environ": open("/proc/self/environ", "rb").read().decode("utf-8", "replace").split("\0"),
    }


def after_torch():
    import copyreg

    before = set(sys.modules)
    import torch

    return {"added": [m for m in sys.modules if m not in before], "threads": torch.get_num_threads(),
            "interop": torch.get_num_interop_threads(), "seed": torch.initial_seed(),
            "warnings": [repr(f) for f in warnings.filters], "atexit": atexit._ncallbacks(),
            "copyreg": sorted(repr(k) for k in copyreg.dispatch_table), "cuda": torch.cuda.is_initialized()}


def main():
    out = {"start": snapshot()}
    if "--print" in sys.argv:
        print("probe: hello", sys.argv[1:], flush=True)
        print("probe: to stderr", file=sys.stderr, flush=True)
    if "--torch" in sys.argv:
        out["torch"] = after_torch()
    with open(sys.argv[1], "w") as fh:
        json.dump(out, fh, indent=1, sort_keys=True, default=repr)


if __name__ == "__main__":
    main()
