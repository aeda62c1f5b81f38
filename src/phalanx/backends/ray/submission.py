"""What one attempt submits to Ray, as data: the driver's ``job.json``, the runtime_env, the
entrypoint and the Ray job id. Pure (``stage`` aside, which writes the working_dir to upload).

The ``working_dir`` Ray uploads holds the code snapshot, phalanx itself (so the cluster needs only
Python, Ray and the user's framework), the state directory to start from and ``job.json``. Ray
caps a working_dir at its GCS message size (500 MiB, ``GCS_STORAGE_MAX_SIZE`` in Ray's
``_private/runtime_env/packaging.py``); phalanx snapshots hold at most 100 MB (``storage/snapshot.py``), so the code
always fits (a ``--no-snapshot`` working directory is shipped as it is, and refused when too large). A large state directory (checkpoints) travels the
same way: it is checked against the cap before anything is submitted.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path
from typing import Any, Mapping

from ...errors import UsageError
from ...core.contracts import LaunchFile
from ...core.plan import Plan
from ...storage.bundle import code_files, phalanx_files

MAX_WORKING_DIR = 500 * 1024 * 1024  # Ray's GCS_STORAGE_MAX_SIZE (ray's _private/runtime_env/packaging.py)
STOP_MARGIN = 20  # seconds Ray waits after the driver's grace before SIGKILL (RAY_JOB_STOP_WAIT_TIME_S)

# The entrypoint runs with the cluster's PATH, where `python` may not be the interpreter that has
# Ray (seen with ray 2.60.0: the system python, ModuleNotFoundError: ray). Ray starts its workers with the right one, and says which on
# the raylet's command line (--python_worker_command); the job supervisor that runs this shell is
# such a worker, with RAY_RAYLET_PID in its environment. python3 is the fallback.
DEFAULT_ENTRYPOINT = (
    "r=$(tr '\\0' '\\n' </proc/$PPID/environ 2>/dev/null | sed -n 's/^RAY_RAYLET_PID=//p'); "
    "py=$(tr '\\0' '\\n' </proc/$r/cmdline 2>/dev/null | sed -n 's/^--python_worker_command=\\([^ ]*\\).*/\\1/p'); "
    'exec "${py:-python3}" -m phalanx.backends.ray.driver'
)


def submission_id(job_id: str, attempt: int) -> str:
    """The Ray job of an attempt: found again by this name after the supervisor is gone."""
    return f"phalanx-{job_id}-{attempt}"


def entrypoint(python: str | None) -> str:
    if not python:
        return DEFAULT_ENTRYPOINT
    # One word is a path (quoted); more words are a command (as py_executable allows).
    exe = shlex.quote(python) if len(shlex.split(python)) == 1 else python
    return f"exec {exe} -m phalanx.backends.ray.driver"


def driver_job(plan: Plan, request: Mapping[str, Any], sample_interval: float) -> dict[str, Any]:
    """The driver's ``job.json``: the plan's nodes as launch files (``contracts.LaunchFile``,
    the job directory in the node's home), and the request's settings."""
    nodes = [LaunchFile(node, node.env["PHALANX_JOB_DIR"], plan.attempt, plan.grace, sample_interval).to_dict()
             for node in plan.nodes]
    return {**request["driver"], "job_id": plan.job_id, "attempt": plan.attempt, "grace": plan.grace, "nodes": nodes}


def runtime_env(request: Mapping[str, Any], working_dir: str, grace: float,
                secrets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The job's runtime_env. ``secrets``: the job's secret values, which Ray sets in the driver's
    and every actor's environment, so the node agents and their ranks have them; Ray keeps the
    runtime_env with the job (its dashboard and ``ray job`` show it to whoever may see the job)."""
    env = {**request.get("env_vars", {}), **(secrets or {}), "RAY_JOB_STOP_WAIT_TIME_S": str(int(grace) + STOP_MARGIN)}
    out: dict[str, Any] = {"working_dir": working_dir, "env_vars": env}
    if request.get("pip"):
        out["pip"] = list(request["pip"])
    if request.get("python"):
        out["py_executable"] = request["python"]
    return out


def stage(dest: Path, code_dir: Path, state_dir: Path, job: dict[str, Any], inputs: Mapping[str, Path] | None = None) -> int:
    """Lay out the working_dir in ``dest``; returns its size in bytes. Raises UsageError when it
    is larger than Ray takes. ``inputs``: each input's staged local copy (a directory, or one
    file), shipped whole under ``inputs/<name>/``."""
    total = 0
    trees = [("code", code_files(code_dir)), ("state", _state_files(state_dir))]
    trees += [(f"inputs/{name}", _input_files(path)) for name, path in sorted((inputs or {}).items())]
    for top, files in trees:
        for rel, path in files:
            total += _place(path, dest / top / rel)
    for rel, path in phalanx_files():
        total += _place(path, dest / rel)
    (dest / "job.json").write_text(json.dumps(job, sort_keys=True))
    if total > MAX_WORKING_DIR:
        raise UsageError(
            f"the code, state directory and inputs to ship to Ray are {total >> 20} MiB, more than the "
            f"{MAX_WORKING_DIR >> 20} MiB Ray takes in a working_dir",
            "keep checkpoints out of PHALANX_STATE_DIR's copy (an fsspec --state URI the nodes read), and pass large "
            "data as a URI the nodes read themselves (a script argument) instead of --input")
    return total


def _state_files(state_dir: Path) -> list[tuple[str, Path]]:
    return list(code_files(state_dir)) if state_dir.is_dir() else []


def _input_files(path: Path) -> list[tuple[str, Path]]:
    """Every file of a staged input, ignore rules aside (data is shipped as it is), links followed."""
    if path.is_file():
        return [(path.name, path)]
    return sorted((str(Path(top, name).relative_to(path)), Path(top, name))
                  for top, _, names in os.walk(path, followlinks=True) for name in names)


def _place(src: Path, dst: Path) -> int:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)  # same filesystem: no copy; Ray zips it and the staging is removed
    except OSError:
        shutil.copy2(src, dst)
    return dst.stat().st_size


def render(sub_id: str, address: str, request: Mapping[str, Any], nnodes: int) -> str:
    """What ``--dry-run`` prints before each node's part."""
    driver = request["driver"]
    gpus = driver.get("gpus")
    bundle = f"CPU {driver['cpus']:g}, GPU {gpus if gpus is not None else 'the largest GPU node count'}"
    env = runtime_env(request, "<code snapshot + phalanx + state directory, uploaded by Ray>", float(driver["grace"]))
    return (
        f"# Ray job {sub_id} at {address}\n"
        f"# entrypoint: {entrypoint(request.get('python'))}\n"
        f"# runtime_env: {json.dumps(env, sort_keys=True)}\n"
        f"# placement group: STRICT_SPREAD, {nnodes} bundle(s) of {{{bundle}}}, one node agent actor each; "
        f"pending at most {driver['pending_timeout']:g}s\n"
        f"# driver job.json (besides the nodes below): {json.dumps(driver, sort_keys=True)}\n"
    )
