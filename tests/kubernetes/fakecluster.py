"""The FAKE API server's cluster side, for tests: a Job controller, a scheduler, Kueue's admission
and a kubelet, driving pods through lifecycles recorded from real clusters.

Shapes and texts are copied from the API reference and from what a real cluster reports
(``kubectl get pod -o yaml``): the scheduler's ``Unschedulable`` condition and
``FailedScheduling`` event, ``ErrImagePull`` then ``ImagePullBackOff`` forever, ``OOMKilled``
with exit code 137, eviction with the ``DisruptionTarget`` condition and ``reason: Evicted``,
Kueue's suspended Job admitted later. The Job controller does what batch/v1 does for an Indexed
Job with ``backoffLimit: 0``: one pod per index (hostname ``<job>-<index>``, the completion
index as label, annotation and ``JOB_COMPLETION_INDEX``), the Job Failed at the first failed pod
and its other pods deleted, Complete when every index succeeded.

The kubelet is pluggable: ``ScriptedKubelet`` plays named lifecycles without running anything
(its pods' logs are frames written by the script); ``tests/kubernetes/podsim.py`` runs each
pod's containers for real, as processes in a network namespace.
"""

from __future__ import annotations

import json
import random
import string
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from .fakeapi import FakeApiServer, Log, Store, now

INDEX = "batch.kubernetes.io/job-completion-index"
QUEUE = "kueue.x-k8s.io/queue-name"
UNSCHEDULABLE = ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
                 "3 No preemption victims found for incoming pod.")


class Kubelet(Protocol):
    def sync(self, cluster: "Cluster", pod: dict[str, Any]) -> None: ...

    def stop(self, cluster: "Cluster", pod: dict[str, Any], grace: int) -> None: ...


class Cluster:
    """A fake API server (on ``host``) with controllers reconciling every ``tick`` seconds."""

    tick = 0.05

    def __init__(self, root: Path, kubelet: Kubelet, host: str = "127.0.0.1", tls: Any = None) -> None:
        self.root = root
        self.store = Store()
        self.api = FakeApiServer(self.store, host, tls=tls)
        self.kubelet = kubelet
        self.store.on_delete_pod = lambda pod, grace: self.kubelet.stop(self, pod, grace)
        self.holds: dict[int, str] = {}  # completion index -> the scheduler's message while it cannot place it
        self.created: dict[str, set[int]] = {}  # job uid -> indexes it made a pod for (finished pods are tracked)
        self.made: dict[str, set[str]] = {}  # job uid -> uids of the pods it made (a Job with backoffLimit > 0)
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stopping = True
        self.thread.join(5)
        self.api.close()

    def reset(self) -> None:
        with self.store.lock:
            self.store.objects.clear()
            self.store.logs.clear()
            self.store.forbidden.clear()
            self.store.granted = None
            self.store.refuse.clear()
            self.store.requests.clear()
            self.store.namespaces = {"default"}
            self.store.groups = {"batch/v1", "authorization.k8s.io/v1"}
        self.holds.clear()
        self.created.clear()
        self.made.clear()

    def add_nodes(self, count: int, gpus: int = 0) -> None:
        for i in range(count):
            self.store.put("nodes", "", {"metadata": {"name": f"node-{i}", "labels": {"pool": "gpu" if gpus else "cpu"}},
                                         "status": {"allocatable": {"cpu": "8", "memory": "32Gi",
                                                                    **({"nvidia.com/gpu": str(gpus)} if gpus else {})}}})

    def admit(self, ns: str, job: str) -> None:
        """What Kueue does when the workload fits its queue: unsuspend the Job."""

        def change(obj: dict[str, Any]) -> None:
            obj["spec"]["suspend"] = False
            obj["metadata"].setdefault("annotations", {})["fake/kueue-admitted"] = "true"

        self.store.update("jobs", ns, job, change)

    def pods(self, ns: str = "default") -> list[dict[str, Any]]:
        return self.store.list("pods", ns)

    def wait_for(self, what: Callable[[], Any], timeout: float = 30, text: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = what()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {text or what}")

    # -- reconciling --------------------------------------------------------------------

    def _loop(self) -> None:
        while not self.stopping:
            try:
                for jobset in self.store.list("jobsets", None):
                    self._jobset(jobset)
                for pytorchjob in self.store.list("pytorchjobs", None):
                    self._pytorchjob(pytorchjob)
                for job in self.store.list("jobs", None):
                    self._job(job)
                for pod in self.store.list("pods", None):
                    self._schedule(pod)
                    if pod["spec"].get("nodeName"):
                        self.kubelet.sync(self, pod)
            except Exception as exc:  # noqa: BLE001 - a fake controller must not die silently in a test
                print(f"fake cluster: {exc!r}", flush=True)
            time.sleep(self.tick)

    def _job(self, job: dict[str, Any]) -> None:
        meta, spec = job["metadata"], job["spec"]
        ns, name = meta["namespace"], meta["name"]
        conditions = (job.get("status") or {}).get("conditions") or []
        if any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions):
            return
        if QUEUE in (meta.get("labels") or {}) and "fake/kueue-admitted" not in (meta.get("annotations") or {}):
            if not spec.get("suspend"):  # Kueue's webhook creates it suspended
                self.store.update("jobs", ns, name, lambda o: o["spec"].__setitem__("suspend", True))
                return
        if spec.get("suspend"):
            if not any(c["type"] == "Suspended" for c in conditions):
                self._condition("jobs", ns, name, "Suspended", "True", "JobSuspended", "Job suspended")
            return
        if spec.get("backoffLimit", 6) > 0 and spec.get("completionMode") != "Indexed":
            self._retrying_job(job)
            return
        pods = self.store.list("pods", ns, f"batch.kubernetes.io/job-name={name}")
        by_index = {int(p["metadata"]["labels"][INDEX]): p for p in pods}
        phases = [(p.get("status") or {}).get("phase") for p in pods]
        created = self.created.setdefault(meta["uid"], set())
        # A pod that left before it succeeded counted as failed (the controller tracks pods by finalizer).
        vanished = created - set(by_index) - set((job.get("status") or {}).get("fakeSucceeded", []))
        if "Failed" in phases or vanished:  # backoffLimit 0: the Job fails, its other pods are deleted
            self._condition("jobs", ns, name, "Failed", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
            for pod in pods:
                if (pod.get("status") or {}).get("phase") in ("Pending", "Running") and not pod["metadata"].get("deletionTimestamp"):
                    self.store.delete("pods", ns, pod["metadata"]["name"])
            return
        succeeded = sorted(i for i, p in by_index.items() if (p.get("status") or {}).get("phase") == "Succeeded")
        if succeeded != (job.get("status") or {}).get("fakeSucceeded"):
            self.store.update("jobs", ns, name, lambda o: o.setdefault("status", {}).__setitem__("fakeSucceeded", succeeded))
        if len(by_index) == spec["completions"] and all(ph == "Succeeded" for ph in phases):
            self._condition("jobs", ns, name, "Complete", "True", "", "")
            return
        for index in range(spec["completions"]):
            if index not in created:  # backoffLimit 0: never a second pod for an index
                created.add(index)
                self.store.put("pods", ns, self._pod_for(job, index))

    def _retrying_job(self, job: dict[str, Any]) -> None:
        """A one-pod Job whose controller replaces a failed pod (``backoffLimit``; with
        ``podReplacementPolicy: Failed`` only once the old pod is terminal or gone): Complete
        when a pod succeeded, Failed after more than ``backoffLimit`` failures. A pod that left
        the API before it ended counts as failed, as the finalizer-tracking controller counts it."""
        meta, spec = job["metadata"], job["spec"]
        ns, name = meta["namespace"], meta["name"]
        made = self.made.setdefault(meta["uid"], set())
        pods = self.store.list("pods", ns, f"batch.kubernetes.io/job-name={name}")
        phases = {p["metadata"]["uid"]: (p.get("status") or {}).get("phase") for p in pods}
        if "Succeeded" in phases.values():
            self._condition("jobs", ns, name, "Complete", "True", "", "")
            return
        failed = sum(1 for ph in phases.values() if ph == "Failed") + len(made - set(phases))
        active = sum(1 for ph in phases.values() if ph not in ("Failed", "Succeeded"))
        if (job.get("status") or {}).get("failed", 0) != failed or (job.get("status") or {}).get("active") != active:
            self.store.update("jobs", ns, name, lambda o: o.setdefault("status", {}).update(failed=failed, active=active))
        if failed > spec.get("backoffLimit", 6):
            self._condition("jobs", ns, name, "Failed", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
            return
        if active == 0:
            pod = self._pod_for(job, 0)
            made.add(self.store.put("pods", ns, pod)["metadata"]["uid"])

    def _jobset(self, jobset: dict[str, Any]) -> None:
        """What the JobSet controller does: a Job ``<jobset>-<replicatedJob>-<i>`` per replica,
        owned by the JobSet, its pods in the subdomain ``<jobset>`` (enableDNSHostnames); the
        JobSet Failed when a Job fails (maxRestarts 0), Completed when every Job completed."""
        meta, ns = jobset["metadata"], jobset["metadata"]["namespace"]
        name, created = meta["name"], self.created.setdefault(meta["uid"], set())
        jobs = []
        for r, rjob in enumerate(jobset["spec"]["replicatedJobs"]):
            for i in range(rjob.get("replicas", 1)):
                child = f"{name}-{rjob['name']}-{i}"
                if r * 1000 + i not in created:
                    created.add(r * 1000 + i)
                    template = json.loads(json.dumps(rjob["template"]))
                    labels = {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                              "jobset.sigs.k8s.io/job-index": str(i)}
                    pod_meta = template["spec"]["template"].setdefault("metadata", {})
                    pod_meta["labels"] = {**pod_meta.get("labels", {}), **labels}
                    template["spec"]["template"]["spec"].setdefault("subdomain", name)
                    self.store.put("jobs", ns, {"apiVersion": "batch/v1", "kind": "Job", "spec": template["spec"], "metadata": {
                        "name": child, "labels": labels, "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2",
                        "kind": "JobSet", "name": name, "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]}})
                jobs.append(child)
        states = [[c["type"] for c in (self._get("jobs", ns, j) or {}).get("status", {}).get("conditions", [])
                   if c["status"] == "True"] for j in jobs]
        if any("Failed" in s for s in states):
            self._condition("jobsets", ns, name, "Failed", "True", "FailedJobs", "jobset failed due to one or more job failures")
        elif all("Complete" in s for s in states):
            self._condition("jobsets", ns, name, "Completed", "True", "AllJobsCompleted", "jobset completed successfully")

    def _pytorchjob(self, job: dict[str, Any]) -> None:
        """What the Training Operator v1 does: pods ``<name>-master-0`` and ``<name>-worker-<i>``
        (labels ``training.kubeflow.org/replica-type|replica-index``), a headless Service named
        like each, and the env it gives the container ``pytorch``: MASTER_ADDR, MASTER_PORT (its
        ``pytorchjob-port``), WORLD_SIZE and RANK counting nodes, and the PET_* of torchrun."""
        meta, ns, spec = job["metadata"], job["metadata"]["namespace"], job["spec"]
        name, created = meta["name"], self.created.setdefault(meta["uid"], set())
        replicas = spec["pytorchReplicaSpecs"]
        nodes = sum(r.get("replicas", 1) for r in replicas.values())
        master = f"{name}-master-0"
        owner = [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name, "uid": meta["uid"], "controller": True,
                  "blockOwnerDeletion": True}]
        for role, rspec in replicas.items():
            for i in range(rspec.get("replicas", 1)):
                rank = 0 if role == "Master" else i + 1
                if rank in created:
                    continue
                created.add(rank)
                template = json.loads(json.dumps(rspec["template"]))
                pod_name = f"{name}-{role.lower()}-{i}"
                labels = {**template["metadata"].get("labels", {}), "training.kubeflow.org/job-name": name,
                          "training.kubeflow.org/replica-type": role.lower(), "training.kubeflow.org/replica-index": str(i),
                          "training.kubeflow.org/operator-name": "pytorchjob-controller"}
                container = next(c for c in template["spec"]["containers"] if c["name"] == "pytorch")
                port = next((p["containerPort"] for p in container.get("ports", []) if p["name"] == "pytorchjob-port"), 23456)
                given = {"MASTER_PORT": str(port), "MASTER_ADDR": master, "WORLD_SIZE": str(nodes), "RANK": str(rank),
                         "PYTHONUNBUFFERED": "1", "PET_MASTER_ADDR": master, "PET_MASTER_PORT": str(port),
                         "PET_NNODES": str(nodes), "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": spec.get("nprocPerNode", "auto")}
                container["env"] = [*container.get("env", []), *({"name": k, "value": v} for k, v in given.items())]
                template["spec"]["hostname"] = pod_name
                self.store.put("services", ns, {"apiVersion": "v1", "kind": "Service", "metadata": {
                    "name": pod_name, "labels": labels, "ownerReferences": owner}, "spec": {"clusterIP": "None", "selector": labels,
                    "ports": [{"name": "pytorchjob-port", "port": port}]}})
                self.store.put("pods", ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": pod_name, "labels": labels, "annotations": template["metadata"].get("annotations", {}),
                    "ownerReferences": owner}, "spec": template["spec"], "status": {"phase": "Pending", "qosClass": "BestEffort"}})
        pods = self.store.list("pods", ns, f"training.kubeflow.org/job-name={name}")
        phases = [p.get("status", {}).get("phase") for p in pods]
        if "Failed" in phases or len(pods) < len(created):
            self._condition("pytorchjobs", ns, name, "Failed", "True", "PyTorchJobFailed", f"PyTorchJob {name} is failed")
        elif phases and all(ph == "Succeeded" for ph in phases):
            self._condition("pytorchjobs", ns, name, "Succeeded", "True", "PyTorchJobSucceeded", f"PyTorchJob {name} succeeded")

    def _get(self, plural: str, ns: str, name: str) -> dict[str, Any] | None:
        try:
            return self.store.get(plural, ns, name)
        except Exception:
            return None

    def _pod_for(self, job: dict[str, Any], index: int) -> dict[str, Any]:
        meta, template = job["metadata"], json.loads(json.dumps(job["spec"]["template"]))
        name = meta["name"]
        labels = {**template["metadata"].get("labels", {}), "batch.kubernetes.io/job-name": name, "job-name": name,
                  "batch.kubernetes.io/controller-uid": meta["uid"], "controller-uid": meta["uid"], INDEX: str(index)}
        notes = {**template["metadata"].get("annotations", {}), INDEX: str(index)}
        spec = template["spec"]
        spec["hostname"] = f"{name}-{index}"
        index_env = {"name": "JOB_COMPLETION_INDEX",
                     "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX}']"}}}
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            container["env"] = [index_env, *container.get("env", [])]
        suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-{index}-{suffix}", "labels": labels, "annotations": notes,
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": meta["uid"],
                                                  "controller": True, "blockOwnerDeletion": True}]},
                "spec": spec, "status": {"phase": "Pending", "qosClass": "BestEffort"}}

    def _schedule(self, pod: dict[str, Any]) -> None:
        if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
            return
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        index = node_of(pod)
        held = self.holds.get(index)
        scheduled = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"), None)
        if held is not None:
            if scheduled is None:
                self._condition("pods", ns, name, "PodScheduled", "False", "Unschedulable", held)
                self.store.event(ns, pod, "FailedScheduling", held, component="default-scheduler")
            return
        self.store.update("pods", ns, name, lambda o: (o["spec"].__setitem__("nodeName", f"node-{index % 3}"),
                                                        _set_condition(o, "PodScheduled", "True", "", "")))

    def _condition(self, plural: str, ns: str, name: str, kind: str, state: str, reason: str, message: str) -> None:
        self.store.update(plural, ns, name, lambda o: _set_condition(o, kind, state, reason, message))

    # -- for kubelets ---------------------------------------------------------------------

    def log(self, pod: dict[str, Any], container: str) -> Log:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"], container)
        with self.store.lock:
            if key not in self.store.logs:
                path = self.root / "logs" / f"{key[1]}_{container}.log"
                path.parent.mkdir(parents=True, exist_ok=True)
                self.store.logs[key] = Log(path)
            return self.store.logs[key]

    def set_status(self, pod: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any] | None:
        return self.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"],
                                 lambda o: change(o.setdefault("status", {})))

    def gone(self, pod: dict[str, Any]) -> None:
        """The kubelet stopped a pod being deleted: it leaves the API."""
        self.store.remove("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])


def node_of(pod: dict[str, Any]) -> int:
    """The node a pod is, as its controller numbered it (completion index or replica)."""
    labels = pod["metadata"].get("labels") or {}
    if INDEX in labels:
        return int(labels[INDEX])
    if labels.get("training.kubeflow.org/replica-type") == "worker":
        return int(labels["training.kubeflow.org/replica-index"]) + 1
    return 0


def _set_condition(obj: dict[str, Any], kind: str, state: str, reason: str, message: str) -> None:
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    entry = {"type": kind, "status": state, "lastProbeTime": None, "lastTransitionTime": now()}
    if reason:
        entry["reason"] = reason
    if message:
        entry["message"] = message
    conditions[:] = [c for c in conditions if c["type"] != kind] + [entry]


def container_status(name: str, image: str, state: dict[str, Any], restarts: int = 0, **extra: Any) -> dict[str, Any]:
    running = "running" in state or "terminated" in state
    return {"name": name, "image": image, "imageID": f"{image}@sha256:{'0' * 64}" if running else "",
            "containerID": f"containerd://{'c' * 64}" if running else None, "ready": "running" in state,
            "restartCount": restarts, "started": "running" in state, "state": state, "lastState": {}, **extra}


def terminated(code: int, reason: str, message: str = "", started: str | None = None) -> dict[str, Any]:
    term = {"exitCode": code, "reason": reason, "startedAt": started or now(), "finishedAt": now(),
            "containerID": f"containerd://{'c' * 64}"}
    if message:
        term["message"] = message
    return {"terminated": term}
