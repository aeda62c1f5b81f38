"""The Ray backend's options, declared once as data (``BackendOption``), and the validator of its
job-file section. Light on purpose: the CLI and the docs read this module without importing Ray.

Job file::

    backend: ray
    backend_options:
      address: http://head:8265
      pending_timeout: 600
      ray:                                   # additions to the Ray job's runtime_env
        pip: [einops==0.8.0]                 # installed by Ray on every node, for this job
        env_vars: {NCCL_DEBUG: INFO}         # set for the driver and every node agent
        py_executable: /opt/conda/bin/python # the interpreter on the cluster (default: Ray's own)
"""

from __future__ import annotations

from typing import Any, Mapping

from ...core.optiontypes import Checked, Float, Int
from ...errors import UsageError
from ..options import BackendOption

DEFAULT_PENDING_TIMEOUT = 300.0

OPTIONS: tuple[BackendOption, ...] = (
    BackendOption("address", str, None,
                  "The Ray cluster's dashboard (Jobs API) address, e.g. http://head:8265; default: $RAY_ADDRESS."),
    BackendOption("token_file", str, None,
                  "A file holding the cluster's auth token; default: $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token."),
    BackendOption("pending_timeout", float, None,
                  f"Seconds the job may wait for its nodes (placement group pending) before it fails, showing the "
                  f"cluster's resources (default {DEFAULT_PENDING_TIMEOUT:g}); given, a cluster too small now is "
                  "waited for (an autoscaler may add nodes).", kind=Float(positive=True)),
    BackendOption("gpus_per_node", int, None,
                  "GPUs each node of the job takes (default: the GPU count of the cluster's largest GPU node, 0 without GPUs).",
                  kind=Int(low=0, expected="a GPU count")),
    BackendOption("cpus_per_node", float, 1.0, "CPUs each node of the job reserves in Ray's accounting.",
                  kind=Float(expected="a number of CPUs"), metavar="CPUS"),
    BackendOption("remote_python", str, None,
                  "The Python on the cluster nodes, a path or a command (default: the interpreter Ray itself runs with there)."),
    # A mapping, so a job-file key only (backend_options.ray), checked by validate_section below.
    BackendOption("ray", dict, None, "Job file only: runtime_env additions (pip, env_vars) and py_executable.",
                  kind=Checked(check=lambda section: validate_section(section)), cli=False),
)

# What a job file's ``ray:`` section may hold: additions to the Ray job's runtime_env.
SECTION_KEYS = {
    "pip": "packages Ray installs on every node for this job (list, or a requirements file path)",
    "env_vars": "environment variables for the driver and every node agent (mapping)",
    "py_executable": "the interpreter on the cluster (an absolute path, or a command)",
}


def validate_section(section: Any) -> dict[str, Any]:
    """The job file's ``ray:`` section, checked: known keys, the right types. Raises UsageError."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise UsageError("the job file's 'ray' section must be a mapping", f"its keys: {', '.join(SECTION_KEYS)}")
    unknown = sorted(set(map(str, section)) - set(SECTION_KEYS))
    if unknown:
        raise UsageError(f"unknown key(s) {', '.join(unknown)} in the job file's 'ray' section",
                         f"valid keys: {', '.join(SECTION_KEYS)}")
    out: dict[str, Any] = {}
    pip = section.get("pip")
    if pip is not None:
        if isinstance(pip, str):
            pip = [pip]
        if not isinstance(pip, list) or not all(isinstance(p, str) and p for p in pip):
            raise UsageError("ray.pip must be a list of requirements", "e.g. pip: [einops==0.8.0]")
        out["pip"] = list(pip)
    env = section.get("env_vars")
    if env is not None:
        if not isinstance(env, Mapping):
            raise UsageError("ray.env_vars must be a mapping of names to values", "e.g. env_vars: {NCCL_DEBUG: INFO}")
        out["env_vars"] = {str(k): str(v) for k, v in env.items()}
    exe = section.get("py_executable")
    if exe is not None:
        if not isinstance(exe, str) or not exe.strip():
            raise UsageError("ray.py_executable must be a command", "e.g. py_executable: /opt/conda/bin/python")
        out["py_executable"] = exe.strip()
    return out
