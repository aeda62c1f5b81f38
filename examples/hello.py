"""Smallest distributed smoke test: join the group, all_reduce once, say hello.

Used as a launcher benchmark, so it does as little as possible beyond
importing torch and one collective.
"""

import os

import torch
import torch.distributed as dist


def main():
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if world_size == 1:
        print("hello from rank 0 of 1", flush=True)
        return

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # One collective proves every rank really reached every other one.
    t = torch.ones(1)
    dist.all_reduce(t)
    assert int(t.item()) == world_size, f"all_reduce gave {t.item()}, expected {world_size}"
    print(f"hello from rank {rank} of {world_size}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
