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

from ..core.lazy import exports

# Imported on first use: `phalanx run --help` needs the option table (values), not the builders.
_WHERE = {
    "build_spec": "build", "JobFile": "read", "build_sweep": "sweep", "check_objective": "objective",
    "RunOptions": "values", "Values": "values", "all_options": "values", "load_job_file": "values", "resolve": "values",
}
__all__ = sorted(_WHERE)

__getattr__ = exports(__name__, _WHERE)
