"""One sweep trial for bench/bench_warm.py: imports torch, fits a tiny linear model for ``--steps``
steps (default 1) and prints ``loss=...`` (its value depends on --lr). Seeded: the same numbers
cold and warm."""

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.randn(8, 1)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    print(f"loss={loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
