import os

import jax


def init():
    jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"], int(os.environ["JAX_NUM_PROCESSES"]),
                               int(os.environ["JAX_PROCESS_ID"]))
