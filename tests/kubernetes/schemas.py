"""Strict validation of every object phalanx creates in a cluster, with no cluster at hand.

- Built-in kinds (Job, Service, ConfigMap, Secret): ``kubernetes-validate`` with the API
  server's own OpenAPI schemas of the versions in ``VERSIONS``, strict (unknown fields fail).
- CRD kinds (PyTorchJob, TrainJob, JobSet): the real CRDs' ``openAPIV3Schema`` (data/crds/,
  vendored unchanged) made strict as the API server's ``fieldValidation=Strict`` is: every object
  schema with properties and no ``x-kubernetes-preserve-unknown-fields`` rejects other fields.
  Their embedded pod templates are also checked as built-in PodTemplates.
- What no schema says: the CRDs' CEL rules (``x-kubernetes-validations``), the API server's
  cross-field validation of built-ins, and the admission webhooks' rules that matter to
  phalanx, written as assertions (``rules``), each citing where it comes from.

A reviewer can trust this for "the API server would accept this shape"; it says nothing about
RBAC, quota, Pod Security admission or defaults (docs/kubernetes.md, "what the tests prove").
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import yaml

CRDS = Path(__file__).parent / "data" / "crds"
VERSIONS = ("1.31", "1.35")  # podReplacementPolicy: beta 1.29, GA 1.34; kept to servers still supported
CRD_FILES = {
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_jobsets.yaml",
}
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
# Trainer v2's webhook refuses these in trainer.env (pkg/constants/constants.go, torch plugin).
PET_RESERVED = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}


def strictify(schema: Any) -> Any:
    """The schema with unknown fields refused wherever the API server refuses them."""
    if isinstance(schema, dict):
        out = {k: strictify(v) for k, v in schema.items()}
        if (out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        return out
    if isinstance(schema, list):
        return [strictify(v) for v in schema]
    return schema


@functools.lru_cache(maxsize=None)
def crd_validator(api_version: str, kind: str) -> Any:
    import jsonschema

    crd = yaml.safe_load((CRDS / CRD_FILES[(api_version, kind)]).read_text())
    version = api_version.split("/")[1]
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    return jsonschema.Draft7Validator(strictify(served["schema"]["openAPIV3Schema"]))


def validate(obj: dict[str, Any]) -> None:
    """Raise (AssertionError or a jsonschema ValidationError) unless the API server would take ``obj``."""
    import kubernetes_validate

    key = (obj["apiVersion"], obj["kind"])
    if key in CRD_FILES:
        errors = sorted(crd_validator(*key).iter_errors(obj), key=lambda e: list(e.path))
        assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors[:5])
        meta_only = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
        for version in VERSIONS:  # ObjectMeta is the API server's, not the CRD's
            kubernetes_validate.validate(meta_only, version, strict=True)
            for template in pod_templates(obj):
                wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
                kubernetes_validate.validate(wrapped, version, strict=True)
    else:
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    rules(obj)


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]
    if obj["kind"] == "PyTorchJob":
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "JobSet":
        return [r["template"]["spec"]["template"] for r in spec["replicatedJobs"]]
    return []  # a TrainJob carries patches, not a pod template


def rules(obj: dict[str, Any]) -> None:
    """What schemas cannot say, as the API server, the CRDs' CEL rules and the webhooks say it."""
    meta = obj["metadata"]
    name = meta["name"]
    assert len(name) <= 253 and re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", name), name
    for key, value in (meta.get("labels") or {}).items():
        assert len(str(value)) <= 63 and re.match(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", str(value)), (key, value)
    check = {"Job": _job, "Service": _service, "ConfigMap": _config, "Secret": _config, "TrainJob": _trainjob,
             "JobSet": _jobset, "PyTorchJob": _pytorchjob, "Role": _role, "RoleBinding": _role}[obj["kind"]]
    check(obj)


def _pod(template: dict[str, Any], restart: tuple[str, ...] = ("Never", "OnFailure")) -> None:
    """apis/core/validation: ValidatePodSpec's cross-field rules phalanx could break."""
    spec = template["spec"]
    assert spec.get("restartPolicy") in restart, spec.get("restartPolicy")
    names = [c["name"] for c in [*spec.get("initContainers", []), *spec["containers"]]]
    assert len(names) == len(set(names)), f"container names repeat: {names}"
    volumes = {v["name"] for v in spec.get("volumes", [])}
    assert len(volumes) == len(spec.get("volumes", [])), "volume names repeat"
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        assert DNS_1123_LABEL.match(c["name"]), c["name"]
        paths = [m["mountPath"] for m in c.get("volumeMounts", [])]
        assert len(paths) == len(set(paths)), f"mount paths repeat in {c['name']}"
        for mount in c.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{c['name']} mounts unknown volume {mount['name']}"
        envs = [e["name"] for e in c.get("env", [])]
        assert len(envs) == len(set(envs)), f"env names repeat in {c['name']}"
        for part in ("limits", "requests"):
            for res, amount in ((c.get("resources") or {}).get(part) or {}).items():
                assert re.match(r"^[+-]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$", str(amount)), amount
        # Extended resources (GPUs) may not be overcommitted: requests, if given, equal limits.
        gpu = ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
        requested = ((c.get("resources") or {}).get("requests") or {}).get("nvidia.com/gpu")
        assert requested in (None, gpu), "nvidia.com/gpu requests must equal limits"
    if spec.get("subdomain"):
        assert DNS_1123_LABEL.match(spec["subdomain"]) and len(spec["subdomain"]) <= 63


def _job(obj: dict[str, Any]) -> None:
    """apis/batch/validation: Indexed Jobs need completions; a pod's hostname <job>-<index> is a label."""
    spec = obj["spec"]
    name = obj["metadata"]["name"]
    assert len(name) <= 63 and DNS_1123_LABEL.match(name)
    if (obj["metadata"].get("labels") or {}).get("phalanx.dev/role") == "supervisor":
        # The supervisor (--in-cluster): one pod, replaced by the controller when it fails.
        assert "completionMode" not in spec and spec.get("completions", 1) == 1 and spec.get("parallelism", 1) == 1
        assert spec["backoffLimit"] >= 1 and spec.get("podReplacementPolicy") == "Failed"
        _pod(spec["template"], restart=("Never",))
        return
    assert spec["completionMode"] == "Indexed" and spec["completions"] >= 1
    assert 0 <= spec["parallelism"] <= spec["completions"]
    assert len(f"{name}-{spec['completions'] - 1}") <= 63, "pod hostnames exceed 63 characters"
    assert spec.get("podReplacementPolicy") in (None, "Failed", "TerminatingOrFailed")
    _pod(spec["template"], restart=("Never", "OnFailure"))
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # phalanx's own rule: no in-place restarts


def _role(obj: dict[str, Any]) -> None:
    """rbac/validation: a Role's rules name verbs and resources; a RoleBinding's subject is a
    ServiceAccount with a namespace, and it refers to a Role of the same namespace."""
    if obj["kind"] == "Role":
        for rule in obj["rules"]:
            assert rule["verbs"] and rule["resources"] and "apiGroups" in rule, rule
            assert set(rule["verbs"]) <= {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
    else:
        assert obj["roleRef"]["kind"] == "Role" and obj["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io"
        assert all(s["kind"] == "ServiceAccount" and s.get("namespace") for s in obj["subjects"])


def _service(obj: dict[str, Any]) -> None:
    """A Service's name is a DNS-1035 label (starts with a letter)."""
    assert DNS_LABEL.match(obj["metadata"]["name"]) and len(obj["metadata"]["name"]) <= 63
    assert obj["spec"]["clusterIP"] == "None"


def _config(obj: dict[str, Any]) -> None:
    """ConfigMap/Secret keys, and the 1 MiB a ConfigMap may hold (validation.MaxSecretSize)."""
    import base64

    total = 0
    for part in ("data", "binaryData", "stringData"):
        for key, value in (obj.get(part) or {}).items():
            assert CONFIG_KEY.match(key), key
            total += len(base64.b64decode(value)) if part == "binaryData" and not value.startswith("@") else len(value)
    assert total <= 1024 * 1024, f"{obj['kind']} holds {total} bytes"


def _trainjob(obj: dict[str, Any]) -> None:
    """The TrainJob CRD's CEL rules, and the Trainer webhook's (pkg/webhooks/trainjob_webhook.go)."""
    name = obj["metadata"]["name"]
    assert re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", name) and len(name) <= 63  # CEL: RFC 1035 label, <= 63
    spec = obj["spec"]
    assert spec.get("managedBy", "trainer.kubeflow.org/trainjob-controller") in (
        "trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue")  # CEL
    trainer = spec["trainer"]
    assert trainer.get("numProcPerNode", 1) >= 1  # CEL
    assert not PET_RESERVED & {e["name"] for e in trainer.get("env", [])}, "the webhook refuses user-set PET_* variables"
    for patch in spec.get("runtimePatches", []):
        for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            assert job["name"] == "node", "torch-distributed's replicated job is 'node'"
            pod = job["template"]["spec"]["template"]["spec"]
            for container in pod.get("containers", []):
                assert container["name"] == "node", "a ContainerPatch must name a container of the runtime"
            names = {v["name"] for v in pod.get("volumes", [])}
            for container in pod.get("containers", []):
                assert {m["name"] for m in container.get("volumeMounts", [])} <= names


def _jobset(obj: dict[str, Any]) -> None:
    """The JobSet CEL rule on startupPolicy/dependsOn, and hostnames within a DNS label."""
    spec = obj["spec"]
    in_order = (spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder"
    assert not (in_order and any("dependsOn" in r for r in spec["replicatedJobs"]))
    for rjob in spec["replicatedJobs"]:
        job = rjob["template"]["spec"]
        host = f"{obj['metadata']['name']}-{rjob['name']}-{rjob.get('replicas', 1) - 1}-{job['completions'] - 1}"
        assert len(host) <= 63, host
        _pod(job["template"])
        assert job["template"]["spec"]["restartPolicy"] == "Never"  # else the JobSet webhook defaults OnFailure


def _pytorchjob(obj: dict[str, Any]) -> None:
    """The Training Operator's validation (pkg/webhooks/pytorch): Master has one replica, every
    template has a container named 'pytorch'."""
    specs = obj["spec"]["pytorchReplicaSpecs"]
    assert set(specs) <= {"Master", "Worker"} and specs["Master"]["replicas"] == 1
    for role in specs.values():
        assert role["restartPolicy"] == "Never"
        assert "pytorch" in [c["name"] for c in role["template"]["spec"]["containers"]]
        _pod(copy.deepcopy(role["template"]) | {"spec": {**role["template"]["spec"], "restartPolicy": "Never"}})
