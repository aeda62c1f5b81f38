"""The supervisor's side of ``--track``: start the job's exporter (``exporter.py``, a process of its
own), hand the script the tracker ids it would use itself, and say when the job has ended.

Called by ``JobRun`` (start, end) and the sweep runner (a sweep's end). Nothing here may fail or
hold up a job: the one wait is for the MLflow run to exist at the job's start (so ``MLFLOW_RUN_ID``
reaches the script): created here with one or two REST requests, each bounded by the ``track_wait``
setting (a server that is down refuses at once); for a tracking URI that is not a server, by the
exporter (MLflow's client), waited for ``track_wait`` seconds at most.
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
from ..errors import TrackerError
from ..track.conventions import is_http, read_state
from . import liveness

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
    wait = float(config.get("track_wait"))
    began = time.time()
    mlflow_run = _create_mlflow_run(paths, spec, wait) if "mlflow" in spec.track else None
    cwd = spec.workdir if os.path.isdir(spec.workdir) else str(paths.root)
    me = liveness.identity()
    proc = commands.spawn([sys.executable, "-m", "phalanx.supervise.exporter", str(paths.root),
                           str(me["supervisor_pid"]), repr(me["supervisor_started"])], {}, paths.track_log, cwd=cwd)
    if "mlflow" in spec.track and mlflow_run is None and not is_http(spec.track_config.get("MLFLOW_TRACKING_URI", "")):
        mlflow_run = _wait_for_run(paths, proc, began, wait)  # MLflow's client, in the exporter
    if "mlflow" in spec.track and mlflow_run is None:
        say("MLflow run not created yet (see `phalanx status`): the script's own MLflow calls start a run of their own")
    group = spec.env.get("PHALANX_SWEEP_ID") or job_id
    return tracker_env(spec.track, spec.track_config, job_id, group, mlflow_run)


def _create_mlflow_run(paths: JobPaths, spec: JobSpec, wait: float) -> str | None:
    """The job's MLflow run: the one it has (a retry, a resume), or created now over MLflow's REST
    API, each request given ``wait`` seconds at most (a server that is down answers at once), so
    its id reaches the ranks without waiting for the exporter to start. None: not now (the
    exporter goes on trying)."""
    state = read_state(paths, "mlflow")
    if state.run_id or not is_http(spec.track_config.get("MLFLOW_TRACKING_URI", "")):
        return state.run_id or None
    from ..track.mlflow import MlflowExporter
    from .trackinfo import run_info

    exporter = MlflowExporter(timeout=max(0.5, wait))
    try:
        exporter.open(run_info(paths, spec), state)
    except TrackerError as exc:
        state.error, state.error_since, state.updated = str(exc), time.time(), time.time()
        write_json(paths.track_state("mlflow"), state.to_dict())
        return None
    finally:
        exporter.close()
    state.updated = time.time()
    write_json(paths.track_state("mlflow"), state.to_dict())
    return state.run_id


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
