"""A data-parallel training loop (gloo DDP on CPU) whose rank ``--slow-rank`` does ``--factor``
times the work of the others per step; only rank 0 prints. Used by bench/bench_health.py and the
straggler tests: phalanx has to find the slow rank with no help from the script."""

import argparse
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=60.0, help="train this long, then end")
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--factor", type=float, default=3.0, help="work of the slow rank per step, x the others'")
parser.add_argument("--work", type=int, default=12, help="matrix products per step of a normal rank")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256)
work = round(args.work * (args.factor if rank == args.slow_rank else 1.0))
began = time.time()
step = 0
while True:
    y = x
    for _ in range(work):  # the rank's own share of a step: data, augmentation, forward work
        y = torch.tanh(y @ model.module.weight.detach())
    loss = (model(x) - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()  # DDP's gradient all_reduce: every rank waits here for the slowest
    opt.step()
    step += 1
    done = torch.tensor([float(time.time() - began >= args.seconds)])
    if step % 10 == 0:
        dist.all_reduce(done)  # stop together
        if rank == 0:
            print(f"step {step} loss={loss.item():.4f}", flush=True)
        if done.item() > 0:
            break
dist.destroy_process_group()
