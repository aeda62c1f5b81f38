"""Experiment trackers: what phalanx sends to MLflow, TensorBoard and Weights & Biases with no code
in the script (``--track``), one tracker run per job however many attempts it takes.

- ``conventions``: each tool's own settings (``MLFLOW_TRACKING_URI``, ``WANDB_PROJECT``, ...), what
  a job records of them at submit, the ids a script is handed, the exporter's state file and the
  link to a run (``status``, the dashboard).
- ``base``: the points, the run's description and the ``Exporter`` every tracker implements.
- ``mlflow``, ``tensorboard``, ``wandb``: the exporters; each imports its tool (if any) only when used.

The exporters are fed by ``supervise/tracking.py``, a process beside the supervisor that reads the
job directory's metric and resource files, so a tracker that is slow or down never reaches the
ranks' output nor the supervisor's loop.
"""
