"""Attempt 0: rank 1 fails (exit 3) and the job is retried; from attempt 1 on, ``interrupt.py``
(trains until Ctrl-C, checkpoints, exits as argv[1] says)."""

import os
import runpy
import sys
import time

if os.environ["PHALANX_ATTEMPT"] == "0":
    if os.environ["RANK"] == "1":
        sys.exit(3)
    time.sleep(600)  # stopped when rank 1 fails
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "interrupt.py"), run_name="__main__")
