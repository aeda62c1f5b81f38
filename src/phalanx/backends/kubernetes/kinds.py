"""The opt-in kinds (``--k8s-kind``), for clusters whose admins require an operator: the same
pod as the default Indexed Job, wrapped the way each controller expects. Pure.

Each controller tells a pod its node rank its own way, and the pod's entry reads that
(``manifests.rank_variable``); everything else the pod needs is in phalanx's launch plan, so the
controller's other variables (``MASTER_ADDR``, ``WORLD_SIZE``, ``PET_*``: nodes, not processes)
never reach the script (``pod.py`` drops them).

- **PyTorchJob** (kubeflow.org/v1, Training Operator v1): a Master (node 0) and ``N-1``
  Workers; the operator names the container ``pytorch``, makes a Service per replica
  (``<name>-master-0``, ``<name>-worker-<i>``) and sets ``RANK`` to the node rank.
- **TrainJob** (trainer.kubeflow.org/v1alpha1, Trainer v2): the ClusterTrainingRuntime (default
  ``torch-distributed``) owns the pod; a TrainJob may only patch in volumes, volume mounts,
  labels and scheduling fields (``runtimePatches``), not add an init container, so the node
  container fetches the bundle itself before it starts the entry. The runtime's JobSet names
  node ``i`` ``<name>-node-0-<i>.<name>``; the torch plugin sets ``PET_NODE_RANK``. The
  runtime, not phalanx, decides the pods' restart policy: the stock one leaves it to JobSet's
  default (OnFailure), so a crashed node's container may be restarted in place; phalanx
  counts its first end (``node.py``) and ends the attempt.
- **JobSet** (jobset.x-k8s.io/v1alpha2): one replicated Job ``node`` of ``N`` indexed pods,
  with DNS hostnames and no restarts of its own.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable

from ...errors import UsageError
from .manifests import (
    CONTAINER, FETCH_INIT, Workload, config_map, container_env, fetch_env, indexed_job, metadata, pod_command, pod_template,
    resources, scheduling, secret, service, volume_mounts, volumes,
)
from .options import DEFAULT_RUNTIME

RUNTIME_PATCH_MANAGER = "phalanx.dev/launcher"


def pytorchjob(w: Workload) -> dict[str, Any]:
    template = pod_template(w, rank_from="RANK", container="pytorch")
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if w.nnodes > 1:
        replicas["Worker"] = {"replicas": w.nnodes - 1, "restartPolicy": "Never", "template": copy.deepcopy(template)}
    # cleanPodPolicy None: the pods stay until phalanx has read their results, then it deletes the job.
    run_policy: dict[str, Any] = {"backoffLimit": 0, "cleanPodPolicy": "None"}
    if w.ttl_seconds is not None:
        run_policy["ttlSecondsAfterFinished"] = w.ttl_seconds
    spec = {"runPolicy": run_policy, "nprocPerNode": str(w.nproc_per_node), "pytorchReplicaSpecs": replicas}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata(w, queue=True), "spec": spec}


def trainjob(w: Workload) -> dict[str, Any]:
    section = w.section
    if section.get("priority_class"):
        raise UsageError("a TrainJob cannot set the pods' priority class (its runtime does)",
                         "drop kubernetes.priority_class, or use --k8s-kind job or jobset")
    entry = pod_command(w, rank_from="PET_NODE_RANK")
    # No init container can be added to the runtime's pod: fetch, then become the entry.
    program = f"{FETCH_INIT}import os\nos.execvp({json.dumps(entry[0])}, {json.dumps(entry)})\n"
    trainer: dict[str, Any] = {
        "image": w.image, "command": ["python3", "-c", program], "env": [*fetch_env(w), *container_env(w)],
        "numNodes": w.nnodes, "numProcPerNode": w.nproc_per_node,
    }
    res = resources(w)
    if res:
        trainer["resourcesPerNode"] = res
    template = pod_template(w, rank_from="PET_NODE_RANK")
    pod_patch: dict[str, Any] = {
        "terminationGracePeriodSeconds": w.grace_seconds,
        "volumes": volumes(w),
        "containers": [{"name": CONTAINER, "volumeMounts": volume_mounts(w)}],
        **scheduling(section),
        **({"affinity": template["spec"]["affinity"]} if "affinity" in template["spec"] else {}),  # nodes left out
    }
    patch = {"manager": RUNTIME_PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"metadata": template["metadata"], "spec": pod_patch}}}},
    ]}}}}
    spec = {"runtimeRef": {"name": section.get("runtime") or DEFAULT_RUNTIME}, "trainer": trainer, "runtimePatches": [patch]}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": metadata(w, queue=True),
            "spec": spec}


def jobset(w: Workload) -> dict[str, Any]:
    job = {
        "completionMode": "Indexed", "completions": w.nnodes, "parallelism": w.nnodes, "backoffLimit": 0,
        "podReplacementPolicy": "Failed", "template": pod_template(w, rank_from="JOB_COMPLETION_INDEX"),
    }
    spec: dict[str, Any] = {
        "failurePolicy": {"maxRestarts": 0},  # phalanx retries with a new JobSet
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": job}}],
    }
    if w.ttl_seconds is not None:
        spec["ttlSecondsAfterFinished"] = w.ttl_seconds
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": metadata(w, queue=True), "spec": spec}


RENDER: dict[str, Callable[[Workload], dict[str, Any]]] = {
    "pytorchjob": pytorchjob, "trainjob": trainjob, "jobset": jobset,
}
# The container that runs the node, per kind (the controller's naming rule).
NODE_CONTAINER = {"job": CONTAINER, "jobset": CONTAINER, "trainjob": CONTAINER, "pytorchjob": "pytorch"}


def render(w: Workload) -> list[dict[str, Any]]:
    """The attempt's objects, in the order they are created: ConfigMap, Secret (object store, or
    the job's secrets), Service (kind job), then the workload."""
    objects = [config_map(w)]
    if w.has_secret:
        objects.append(secret(w))
    if w.kind == "job":
        objects += [service(w), indexed_job(w)]
    else:
        objects.append(RENDER[w.kind](w))
    return objects
