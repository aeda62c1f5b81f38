"""Trains until Ctrl-C; on KeyboardInterrupt it checkpoints (counting any further SIGINT) and
exits as argv[1] says: ``exit0`` (default), ``raise`` (uncaught), ``exit3``, or ``stubborn``
(ignores SIGINT and SIGTERM from then on: only SIGKILL ends it)."""

import os
import signal
import sys
import time

mode = sys.argv[1] if len(sys.argv) > 1 else "exit0"
rank = os.environ.get("RANK", "-")
more = []


def say(text: str) -> None:
    # One write per line: torchrun's two workers share its stdout, and under PYTHONUNBUFFERED
    # print() writes the text and the newline apart, so two ranks' lines could glue together.
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


try:
    say(f"ready {rank} pid={os.getpid()}")
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    signal.signal(signal.SIGINT, lambda *_: more.append(signal.SIGINT))
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, lambda *_: more.append(signal.SIGTERM))
        say(f"ignoring {rank}")
        while True:
            time.sleep(0.05)
    say(f"interrupted {rank}")
    time.sleep(1.0)  # a checkpoint takes a while; a second SIGINT meanwhile would be counted
    with open(f"ckpt_{rank}.txt", "w") as fh:
        fh.write(f"sigints={1 + len(more)}\n")
    say(f"saved {rank}")
    if mode == "raise":
        raise
    if mode == "exit3":
        sys.exit(3)
