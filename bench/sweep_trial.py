"""One sweep trial for bench/bench_sweep.py: sleeps 0.2 s, prints ``loss=...`` (depends on --lr).

    python bench/sweep_trial.py --lr 0.01

When ``SWEEP_BENCH_TIMES`` names a file, one line ``START END PID LR`` (epoch seconds) is
appended to it (a single ``write`` of a short line on an ``O_APPEND`` file, so concurrent
trials never interleave). START is taken before argument parsing, END after the print.
Stdlib only: the same script runs under phalanx, xargs and Ray Tune.
"""

import time

START = time.time()

import argparse  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402

SLEEP_S = 0.2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    args = parser.parse_args()
    time.sleep(SLEEP_S)
    loss = (math.log10(args.lr) + 2.5) ** 2 + 0.1  # minimal at lr = 10**-2.5
    print(f"loss={loss:.6f}", flush=True)
    end = time.time()
    times = os.environ.get("SWEEP_BENCH_TIMES")
    if times:
        fd = os.open(times, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{START:.6f} {end:.6f} {os.getpid()} {args.lr!r}\n".encode())
        finally:
            os.close(fd)


if __name__ == "__main__":
    main()
