"""What ``--framework`` and ``--spawn self`` promise (docs/environment.md), each case the same
unmodified program under the real thing or a hand-set environment and under ``phalanx run``
(``cases.CONTRACTS``; compared as every differential case is, ``compare.py``):

- ``--spawn self``: the program starts and connects its processes itself and phalanx initializes
  nothing: a library that calls ``jax.distributed.initialize`` from the program's flags (filled in
  from ``{master_addr}:{master_port}``, ``{num_nodes}``, ``{node_rank}``) connects them as when
  started by hand, and a program that never calls it stays one process per process, as by hand;
- ``--framework jax -n 2x1``: phalanx initializes first, and the program's own later call is a
  no-op, through ``jax.distributed`` or ``jax._src.distributed``, with no arguments (by hand: JAX
  asks SLURM's variables) or with templated ones (by hand: typed);
- ``--framework tf``: a real MultiWorkerMirroredStrategy script written as SageMaker's examples are
  (the chief, worker 0 of ``TF_CONFIG``, saves the model to ``SM_MODEL_DIR``) sees what a SageMaker
  job with ``multi_worker_mirrored_strategy`` sees, on one instance (one process, no topology) and on
  two (``-n 2x1``), and its model lands where SageMaker's would: the job's outputs.

The script's own call of ``jax.distributed.initialize`` (with and without arguments, in a helper)
and a program that never calls it under ``--framework jax`` are cases of ``test_differential.py``
and ``tests/local/test_run.py``.
"""

from __future__ import annotations

import pytest

from .cases import CONTRACTS
from .compare import compare, params

pytestmark = pytest.mark.local


@pytest.mark.parametrize("case,start", params(CONTRACTS, {c.name for c in CONTRACTS}))
def test_the_program_sees_what_the_contract_promises(case, start, tmp_path, phx_home, pool_dir):
    compare(case, start, tmp_path, phx_home, pool_dir)
