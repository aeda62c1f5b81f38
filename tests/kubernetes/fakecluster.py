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

    def __init__(self, root: Path, kubelet: Kubelet, host: str = "127.0.0.1") -> None:
        self.root = root
        self.store = Store()
        self.api = FakeApiServer(self.store, host)
        self.kubelet = kubelet
        self.store.on_delete_pod = lambda pod, grace: self.kubelet.stop(self, pod, grace)
        self.holds: dict[int, str] = {}  # completion index -> the scheduler's message while it cannot place it
        self.created: dict[str, set[int]] = {}  # job uid -> indexes it made a pod for (finished pods are tracked)
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
            self.store.refuse.clear()
            self.store.requests.clear()
            self.store.namespaces = {"default"}
            self.store.groups = {"batch/v1", "authorization.k8s.io/v1"}
        self.holds.clear()
        self.created.clear()

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
        index = int((pod["metadata"].get("labels") or {}).get(INDEX, -1))
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
