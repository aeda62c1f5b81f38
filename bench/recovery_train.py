"""A gloo DDP loop for the recovery benchmark: rank 1 kills itself (SIGKILL) at --die-at on the
first attempt only (the --marker file records the death and means "already died").

Every rank prints, with the wall-clock time: ``first`` as the script's first statement (before
``import torch``: when the new attempt's ranks are running), ``collective`` after its first
all_reduce (when the new process group works), and ``step=N`` lines."""

import os
import time

print(f"first t={time.time():.6f} rank={os.environ.get('RANK')} "
      f"attempt={os.environ.get('PHALANX_ATTEMPT') or os.environ.get('TORCHELASTIC_RESTART_COUNT')}", flush=True)

import argparse  # noqa: E402
import signal  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10)
p.add_argument("--die-at", type=int, default=3)
p.add_argument("--marker", required=True, help="file recording the death; its presence means 'already died'")
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1000)
for step in range(1, args.steps + 1):
    dist.all_reduce(t)
    if step == 1:
        print(f"collective t={time.time():.6f} rank={rank}", flush=True)
    if rank == 0:
        print(f"step={step} t={time.time():.6f}", flush=True)
    if step == args.die_at and rank == 1 and not os.path.exists(args.marker):
        with open(args.marker, "w") as fh:
            fh.write(f"{time.time():.6f}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
dist.destroy_process_group()
