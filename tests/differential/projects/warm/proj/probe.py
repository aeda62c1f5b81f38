"""What a process can find out about how it was started, beyond what observe.record keeps: the
differential test of warm starts runs this under `phalanx run --cold` and `phalanx run` (warm)."""

import os
import re
import signal
import sys
import traceback

try:
    import torch  # a heavy import the pool holds: it must come back as a cold import leaves it
except ImportError:
    torch = None

from observe import record


def proc_file(name):
    with open(f"/proc/self/{name}", "rb") as fh:
        return [part.decode("utf-8", "backslashreplace") for part in fh.read().split(b"\0") if part]


def status():
    fields = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
    caught = int(fields["SigCgt"], 16) & ~(1 << 32)  # glibc's signal 33: see docs/warm.md, Known differences
    return {"SigCgt": format(caught, "016x"), **{k: fields[k] for k in ("SigIgn", "SigBlk", "Umask", "NoNewPrivs")}}


def descriptors():
    out = {}
    for name in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            # A pipe or socket is named by its inode, new in every run (a lone foreground process
            # writes to pipes phalanx relays: launch/console.py); its kind must still match.
            target = re.sub(r"^(pipe|socket):\[\d+\]$", r"\1", os.readlink(f"/proc/self/fd/{name}"))
            out[name] = [target, os.get_inheritable(int(name))]
        except OSError:
            pass  # the listing's own descriptor
    return out


umask = os.umask(0)
os.umask(umask)
print("to stdout", sys.argv[1:], flush=True)
print("to stderr", file=sys.stderr, flush=True)
record(
    globals(),
    orig_argv=sys.orig_argv, path=sys.path, modules=sorted(sys.modules), cmdline=proc_file("cmdline"),
    proc_environ=sorted(proc_file("environ")), status=status(), umask=umask, descriptors=descriptors(),
    signals={s.name: str(signal.getsignal(s)) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)
             and s < signal.SIGRTMIN},
    mask=sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    session_leader=os.getsid(0) == os.getpid(), group_leader=os.getpgid(0) == os.getpid(),
    stack=[(frame.filename, frame.name) for frame in traceback.extract_stack()],
    stdio=[(s.encoding, s.errors, s.line_buffering) for s in (sys.stdin, sys.stdout, sys.stderr)],
    torch=torch.__version__ if torch else None,
)
sys.exit(3)
