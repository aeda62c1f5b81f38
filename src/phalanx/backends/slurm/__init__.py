"""The SLURM backend: ``sbatch`` (its options and batch script, pure) and ``backend`` (the
``Backend`` and ``NodeHandle`` over sbatch/squeue/sacct/scancel)."""
