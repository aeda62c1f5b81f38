"""DDP training throughput on GPUs (NCCL), for bench/gpu_check.sh: the same script under
`phalanx run -n N` and `torchrun --standalone --nproc-per-node N`.

An MLP (8 layers of 4096, bf16 autocast) on random data on each rank's GPU; after --warmup steps,
--steps timed steps; rank 0 prints ``throughput steps_per_s=X samples_per_s=Y`` (whole job). Also
``--nan-at N``: print ``loss=nan`` at step N and keep training (NaN detection on a CUDA run), with
``--seconds S`` to run at least that long."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--batch", type=int, default=256)
p.add_argument("--nan-at", type=int, default=0)
p.add_argument("--seconds", type=float, default=0.0)
args = p.parse_args()

local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1 or "RANK" in os.environ
if distributed:
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rank = dist.get_rank() if distributed else 0
world = dist.get_world_size() if distributed else 1
layers = []
for _ in range(8):
    layers += [torch.nn.Linear(4096, 4096), torch.nn.GELU()]
model = torch.nn.Sequential(*layers).cuda()
if distributed:
    model = DDP(model, device_ids=[local])
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(args.batch, 4096, device="cuda")
started = None
step = 0
began = time.time()
while step < args.warmup + args.steps or time.time() - began < args.seconds:
    step += 1
    if step == args.warmup + 1:
        torch.cuda.synchronize()
        started = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if rank == 0 and step % 10 == 0:
        value = float("nan") if args.nan_at and step >= args.nan_at else loss.item()
        if value != value:
            print(f"nan printed at {time.time():.3f}", flush=True)
        print(f"step={step} loss={value}", flush=True)
    if step == args.warmup + args.steps:
        torch.cuda.synchronize()
        took = time.perf_counter() - started
        if rank == 0:
            print(f"throughput steps_per_s={args.steps / took:.3f} samples_per_s={args.steps * args.batch * world / took:.1f}",
                  flush=True)
if distributed:
    dist.destroy_process_group()
