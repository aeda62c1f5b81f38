"""A JAX program whose processes are connected by a library, from the program's flags."""

import jax
import numpy as np
from jax.experimental import multihost_utils

import flagsinit
from observe import record

rest = flagsinit.parse_and_initialize()
index, count = jax.process_index(), jax.process_count()
total = multihost_utils.process_allgather(np.int32(index + 1)).sum()
print(f"process {index} of {count} sum {int(total)} rest {rest}", flush=True)
record(globals(), tag=index)
