"""Prints one line with the wall-clock time as soon as it starts (after joining the group)."""
import time

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"first rank={dist.get_rank()} t={time.time():.6f}", flush=True)
dist.destroy_process_group()
