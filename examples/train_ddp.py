"""Train a small MLP regressor with DistributedDataParallel.

Launch with torchrun (or anything that sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT), or run it as a plain single process.

Optional environment:
  PHALANX_STATE_DIR   checkpoint.pt is written here and resumed from at start
  PHALANX_OUTPUT_DIR  the final model.pt is written here

On SIGTERM (a stop or a preemption) or SIGINT (Ctrl-C) every rank finishes its current step,
rank 0 writes a checkpoint, and the script exits with 128 + the signal (143, 130), so a resumed
run loses no finished step.
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

IN_FEATURES = 16
DATA_SEED = 1234


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=10,
                   help="steps between checkpoints (0 disables)")
    p.add_argument("--sleep", type=float, default=0.0,
                   help="seconds to sleep per step, to make runs slower")
    p.add_argument("--fail-at-step", type=int, default=None,
                   help="raise on --fail-rank after this step; the step's "
                        "checkpoint (if due) is written first, so a restart "
                        "resumes past the failure")
    p.add_argument("--fail-rank", type=int, default=0)
    p.add_argument("--print-grad-checksum", action="store_true",
                   help="print per-rank gradient and input checksums after "
                        "the first backward")
    return p.parse_args()


def setup():
    """Return (rank, world_size, device); joins a process group only when launched."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    # A plain `python train_ddp.py` has no rendezvous info; a group of one
    # would only need a made-up port, so skip it and train without DDP.
    if "WORLD_SIZE" not in os.environ:
        return 0, 1, device

    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), device


def make_dataset(num_samples):
    # Fixed seed so every rank builds the identical dataset; the sampler
    # then hands each rank a disjoint shard.
    g = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(num_samples, IN_FEATURES, generator=g)
    w_true = torch.randn(IN_FEATURES, 1, generator=g)
    y = x @ w_true + 0.1 * torch.randn(num_samples, 1, generator=g)
    return TensorDataset(x, y)


def save_atomically(obj, path):
    # A crash mid-write must never leave a truncated checkpoint behind.
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


class StopRequest:
    """Set by SIGTERM or SIGINT; ranks agree on it each step so they all stop at the same step."""

    def __init__(self):
        self.requested = False
        self.signum = signal.SIGTERM
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        self.requested, self.signum = True, signum

    def agreed(self, distributed, device):
        if not distributed:
            return self.requested
        flag = torch.tensor([1.0 if self.requested else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def main():
    args = parse_args()
    stop = StopRequest()
    torch.manual_seed(args.seed)
    rank, world_size, device = setup()
    distributed = dist.is_initialized()

    dataset = make_dataset(args.steps_per_epoch * args.batch_size * world_size)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    net = nn.Sequential(nn.Linear(IN_FEATURES, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    state_dir = os.environ.get("PHALANX_STATE_DIR")
    ckpt_path = os.path.join(state_dir, "checkpoint.pt") if state_dir else None
    start_step = 0
    if ckpt_path and os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path, map_location=device)
        net.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_step = ckpt["step"]
    if distributed:
        # The state dir may be node-local; rank 0's view of progress wins
        # (DDP likewise broadcasts rank 0's weights below).
        step_tensor = torch.tensor([start_step], device=device)
        dist.broadcast(step_tensor, src=0)
        start_step = int(step_tensor.item())
    if rank == 0 and start_step:
        print(f"resumed from step={start_step}", flush=True)

    model = DistributedDataParallel(
        net, device_ids=[device.index] if device.type == "cuda" else None
    ) if distributed else net

    total_steps = args.epochs * args.steps_per_epoch
    first_step = True
    for epoch in range(start_step // args.steps_per_epoch, args.epochs):
        # Reshuffle per epoch, identically on every rank.
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            step = epoch * args.steps_per_epoch + i + 1
            if step <= start_step:
                continue  # replay the sampler order so resumed runs see the same data
            x, y = x.to(device), y.to(device)

            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()

            if first_step and args.print_grad_checksum:
                # After backward DDP has averaged the gradients, so this must
                # agree on all ranks even though each saw a different batch.
                grad_sum = sum(p.grad.sum() for p in net.parameters()).item()
                print(f"grad_checksum rank={rank} value={grad_sum:.6f}", flush=True)
                print(f"local_batch_checksum rank={rank} value={x.sum().item():.6f}",
                      flush=True)
            first_step = False

            optimizer.step()
            if rank == 0:
                print(f"epoch={epoch + 1} step={step} loss={loss.item():.4f}", flush=True)

            due = args.checkpoint_every > 0 and step % args.checkpoint_every == 0
            if ckpt_path and rank == 0 and (due or step == total_steps):
                save_atomically({"model": net.state_dict(),
                                 "optimizer": optimizer.state_dict(),
                                 "epoch": epoch + 1, "step": step}, ckpt_path)

            if step == args.fail_at_step:
                if distributed:
                    dist.barrier()  # let rank 0 finish this step's checkpoint first
                if rank == args.fail_rank:
                    raise RuntimeError(f"injected failure at step {step}")

            if args.sleep:
                time.sleep(args.sleep)

            if stop.agreed(distributed, device):
                if ckpt_path and rank == 0:
                    save_atomically({"model": net.state_dict(),
                                     "optimizer": optimizer.state_dict(),
                                     "epoch": epoch + 1, "step": step}, ckpt_path)
                    print(f"stopping: checkpoint saved at step={step}", flush=True)
                if distributed:
                    dist.barrier()
                    dist.destroy_process_group()
                sys.exit(128 + stop.signum)

    if rank == 0:
        x, y = dataset.tensors
        with torch.no_grad():
            final_loss = loss_fn(net(x.to(device)), y.to(device)).item()
        print(f"final loss={final_loss:.4f}", flush=True)
        output_dir = os.environ.get("PHALANX_OUTPUT_DIR")
        if output_dir:
            save_atomically(net.state_dict(), os.path.join(output_dir, "model.pt"))
        print("done", flush=True)

    if distributed:
        dist.barrier()  # tear down together: rank 0 did extra work above
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
