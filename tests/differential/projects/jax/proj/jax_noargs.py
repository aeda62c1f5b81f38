"""JAX's multi-process pattern: initialize() with no arguments (the cluster tells JAX the rest)."""

import jax
import numpy as np
from jax.experimental import multihost_utils

from observe import record

jax.distributed.initialize()
index, count = jax.process_index(), jax.process_count()
total = multihost_utils.process_allgather(np.int32(index + 1)).sum()
print(f"process {index} of {count} sum {int(total)}", flush=True)
record(globals(), tag=index)
