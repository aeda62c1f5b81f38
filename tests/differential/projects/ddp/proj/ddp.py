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
# One write: under torchrun both ranks share one stdout, and with PYTHONUNBUFFERED print's text
# and its newline are two writes that the other rank's line can fall between.
sys.stdout.write(f"rank {rank} of {world} local_rank {os.environ['LOCAL_RANK']} sum {int(t.item())}\n")
record(globals())
dist.destroy_process_group()
