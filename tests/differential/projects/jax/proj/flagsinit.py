"""A library that connects a JAX program's processes from its own flag handling, the way JAX's
multi-process test harness (jax._src.test_multiprocess) does: through ``jax._src.distributed``,
not the public ``jax.distributed``, with the flags it was given, or with none when none were
(JAX then asks the cluster: SLURM's variables, ...)."""

import argparse

from jax._src import distributed


def parse_and_initialize(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator_address")
    parser.add_argument("--num_processes", type=int)
    parser.add_argument("--process_id", type=int)
    args, rest = parser.parse_known_args(argv)
    if args.coordinator_address is None:
        distributed.initialize()
    else:
        distributed.initialize(args.coordinator_address, num_processes=args.num_processes,
                               process_id=args.process_id)
    return rest
