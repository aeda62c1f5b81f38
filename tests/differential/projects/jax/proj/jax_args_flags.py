"""initialize() called by the script itself, with its own flags as the arguments."""

import argparse

import jax
import numpy as np
from jax.experimental import multihost_utils

from observe import record

parser = argparse.ArgumentParser()
parser.add_argument("--coordinator")
parser.add_argument("--processes", type=int)
parser.add_argument("--id", type=int)
args = parser.parse_args()
jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.processes, process_id=args.id)
index, count = jax.process_index(), jax.process_count()
total = multihost_utils.process_allgather(np.int32(index + 1)).sum()
print(f"process {index} of {count} sum {int(total)}", flush=True)
record(globals(), tag=index)
