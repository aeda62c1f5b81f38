"""A phalanx job as a SkyPilot task (YAML spec: docs/source/reference/yaml-spec.rst). Pure.

- ``workdir`` is a staging directory SkyPilot syncs to ``~/sky_workdir`` on every node: the job's
  code snapshot (``code/``), phalanx itself (``lib/``) and every node's part of the plan
  (``launch.json``), as the bundle of ``storage/bundle.py`` unpacked. Nodes need Python and the
  job's framework, nothing of phalanx;
- ``num_nodes``, ``resources`` (accelerators, infra, instance type, spot, image, disk, cpus,
  memory) and ``envs`` come from the spec and the options;
- ``run`` is phalanx's node agent on every node (``entry``): node rank from
  ``SKYPILOT_NODE_RANK``, node addresses (node 0 first, hosting the rendezvous) from
  ``SKYPILOT_NODE_IPS``; torchrun or one process per rank runs under it, as on SSH.

Retries: with ``--managed`` (``sky.jobs.launch``) SkyPilot's managed-job recovery restarts a
preempted job, so phalanx's ``--max-retries`` must be 0; without it (``sky.launch`` on a cluster)
SkyPilot does not recover and phalanx retries (a new ``sky.launch`` of the same cluster).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ...core.env import Topology
from ...core.paths import JobPaths
from ...core.spec import Framework, JobSpec, in_snapshot
from ...errors import UsageError
from ...core.plan import NodePlan, late_addresses
from ...launch.nodes import RESTART_SAFE_ENV, build_nodes

WORKDIR = "@SKY_WORKDIR@"  # the absolute path of ~/sky_workdir, known on the node only (entry fills it in)
PORT_RANGE = (29400, 29900)
RUN = 'PYTHONPATH="$PWD/lib${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m phalanx.backends.skypilot.entry'


def task_name(job_id: str, attempt: int) -> str:
    return f"phx-{job_id}-a{attempt}"


def cluster_name(job_id: str, attempt: int, opts: Any) -> str:
    """The cluster (or managed job) name: ``--cluster``, else one per attempt."""
    return str(opts.get("cluster") or task_name(job_id, attempt))


def check(spec: JobSpec, opts: dict[str, Any]) -> None:
    if opts.get("managed") and spec.max_retries:
        raise UsageError("--managed lets SkyPilot recover the job; phalanx's --max-retries would retry it a second time",
                         "drop --max-retries (SkyPilot recovers preemptions), or drop --managed (phalanx retries)")


def resources(opts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, name in (("gpus", "accelerators"), ("infra", "infra"), ("instance_type", "instance_type"),
                      ("image", "image_id"), ("cpus", "cpus"), ("memory", "memory")):
        if opts.get(key):
            out[name] = str(opts[key])
    if opts.get("disk_size"):
        out["disk_size"] = int(opts["disk_size"])
    if opts.get("spot"):
        out["use_spot"] = True
    if opts.get("managed"):
        # SkyPilot's default recovery (EAGER_NEXT_REGION); a user-code error is not retried.
        out["job_recovery"] = {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 0}
    return out


def nodes(spec: JobSpec, job_id: str, attempt: int) -> tuple[NodePlan, ...]:
    """Each node's part; paths under ``WORKDIR``, addresses filled in on the node."""
    nnodes = spec.resources.nnodes
    addrs = late_addresses(nnodes)
    spec = in_snapshot(spec.with_(python="python3"), f"{WORKDIR}/code", shipped=True)
    digest = int(hashlib.sha256(f"{job_id}:{attempt}".encode()).hexdigest(), 16)
    span = PORT_RANGE[1] - PORT_RANGE[0]
    topo = Topology(
        job_id=job_id, attempt=attempt, node_addrs=addrs, master_port=PORT_RANGE[0] + digest % span,
        worker_ports=tuple(PORT_RANGE[0] + (digest + 1 + i) % span for i in range(nnodes * spec.procs_per_node_started))
        if spec.framework is Framework.TF else (),
        state_dir=f"{WORKDIR}/state", output_dir=f"{WORKDIR}/output", job_dir=f"{WORKDIR}/job",
        num_gpus=_gpus(spec.backend_options.get("gpus")),
        channels=(),
    )
    return build_nodes(spec, topo, JobPaths(Path(f"{WORKDIR}/job")), addrs, addrs,
                       {"PHALANX_AUTO_IFNAME": "1", **RESTART_SAFE_ENV})


def _gpus(accelerators: Any) -> int:
    """``H100:8`` -> 8, ``H100`` -> 1, none -> 0 (SKYPILOT_NUM_GPUS_PER_NODE says the same on the node)."""
    if not accelerators:
        return 0
    text = str(accelerators).strip("{} ").split(",")[0]
    count = text.rsplit(":", 1)[1] if ":" in text else "1"
    try:
        return max(1, int(float(count) + 0.999))
    except ValueError:
        return 1


def task_config(spec: JobSpec, job_id: str, attempt: int, workdir: str, opts: dict[str, Any]) -> dict[str, Any]:
    """The task as SkyPilot's YAML mapping (``sky.Task.from_yaml_config`` takes it as is)."""
    check(spec, opts)
    if spec.channels:
        raise UsageError("--input is not supported on the skypilot backend yet",
                         "mount the data in the task (file_mounts) or read it from a bucket in the script")
    config: dict[str, Any] = {
        "name": task_name(job_id, attempt),
        "workdir": workdir,
        "num_nodes": spec.resources.nnodes,
        "resources": resources(opts),
        "envs": {"PHALANX_JOB_ID": job_id, "PHALANX_ATTEMPT": str(attempt)},
        "run": RUN,
    }
    if opts.get("setup"):
        config["setup"] = str(opts["setup"])
    return config
