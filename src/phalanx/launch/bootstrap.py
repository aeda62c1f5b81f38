"""The shim every worker process runs first: ``python -u -m phalanx.launch.bootstrap [--jax-init] [--frozen CODE_DIR ROOT] MODE TARGET ARGS``.

It makes an unmodified script observable and safe to stop, then gets out of the way:

- stdout and stderr go to this rank's own ``output.log`` (fd-level, so C extensions and
  child processes land there too), never through a launcher's tee; with secrets in its
  environment (``--secret``; ``PHALANX_SECRET_VARS`` names them) through a forked relay that
  masks their values (``launch/relay.py``), and ``error.json`` holds them masked too;
- an uncaught exception is written to ``error.json`` (and to torchrun's
  ``TORCHELASTIC_ERROR_FILE``) so the root cause is known without ``@record``;
- the process dies with its parent (``PR_SET_PDEATHSIG``), so a killed agent leaves no orphans;
- it moves into a cgroup of the rank's own where it can (``launch/strays.py``), so that whatever the
  script starts (a daemon, a child in a session of its own) is found and ended with the attempt;
- it runs the script as python would (``sys.argv``, ``__file__``, ``sys.path[0]``, a fresh
  ``__main__``), with ``--frozen`` its Python code read from the submit-time copy under the
  user's own file names (``launch/frozen.py``);
- with ``--jax-init`` (``--framework jax`` with a topology, not ``--spawn self``: see
  ``core/env.initializes_jax``) it calls ``jax.distributed.initialize`` before the script, so
  that a later call for the same processes is a no-op (``launch/jaxinit.py``);
- it ends the worker without the interpreter's teardown, where torch aborts now and then
  after a successful run (``_exit``).

MODE is ``--script`` (like ``python FILE``; FILE as typed, relative to cwd), ``--module``
(``python -m``) or ``--exec`` (any program, run as given: nothing frozen).
Keep imports here minimal: this runs once per worker.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

TYPE_CHECKING = False  # mypy reads this as True; nothing imports typing at worker start-up
if TYPE_CHECKING:
    from traceback import StackSummary
    from typing import NoReturn

from phalanx.launch.procs import die_with_parent
from phalanx.launch.strays import enlist

# File names inside the rank directory; JobPaths (core/paths.py) documents the layout and
# hands the directory over in PHALANX_RANK_DIR. Not imported here: workers start faster.
OUTPUT_LOG = "output.log"
ERROR_JSON = "error.json"
PROC_JSON = "proc.json"
EXIT_JSON = "exit.json"
USER_METRICS = "user_metrics.jsonl"
TORCH_ERROR_JSON = "torchelastic_error.json"

MODES = ("--script", "--module", "--exec")
SECRET_VARS = "PHALANX_SECRET_VARS"  # phalanx.secrets.mask.VARS_ENV, not imported: workers start faster
_SECRETS: "list[bytes]" = []  # the values to mask, read before the script could change the environment
USAGE = "python -m phalanx.launch.bootstrap [--jax-init] [--frozen CODE_DIR ROOT] {--script|--module|--exec} TARGET [ARGS...]"


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _rank_dir() -> str | None:
    template = os.environ.get("PHALANX_RANK_DIR")
    return template.replace("{rank}", str(_rank())) if template else None


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _redirect_output(rank_dir: str) -> None:
    os.makedirs(rank_dir, exist_ok=True)
    # A lone foreground process keeps the streams it was given (the terminal's, relayed into the
    # log by phalanx: launch/console.py); the script never sees the marker.
    tty = os.environ.pop("PHALANX_TTY", None)
    if os.environ.pop("PHALANX_STDIO", None) != "relay":
        fd = os.open(os.path.join(rank_dir, OUTPUT_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if (tty and _rank() == 0) or _SECRETS:
            from phalanx.launch import relay  # only where it is needed: workers start faster without it

            fd = relay.terminal_into(fd, tty, _SECRETS) if tty and _rank() == 0 else relay.masked_into(fd, _SECRETS)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    os.environ["PHALANX_METRICS_FILE"] = os.path.join(rank_dir, USER_METRICS)
    if "TORCHELASTIC_RUN_ID" in os.environ and "TORCHELASTIC_ERROR_FILE" not in os.environ:
        # torchrun gives each worker one; so does phalanx when it starts a worker with torchrun's
        # variables itself (-n 1, TF, JAX), for scripts decorated with @record.
        os.environ["TORCHELASTIC_ERROR_FILE"] = os.path.join(rank_dir, TORCH_ERROR_JSON)
    _write_json(
        os.path.join(rank_dir, PROC_JSON),
        {
            "pid": os.getpid(),
            "rank": _rank(),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "node_rank": int(os.environ.get("PHALANX_NODE_RANK", "0")),
            "host": os.uname().nodename,
            "started": time.time(),
        },
    )


def _install_stack_dumps() -> None:
    """Every thread's Python stack goes to the rank's log on ``kill -USR2`` (stall diagnosis) and
    when the process dies of SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL (a crash in native code,
    whose exit would otherwise say only the signal). The crash still ends the process by its
    signal: faulthandler re-raises it."""
    import faulthandler

    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR2, all_threads=True, chain=False)


def _user_frames(tb: StackSummary) -> StackSummary:
    """Drop the frames of the bootstrap, its helpers and runpy from a traceback."""
    import traceback

    here = os.path.dirname(__file__)
    skip = (__file__, os.path.join(here, "frozen.py"), os.path.join(here, "jaxinit.py"), "<frozen runpy>", "runpy.py")
    frames = [f for f in tb if not any(f.filename.endswith(s) for s in skip)]
    return traceback.StackSummary.from_list(frames)


def _print_exception(exc: BaseException) -> str:
    """Python's report of an uncaught exception, on stderr, without the bootstrap's frames."""
    import traceback  # only on failure: workers start faster without it
    summary = _user_frames(traceback.extract_tb(exc.__traceback__))
    text = "Traceback (most recent call last):\n" + "".join(summary.format())
    text += "".join(traceback.format_exception_only(type(exc), exc))
    sys.stderr.write(text)
    sys.stderr.flush()
    return text


def _record_exception(exc: BaseException, rank_dir: str | None) -> None:
    text = _masked(_print_exception(exc))
    message = _masked(str(exc))
    now = time.time()
    record = {
        "rank": _rank(),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "node_rank": int(os.environ.get("PHALANX_NODE_RANK", os.environ.get("GROUP_RANK", "0"))),
        "host": os.uname().nodename,
        "pid": os.getpid(),
        "exitcode": 1,
        "type": type(exc).__name__,
        "message": message,
        "traceback": text,
        "timestamp": now,
    }
    if rank_dir:
        _write_json(os.path.join(rank_dir, ERROR_JSON), record)
    torch_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if torch_file:
        # torchelastic's error-file format, so ChildFailedError carries the real cause.
        payload = {
            "message": {
                "message": f"{type(exc).__name__}: {message}",
                "extraInfo": {"py_callstack": text, "timestamp": str(int(now))},
            }
        }
        with open(torch_file, "w") as fh:
            json.dump(payload, fh)


def _masked(text: str) -> str:
    if not _SECRETS:
        return text
    from phalanx.secrets.mask import mask_text

    return mask_text(text, _SECRETS)


def _run(mode: str, target: str, args: list[str], frozen: list[str], jax_init: bool = False) -> None:
    if mode == "--exec":
        try:
            os.execvp(target, [target, *args])
        except OSError as exc:
            sys.stderr.write(f"phalanx: cannot execute '{target}': {exc.strerror}\n")
            raise SystemExit(127) from None
    freezer = None
    if frozen:
        from .frozen import Freezer

        freezer = Freezer(*frozen)
        freezer.install()
    if jax_init:
        from .jaxinit import initialize

        initialize()
    if mode == "--script":
        from .frozen import run_script

        try:
            run_script(target, args, freezer)
        except FileNotFoundError as exc:
            if exc.filename not in (target, os.path.abspath(target)):
                raise
            # python's own words and status for a script that is not there
            sys.stderr.write(f"{sys.executable}: can't open file {os.path.abspath(target)!r}: [Errno 2] No such file or directory\n")
            raise SystemExit(2) from None
    else:
        import runpy

        sys.argv = [target, *args]
        # python -m runs the module in a __main__ that starts with __annotations__ (before 3.14)
        runpy.run_module(target, init_globals={"__annotations__": {}} if sys.version_info < (3, 14) else None,
                         run_name="__main__", alter_sys=True)


def _exit_code(code: object) -> int:
    """The exit status ``raise SystemExit(code)`` gives; like Python, prints a non-int code."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def _exit(code: int) -> NoReturn:
    """End the worker as Python would, without the interpreter's teardown.

    torch 2.13 aborts now and then in that teardown, after the script has finished: one of its
    C++ threads (gloo's ``ProcessGroupGloo::runLoop`` in a core dump) frees a Python object
    once the interpreter is finalizing, dies taking the GIL, and the process ends with
    "terminate called without an active exception" (SIGABRT) although training succeeded;
    about one run in a few hundred here, single and multi-process. So the worker does what
    Python's exit does that a script can see, in Python's order, then ``_exit``s, as
    multiprocessing's children do: non-daemon threads are joined, ``atexit`` handlers run
    (logging, wandb and jax flush there), every open file is flushed, and so is C's stdio.
    Skipped: module teardown and C++ static destructors, and ``__del__`` of objects alive at
    exit, which Python does not promise to run either."""
    import atexit
    import gc
    import io
    import threading

    main_thread = threading.main_thread()
    while True:
        waiting = [t for t in threading.enumerate() if t is not main_thread and not t.daemon]
        if not waiting:
            break
        for thread in waiting:
            thread.join()
    atexit._run_exitfuncs()
    live = gc.get_objects()
    # Text first: its flush moves text into the binary buffer beneath, flushed after it.
    # type(), not isinstance(): that reads __class__, which some objects answer with a warning
    # (torch.distributed.reduce_op: FutureWarning).
    for kind in (io.TextIOWrapper, (io.BufferedWriter, io.BufferedRandom)):
        for stream in [obj for obj in live if issubclass(type(obj), kind)]:
            try:
                if not stream.closed:
                    stream.flush()
            except (OSError, ValueError):
                pass
    del live
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)  # output C extensions printf'ed into stdio's buffer
    except (ImportError, OSError, AttributeError):
        pass
    if "phalanx.launch.relay" in sys.modules:
        sys.modules["phalanx.launch.relay"].drain()
    os._exit(code)


def _warm_pool(argv: list[str]) -> list[str]:
    """Serve as a warm pool (``launch/warm/pool.py``). Returns in each worker the pool forks, with
    that worker's arguments: from here on its stack and modules are a cold worker's."""
    baseline = tuple(sys.modules)
    from phalanx.launch.warm.pool import serve

    return serve(argv, baseline)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--warm-pool"]:
        argv = _warm_pool(argv[1:])
    jax_init = argv[:1] == ["--jax-init"]
    if jax_init:
        argv = argv[1:]
    frozen: list[str] = []
    if argv[:1] == ["--frozen"]:
        frozen, argv = argv[1:3], argv[3:]
    if len(argv) < 2 or argv[0] not in MODES or len(frozen) not in (0, 2):
        sys.stderr.write(f"usage: {USAGE}\n")
        raise SystemExit(2)
    mode, target, args = argv[0], argv[1], argv[2:]
    if os.environ.get(SECRET_VARS):
        from phalanx.secrets.mask import secret_values

        _SECRETS[:] = secret_values(os.environ)
    rank_dir = _rank_dir()
    if rank_dir:
        _redirect_output(rank_dir)
        # After the terminal's relay is forked (ours, not the script's), before the script runs:
        # everything the script starts stays in the rank's cgroup (launch/strays.py).
        enlist()
    die_with_parent(signal.SIGKILL)
    _install_stack_dumps()
    try:
        _run(mode, target, args, frozen, jax_init)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt as exc:
        # Ctrl-C (a SIGINT passed on), not a failure of the script: python's traceback and
        # status (130), no error record.
        _print_exception(exc)
        code = 128 + signal.SIGINT
    except BaseException as exc:  # noqa: BLE001 - the whole point is to record anything
        _record_exception(exc, rank_dir)
        code = 1
    if rank_dir:
        # torch reaps its workers itself: after a Ctrl-C the agent learns their statuses here
        _write_json(os.path.join(rank_dir, EXIT_JSON), {"exitcode": code, "time": time.time()})
    _exit(code)


if __name__ == "__main__":
    main()
