"""The supervisor's side of ``--track``: start the job's exporter (``exporter.py``, a process of its
own), hand the script the tracker ids it would use itself, and say when the job has ended.

Called by ``JobRun`` (start, end) and the sweep runner (a sweep's end). Nothing here may fail or
hold up a job: the one wait is for the MLflow run to exist at the job's start (so ``MLFLOW_RUN_ID``
reaches the script), bounded by the ``track_wait`` setting and cut short as soon as the exporter
says MLflow does not answer.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

from ..backends import commands
from ..core.paths import HomePaths, JobPaths, write_json
from ..core.spec import JobSpec
from ..core.env import tracker_env
from ..track.conventions import read_state

Say = Callable[[str], None]


def start(paths: JobPaths, spec: JobSpec, job_id: str, say: Say) -> dict[str, str]:
    """Start the exporter of a job that has ``--track`` (each supervisor of the job does: a later
    one waits for an earlier one to finish); returns the variables the ranks get (empty without
    ``--track``)."""
    if not spec.track:
        return {}
    from .. import config

    paths.track.mkdir(parents=True, exist_ok=True)
    paths.track_ended.unlink(missing_ok=True)  # the job runs (again)
    began = time.time()
    cwd = spec.workdir if os.path.isdir(spec.workdir) else str(paths.root)
    proc = commands.spawn([sys.executable, "-m", "phalanx.supervise.exporter", str(paths.root), str(os.getpid())],
                          {}, paths.track_log, cwd=cwd)
    mlflow_run = None
    if "mlflow" in spec.track:
        mlflow_run = _wait_for_run(paths, proc, began, float(config.get("track_wait")))
        if mlflow_run is None:
            say("MLflow run not created yet (see `phalanx status`): the script's own MLflow calls start a run of their own")
    group = spec.env.get("PHALANX_SWEEP_ID") or job_id
    return tracker_env(spec.track, spec.track_config, job_id, group, mlflow_run)


def _wait_for_run(paths: JobPaths, proc: Any, began: float, wait: float) -> str | None:
    deadline = time.monotonic() + wait
    while True:
        state = read_state(paths, "mlflow")
        if state.run_id:
            return state.run_id
        if state.error and state.updated >= began or proc.poll() is not None or time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def ended(paths: JobPaths, spec: JobSpec, state: str, exit_code: int | None, root_cause: str) -> None:
    """The job has its final state: the exporter closes the run with it once every point is sent."""
    if not spec.track:
        return
    paths.track.mkdir(parents=True, exist_ok=True)
    write_json(paths.track_ended, {"state": state, "exit_code": exit_code, "root_cause": root_cause[:2000],
                                   "ended": time.time()})


def sweep_ended(home: HomePaths, sweep: Any, spec: dict[str, Any], say: Say) -> None:
    """Close a sweep's parent MLflow run with the sweep's outcome and best trial (a thread, at most
    a few seconds: a tracker that is down does not hold the runner)."""
    if "mlflow" not in (spec.get("track") or ()):
        return
    from ..track.mlflow import parent_finish

    tags = {"phalanx.outcome": sweep.state.value.lower(), "phalanx.trials": str(sweep.total)}
    if sweep.best_value is not None:
        tags.update({"phalanx.best_value": repr(sweep.best_value), "phalanx.best_job": str(sweep.best_job or "")})

    def close() -> None:
        try:
            parent_finish(home.sweep_track(sweep.id, "mlflow"), dict(spec.get("track_config") or {}),
                          sweep.state.value, tags)
        except Exception as exc:  # noqa: BLE001
            say(f"warning: closing the sweep's MLflow run: {exc}")

    thread = threading.Thread(target=close, daemon=True)
    thread.start()
    thread.join(5.0)
