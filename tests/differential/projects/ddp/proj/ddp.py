"""A torchrun-style DDP script: reads RANK/WORLD_SIZE, all-reduces, prints."""

import os
import sys

import torch
import torch.distributed as dist

from observe import record

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
# One write per line: two ranks share torchrun's stdout, and print() may write the text and the
# newline separately, so the reference run's lines could interleave.
sys.stdout.write(f"rank {rank} of {world} local_rank {os.environ['LOCAL_RANK']} sum {int(t.item())}\n")
sys.stdout.flush()
record(globals())
dist.destroy_process_group()
