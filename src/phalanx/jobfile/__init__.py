"""Building a JobSpec from what the user typed and/or a job file, through the option table
(``core/options.py``). Command-line options beat the file; the file beats the defaults.

A job file is YAML; its keys are the option table's (``docs/options.md`` lists them)::

    name: resnet
    script: train.py          # or: module: my_pkg.train   or: command: [bash, -c, "echo $RANK"]
    args: [--epochs, "3"]     # or a string, split like a shell: "--epochs 3"
    n: 2x2                    # or nnodes: 2 / nproc_per_node: 2
    env: {NCCL_DEBUG: INFO}
    grace: 30
    sweep: {strategy: random, trials: 20}
    backend_options: {hosts: "gpu1,gpu2"}

- ``read``: the file -> values with their lines, keys checked ("did you mean").
- ``values``: ``RunOptions`` and both sources -> typed values, one error format.
- ``build``: typed values -> ``JobSpec``; ``sweep``: -> sweep settings.
"""

from __future__ import annotations

from .build import build_spec
from .read import JobFile
from .sweep import build_sweep, check_objective
from .values import RunOptions, Values, all_options, load_job_file, resolve

__all__ = ["RunOptions", "Values", "JobFile", "build_spec", "build_sweep", "check_objective", "resolve",
           "load_job_file", "all_options"]
