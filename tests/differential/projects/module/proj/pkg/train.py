"""Run as a module: python -m pkg.train --batch 3 --lr 0.1"""

import argparse

from observe import record

from . import defaults

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int)
parser.add_argument("--lr", type=float, default=defaults.LR)
args = parser.parse_args()
print(f"batch={args.batch} lr={args.lr} package={__package__}")
record(globals())
