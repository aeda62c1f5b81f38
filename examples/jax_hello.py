"""JAX multi-process smoke test.

The launcher must call jax.distributed.initialize() before this runs (JAX
reads only the coordinator address from the environment, not the process
count or id), so this script never does it itself.
"""

import jax
import numpy as np
from jax.experimental import multihost_utils


def main():
    index, count = jax.process_index(), jax.process_count()
    print(f"jax process_index={index} process_count={count} devices={jax.device_count()}",
          flush=True)
    # A real cross-process collective: every process must contribute its index.
    gathered = multihost_utils.process_allgather(np.int32(index))
    print(f"allgather={np.asarray(gathered).tolist()}", flush=True)


if __name__ == "__main__":
    main()
