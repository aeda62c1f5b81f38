"""A script that starts its own workers, like the classic ImageNet example
with --multiprocessing-distributed: the launcher runs one copy per node and
the script spawns --nproc-per-node processes itself.
"""

import argparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--num-nodes", type=int, required=True)
    p.add_argument("--nproc-per-node", type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, required=True)
    return p.parse_args()


def worker(local_rank, args):
    rank = args.node_rank * args.nproc_per_node + local_rank
    world_size = args.num_nodes * args.nproc_per_node
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master_addr}:{args.master_port}",
        world_size=world_size,
        rank=rank,
    )
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"spawned rank={rank} world={world_size} sum={int(t.item())}", flush=True)
    dist.destroy_process_group()


def main():
    args = parse_args()
    # spawn passes the local index as the first argument and raises if any
    # worker fails, so this process's exit code reflects the whole node.
    mp.spawn(worker, args=(args,), nprocs=args.nproc_per_node)


if __name__ == "__main__":
    main()
