"""A gloo DDP loop for the recovery benchmark: rank 1 kills itself (SIGKILL) at --die-at on
the first attempt only; every step line carries a wall-clock time so the harness can measure
from the death to the first step of the restarted training."""

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--die-at", type=int, default=5)
p.add_argument("--marker", required=True, help="file recording the death; its presence means 'already died'")
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1000)
for step in range(1, args.steps + 1):
    dist.all_reduce(t)
    if rank == 0:
        print(f"step={step} t={time.time():.6f}", flush=True)
    if step == args.die_at and rank == 1 and not os.path.exists(args.marker):
        with open(args.marker, "w") as fh:
            fh.write(f"{time.time():.6f}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
dist.destroy_process_group()
