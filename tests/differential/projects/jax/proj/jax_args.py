"""initialize() with the script's own arguments, taken from the environment."""

import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from observe import record

jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
                           num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                           process_id=int(os.environ["JAX_PROCESS_ID"]))
index, count = jax.process_index(), jax.process_count()
total = multihost_utils.process_allgather(np.int32(index + 1)).sum()
print(f"process {index} of {count} sum {int(total)}", flush=True)
record(globals(), tag=index)
