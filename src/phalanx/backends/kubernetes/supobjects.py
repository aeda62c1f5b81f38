"""The objects of a job whose supervisor runs in the cluster (``--in-cluster``), pure and
golden-tested like ``manifests.py``:

- a ``batch/v1`` Job ``phx-<id>-sup`` of one pod, labelled as the job's objects are plus
  ``phalanx.dev/role=supervisor`` (no attempt label: it is no attempt, and an attempt's selector
  never matches it). Its pod fetches the same bundle as the attempts' pods (init container
  ``phx-fetch``) and runs ``python3 -m phalanx.supervise.remote JOB`` with the
  pod's service account (``kubeconfig.in_cluster``). ``backoffLimit`` lets the Job controller
  replace a pod that failed or was evicted; the new one restores the record and re-attaches to
  the running attempt by its labels;
- a Secret of the same name holding the presigned URLs (``record.py``, the bundle's);
- the Role (and RoleBinding) its service account needs: the verbs ``preflight.needed`` lists.
  phalanx does not create these (creating Roles is an admin's right); it writes them for
  ``kubectl apply -f``.

The Secret is owned by the Job (``client.apply``), so deleting the Job or its TTL removes it.
"""

from __future__ import annotations

from typing import Any, Mapping

from .manifests import (BUNDLE_SHA256, BUNDLE_URL, FETCH_CONTAINER, FETCH_INIT, JOB_ID, MANAGED_BY, ROOT, label_value,
                        object_name, scheduling)

ROLE = "phalanx.dev/role"
RECORD = "phalanx.dev/record"  # annotation: where the job record lives in the object store
CONTAINER = "supervisor"
ENTRY = "phalanx.supervise.remote"
HOME = ROOT + "/home"  # the supervisor pod's PHALANX_HOME (an emptyDir, restored from the record)
RESTARTS = 6  # supervisor pods the Job controller may replace (failed, evicted, its node drained)
TTL = 7 * 24 * 3600  # as long as the presigned URLs live: ps finds the job this long after it ended
GRACE = 30  # seconds the supervisor pod has to write the record once more when it is deleted


def name(job_id: str) -> str:
    return object_name(job_id, 0)[: -len("-a0")] + "-sup"


def labels(job_id: str) -> dict[str, str]:
    return {MANAGED_BY: "phalanx", JOB_ID: label_value(job_id), ROLE: "supervisor"}


def selector(job_id: str | None = None) -> str:
    """The label selector of supervisors (of one job, or all)."""
    parts = [f"{MANAGED_BY}=phalanx", f"{ROLE}=supervisor"]
    if job_id is not None:
        parts.append(f"{JOB_ID}={label_value(job_id)}")
    return ",".join(parts)


def render(job_id: str, job_name: str, command: str, topology: str, image: str, record_uri: str,
           section: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Secret (placeholders for its URLs, filled at submit) and the Job, in creation order."""
    sup = name(job_id)
    meta = {"name": sup, "labels": labels(job_id),
            "annotations": {"phalanx.dev/job-name": job_name, "phalanx.dev/command": command[:1000],
                            "phalanx.dev/topology": topology, RECORD: record_uri}}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "immutable": True,
              "stringData": {"bundle-url": BUNDLE_URL, "record-get": "@RECORD_GET@", "record-put": "@RECORD_PUT@",
                             "state-get": "@STATE_GET@", "state-put": "@STATE_PUT@"}}

    def from_secret(var: str, key: str) -> dict[str, Any]:
        return {"name": var, "valueFrom": {"secretKeyRef": {"name": sup, "key": key}}}

    fetch = {"name": FETCH_CONTAINER, "image": image, "command": ["python3", "-c", FETCH_INIT],
             "env": [from_secret("PHX_BUNDLE_URL", "bundle-url"), {"name": "PHX_BUNDLE_SHA256", "value": BUNDLE_SHA256}],
             "terminationMessagePolicy": "FallbackToLogsOnError", "volumeMounts": [{"name": "phx", "mountPath": ROOT}]}
    env = [{"name": "PYTHONPATH", "value": f"{ROOT}/lib"}, {"name": "PHALANX_HOME", "value": HOME},
           {"name": "PYTHONUNBUFFERED", "value": "1"},
           from_secret("PHX_BUNDLE_URL", "bundle-url"), {"name": "PHX_BUNDLE_SHA256", "value": BUNDLE_SHA256},
           from_secret("PHX_RECORD_GET", "record-get"), from_secret("PHX_RECORD_PUT", "record-put"),
           from_secret("PHX_STATE_GET", "state-get"), from_secret("PHX_STATE_PUT", "state-put"),
           {"name": "PHX_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "PHX_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
    container = {"name": CONTAINER, "image": image, "command": ["python3", "-m", ENTRY, job_id], "workingDir": f"{ROOT}/code",
                 "env": env, "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                 "terminationMessagePolicy": "FallbackToLogsOnError", "volumeMounts": [{"name": "phx", "mountPath": ROOT}]}
    placement = {k: v for k, v in scheduling(section).items() if k in ("serviceAccountName", "imagePullSecrets")}
    pod = {"metadata": {"labels": labels(job_id), "annotations": {"sidecar.istio.io/inject": "false"}},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": GRACE, "enableServiceLinks": False,
                    **placement, "initContainers": [fetch], "containers": [container],
                    "volumes": [{"name": "phx", "emptyDir": {}}]}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
           "spec": {"backoffLimit": RESTARTS, "podReplacementPolicy": "Failed", "ttlSecondsAfterFinished": TTL,
                    "template": pod}}
    return [secret, job]


def role(namespace: str, service_account: str, verbs: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """The Role granting ``verbs`` ((verb, kind, subresource), ``preflight.needed``) in
    ``namespace`` and its binding to ``service_account``."""
    from .client import RESOURCES

    rules: dict[tuple[str, str], set[str]] = {}
    for verb, kind, sub in verbs:
        res = RESOURCES[kind]
        rules.setdefault((res.group, res.plural + (f"/{sub}" if sub else "")), set()).add(verb)
    role_name = "phalanx-supervisor"
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": role_name, "namespace": namespace},
         "rules": [{"apiGroups": [group], "resources": [resource], "verbs": sorted(v)} for (group, resource), v in sorted(rules.items())]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": role_name, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
         "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]},
    ]


def supervisor_verbs(kind: str) -> list[tuple[str, str, str]]:
    """What the supervisor pod does: an attempt's verbs (object store path), reading its own
    pods (``phalanx stop`` from elsewhere waits for them) and listing Jobs to re-attach."""
    from .preflight import needed

    return sorted(set(needed(kind, True)) | {("list", "Job", ""), ("get", "Pod", "")})
