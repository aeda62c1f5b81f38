"""A tqdm-style bar on stderr (``\\r``, no newline until done), each step shown before the next
is allowed (the test creates ``go<N>`` once it saw step N: so a bar that arrives only at the
next newline fails), and a coloured word where stdout is a terminal. Rank 0 draws the bar."""

import os
import sys
import time

rank = int(os.environ.get("RANK", "0"))
if rank == 0:
    for step in range(1, 4):
        sys.stderr.write(f"\rtraining: step {step}/3")
        sys.stderr.flush()
        while not os.path.exists(f"go{step}"):
            time.sleep(0.02)
    sys.stderr.write("\n")
print("\x1b[32mgreen\x1b[0m" if sys.stdout.isatty() else "plain", flush=True)
