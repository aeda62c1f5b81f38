"""Reads its data relative to the working directory and saves a checkpoint there."""

import argparse
import os

import torch

from observe import record


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="../data")
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    with open("config.yaml") as fh:
        scale = float(fh.read().split(":")[1])
    with open(os.path.join(args.data, "train.csv")) as fh:
        rows = [[float(x) for x in line.split(",")] for line in fh if line.strip()]
    x = torch.tensor(rows) * scale
    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch={epoch} loss={loss.item():.6f}")
    torch.save(model.state_dict(), "checkpoint.pt")
    with open("done.txt", "w") as fh:
        fh.write(f"{len(rows)} rows\n")
    record(globals())


if __name__ == "__main__":
    main()
