"""The Kubernetes backend's options and the job file's ``kubernetes:`` section, as data and
checks that need no cluster (and import nothing heavy: the CLI reads this module).

Command-line options (``backend_options`` in a job file, same names), each with its value rule
(``kind``), so a flag and a job-file value fail alike, in one line, before anything is planned::

    --namespace team-a  --context prod  --image pytorch/pytorch:...  --queue team-a
    --k8s-kind job|pytorchjob|trainjob|jobset  --gpus-per-node 8  --memory 64Gi
    --pending-timeout 600  --keep-failed  --code-uri s3://bucket/prefix

The ``kubernetes:`` section (``SECTIONS``; the same mapping as ``backend_options.pod``, which
wins over it) holds what only a cluster's admins can tell a user. ``check_section`` reads the
job file's Node, so its errors name the line of the key it refuses::

    kubernetes:
      node_selector: {cloud.google.com/gke-accelerator: nvidia-h100-80gb}
      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
      priority_class: high
      service_account: trainer
      image_pull_secrets: [regcred]
      volumes: [{name: data, mountPath: /data, readOnly: true, persistentVolumeClaim: {claimName: data}}]
      env: {HF_HOME: /data/hf}          # or a list of Kubernetes EnvVar objects (valueFrom...)
      annotations: {...}                # on every pod
      labels: {...}                     # on every pod
      resources: {requests: {cpu: "8", memory: 64Gi}, limits: {memory: 64Gi}}
      runtime: torch-distributed        # the TrainingRuntime a TrainJob refers to
"""

from __future__ import annotations

import re
from typing import Any, Callable

from ...core.optiontypes import BadValue, Checked, Choice, Custom, Float, Int, Node
from ...errors import UsageError
from ..options import BackendOption, BackendSection

KINDS = {
    "job": "a batch/v1 Indexed Job and a headless Service (no operator needed)",
    "pytorchjob": "a Kubeflow PyTorchJob (kubeflow.org/v1, Training Operator v1)",
    "trainjob": "a Kubeflow TrainJob (trainer.kubeflow.org/v1alpha1, Trainer v2)",
    "jobset": "a JobSet (jobset.x-k8s.io/v1alpha2)",
}
DEFAULT_KIND = "job"
DEFAULT_IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
DEFAULT_RUNTIME = "torch-distributed"

# https://github.com/distribution/reference (regexp.go): the grammar every runtime parses.
_ALNUM = r"[a-z0-9]+"
_PATH = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN = r"(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*" \
          r"|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_IMAGE = re.compile(
    rf"^(?:{_DOMAIN}/)?{_PATH}(?:/{_PATH})*(?::[\w][\w.-]{{0,127}})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{{32,}})?$"
)
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # RFC 1035, at most 63
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")  # at most 253
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
# https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")


def image_problem(image: str) -> str | None:
    """Why ``image`` is no image reference a container runtime accepts (None when it is one)."""
    if not image or len(image.split("@")[0].rsplit(":", 1)[0]) > 255 or not _IMAGE.match(image):
        return f"'{image}' is not an image reference"
    return None


# -- the options' value rules (core/optiontypes: the flag and the job file read them alike) -----


def _image(text: str) -> str:
    if image_problem(text):
        raise BadValue("an image reference", "[REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST], lowercase, e.g. " + DEFAULT_IMAGE)
    return text


def _dns_label(text: str) -> str:
    if len(text) > 63 or not DNS_LABEL.match(text):
        raise BadValue("a Kubernetes name", "lowercase letters, digits and -, starting with a letter, at most 63")
    return text


def _code_uri(text: str) -> str:
    scheme, sep, rest = text.partition("://")
    if not sep or not scheme or not rest.strip("/"):
        raise BadValue("an object store prefix", "e.g. s3://bucket/phalanx")
    return text


def _memory(text: str) -> str:
    number = re.match(r"^\+?(\d+(\.\d*)?|\.\d+)", text.strip())
    if not _QUANTITY.match(text.strip()) or not number or float(number.group(1)) == 0:
        raise BadValue("a memory quantity", "e.g. 64Gi or 500M")
    return text.strip()


OPTIONS: tuple[BackendOption, ...] = (
    BackendOption("namespace", str, None, "Kubernetes namespace (default: the context's, else 'default').",
                  kind=Custom(expected="a Kubernetes name", parser=_dns_label), metavar="NAME"),
    BackendOption("context", str, None, "kubeconfig context (default: the current one; in a pod, its service account)."),
    BackendOption("image", str, DEFAULT_IMAGE, "Container image with python3 and your framework; the code travels "
                                               "separately, so no image is built.",
                  kind=Custom(expected="an image reference", parser=_image), metavar="IMAGE"),
    BackendOption("queue", str, None, "Kueue LocalQueue to submit to (label kueue.x-k8s.io/queue-name).",
                  kind=Custom(expected="a Kubernetes name", parser=_dns_label), metavar="NAME"),
    BackendOption("k8s_kind", str, DEFAULT_KIND, "What to create: " + "; ".join(f"{k}: {v}" for k, v in KINDS.items())
                  + ".", kind=Choice(choices=tuple(KINDS), metavar="KIND")),
    BackendOption("gpus_per_node", int, None, "GPUs each pod requests (limit nvidia.com/gpu).",
                  kind=Int(low=0, expected="a GPU count")),
    BackendOption("memory", str, None, "Memory each pod requests and is limited to, e.g. 64Gi "
                                       "(the kubernetes: section's resources say more).",
                  kind=Custom(expected="a memory quantity", parser=_memory), metavar="QUANTITY"),
    BackendOption("pending_timeout", float, None, "Fail an attempt whose pods wait this many seconds for "
                                                  "a node (default: wait).", kind=Float(positive=True)),
    BackendOption("keep_failed", bool, False, "Keep a failed attempt's pods for debugging (not deleted, no TTL)."),
    BackendOption("in_cluster", bool, False, "With -d: run the job's supervisor in a pod of the cluster (retries, "
                                             "preemption re-runs and the record go on without this machine); "
                                             "needs an s3:// --code-uri or --output."),
    BackendOption("code_uri", str, None, "Object store prefix (s3://...) the code bundle is uploaded to; "
                                         "default: the --output URI; without either, a ConfigMap.",
                  kind=Custom(expected="an object store prefix", parser=_code_uri), metavar="URI"),
    # The job file's kubernetes: section, checked (SECTIONS below); a mapping, so no flag.
    BackendOption("pod", dict, None, "Job file only: the pods' settings, as in the kubernetes: section (a mapping).",
                  kind=Checked(check=lambda value: check_section(value, "backend_options.pod"), node=True), cli=False),
)

_TOLERATION = {"key": str, "operator": str, "value": str, "effect": str, "tolerationSeconds": int}
_VOLUME_SOURCES = frozenset({
    "persistentVolumeClaim", "configMap", "secret", "emptyDir", "hostPath", "nfs", "csi", "ephemeral", "projected",
    "downwardAPI", "image", "iscsi", "fc", "azureFile", "cephfs", "glusterfs", "rbd", "flexVolume", "cinder",
})
RESERVED_VOLUMES = frozenset({"phx", "phx-launch", "phx-bundle", "dshm"})
RESERVED_PATHS = ("/phx", "/phx-bundle", "/dev/shm", "/dev/termination-log")
SECTION_KEYS = {
    "node_selector": "node labels a pod's node must have (mapping)",
    "tolerations": "Kubernetes tolerations (list)",
    "priority_class": "PriorityClass name",
    "service_account": "ServiceAccount the pods run as",
    "image_pull_secrets": "Secret names for pulling the image (list)",
    "volumes": "extra volumes: name, mountPath, readOnly, subPath and one volume source (list)",
    "env": "extra container environment (mapping, or a list of EnvVar objects)",
    "annotations": "annotations on every pod (mapping)",
    "labels": "labels on every pod (mapping)",
    "resources": "container requests and limits (cpu, memory, ...)",
    "runtime": f"TrainJob: the ClusterTrainingRuntime to use (default {DEFAULT_RUNTIME})",
}


# -- the job file's kubernetes: section -------------------------------------------------------


class SectionError(UsageError):
    """A bad value at one key of the section; ``line``: that key's line in the job file (0 when
    the value came from Python code), which phalanx puts in front of the message."""

    def __init__(self, message: str, hint: str, line: int = 0) -> None:
        super().__init__(message, hint)
        self.line = line


class _Where:
    """The line of each key path in the section (from the job file's nodes), for messages."""

    def __init__(self, node: Node | None, name: str) -> None:
        self.name = name
        self.lines: dict[tuple[Any, ...], int] = {}
        if node is not None:
            self._walk(node, ())

    def _walk(self, node: Node, path: tuple[Any, ...]) -> None:
        if node.line:
            self.lines.setdefault(path, node.line)
        if node.is_mapping:
            for key, value in node.value:
                if key.line:
                    self.lines[(*path, key.value)] = key.line  # the key's line, not its value's
                self._walk(value, (*path, key.value))
        elif node.is_sequence:
            for i, item in enumerate(node.value):
                self._walk(item, (*path, i))

    def fail(self, path: tuple[Any, ...], problem: str, hint: str) -> SectionError:
        name = self.name + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
        line = next((self.lines[path[:n]] for n in range(len(path), -1, -1) if path[:n] in self.lines), 0)
        return SectionError(f"{name}: {problem}", hint, line)


def check_section(section: Any, name: str = "kubernetes") -> dict[str, Any]:
    """The job file's ``kubernetes:`` section (a job file's Node, with its lines, or the mapping
    itself), checked and normalised (``env`` as EnvVar list, absent keys omitted). Raises
    SectionError naming the key (``name`` is how the section is spelled) and its line."""
    node = section if isinstance(section, Node) else None
    where = _Where(node, name)
    value = node.plain() if node is not None else section
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise where.fail((), "must be a mapping", f"keys: {', '.join(SECTION_KEYS)}")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key not in SECTION_KEYS:
            raise where.fail((key,), "unknown key", f"valid keys: {', '.join(SECTION_KEYS)}")
        check_one = _CHECKS[str(key)]
        out[str(key)] = check_one(item, where, (key,))
    return out


def section_options(section: Any) -> dict[str, Any]:
    """The ``kubernetes:`` section -> the ``pod`` option (``backend_options.pod`` wins over it)."""
    return {"pod": check_section(section)}


SECTIONS = (
    BackendSection("kubernetes", "Kubernetes settings of the pods: " + "; ".join(f"{k}: {v}" for k, v in SECTION_KEYS.items())
                   + " (a mapping; docs/kubernetes.md).", section_options, node=True),
)


Checker = Callable[[Any, _Where, tuple[Any, ...]], Any]


def _mapping(value: Any, where: _Where, path: tuple[Any, ...], values: str = "label") -> dict[str, str]:
    if not isinstance(value, dict):
        raise where.fail(path, "must be a mapping of names to values", "e.g. {team: ml}")
    for key, item in value.items():
        if not isinstance(key, str) or not _qualified(key):
            raise where.fail((*path, key), "is not a valid label/annotation key", "[PREFIX/]NAME: letters, digits, - _ . (63 at most)")
        if isinstance(item, (dict, list)) or item is None:
            raise where.fail((*path, key), "must be a string", "quote it, e.g. \"true\"")
        if values == "label" and not (len(str(item)) <= 63 and _LABEL_VALUE.match(str(item))):
            raise where.fail((*path, key), f"'{item}' is not a valid label value", "letters, digits, - _ . (63 at most)")
    return {str(k): str(v) for k, v in value.items()}


def _qualified(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _annotations(value: Any, where: _Where, path: tuple[Any, ...]) -> dict[str, str]:
    return _mapping(value, where, path, values="any")


def _name(value: Any, where: _Where, path: tuple[Any, ...]) -> str:
    if not isinstance(value, str) or len(value) > 253 or not DNS_SUBDOMAIN.match(value):
        raise where.fail(path, f"'{value}' is not a Kubernetes object name", "lowercase letters, digits, - and .")
    return value


def _names(value: Any, where: _Where, path: tuple[Any, ...]) -> list[str]:
    if not isinstance(value, list):
        raise where.fail(path, "must be a list of names", "e.g. [regcred]")
    return [_name(v, where, (*path, i)) for i, v in enumerate(value)]


def _tolerations(value: Any, where: _Where, path: tuple[Any, ...]) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise where.fail(path, "must be a list of tolerations", "e.g. [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise where.fail((*path, i), "must be a mapping", f"keys: {', '.join(_TOLERATION)}")
        for key in item:
            if key not in _TOLERATION:
                raise where.fail((*path, i, key), "unknown key", f"keys: {', '.join(_TOLERATION)}")
            kind = _TOLERATION[key]
            if not isinstance(item[key], kind) or isinstance(item[key], bool):
                raise where.fail((*path, i, key), f"must be {'a number' if kind is int else 'a string'}", "see kubectl explain pod.spec.tolerations")
        if item.get("operator", "Equal") not in ("Equal", "Exists"):
            raise where.fail((*path, i, "operator"), f"'{item['operator']}' is not Equal or Exists", "use Equal or Exists")
        if item.get("effect", "NoSchedule") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise where.fail((*path, i, "effect"), f"'{item['effect']}' is not a taint effect", "use NoSchedule, PreferNoSchedule or NoExecute")
        if item.get("operator") == "Exists" and "value" in item:
            raise where.fail((*path, i, "value"), "must be empty with operator Exists", "drop value, or use operator Equal")
    return [dict(item) for item in value]


def _volumes(value: Any, where: _Where, path: tuple[Any, ...]) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise where.fail(path, "must be a list of volumes", "e.g. [{name: data, mountPath: /data, persistentVolumeClaim: {claimName: data}}]")
    names = set()
    for i, item in enumerate(value):
        at = (*path, i)
        if not isinstance(item, dict):
            raise where.fail(at, "must be a mapping", "name, mountPath, readOnly, subPath and one volume source")
        name = item.get("name")
        if not isinstance(name, str) or len(name) > 63 or not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", name):
            raise where.fail((*at, "name"), f"'{name}' is not a volume name", "lowercase letters, digits and -")
        if name in RESERVED_VOLUMES or name in names:
            raise where.fail((*at, "name"), f"'{name}' is taken", f"phalanx uses {', '.join(sorted(RESERVED_VOLUMES))}; names must differ")
        names.add(name)
        mount = item.get("mountPath")
        if not isinstance(mount, str) or not mount.startswith("/"):
            raise where.fail((*at, "mountPath"), "must be an absolute path", "e.g. mountPath: /data")
        if any(mount == p or mount.startswith(p + "/") or p.startswith(mount.rstrip("/") + "/") for p in RESERVED_PATHS):
            raise where.fail((*at, "mountPath"), f"'{mount}' overlaps phalanx's own mounts", f"keep clear of {', '.join(RESERVED_PATHS)}")
        extra = set(item) - {"name", "mountPath", "readOnly", "subPath"}
        sources = extra & _VOLUME_SOURCES
        unknown = extra - _VOLUME_SOURCES
        if unknown:
            raise where.fail((*at, sorted(unknown)[0]), "unknown key", "name, mountPath, readOnly, subPath and one volume source, "
                             "e.g. persistentVolumeClaim")
        if len(sources) != 1 or not isinstance(item[next(iter(sources))], dict):
            raise where.fail(at, "needs exactly one volume source (a mapping)", "e.g. persistentVolumeClaim: {claimName: data}")
        if "readOnly" in item and not isinstance(item["readOnly"], bool):
            raise where.fail((*at, "readOnly"), "must be true or false", "readOnly: true")
    return [dict(item) for item in value]


def _env(value: Any, where: _Where, path: tuple[Any, ...]) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        items = [{"name": str(k), "value": str(v)} for k, v in value.items()]
        paths = [(*path, k) for k in value]
    elif isinstance(value, list):
        items, paths = value, [(*path, i) for i in range(len(value))]
    else:
        raise where.fail(path, "must be a mapping of names to values, or a list of EnvVar", "e.g. {HF_HOME: /data/hf}")
    for item, at in zip(items, paths):
        if not isinstance(item, dict) or set(item) - {"name", "value", "valueFrom"} or "name" not in item:
            raise where.fail(at, "is not an EnvVar", "{name: X, value: Y} or {name: X, valueFrom: {secretKeyRef: ...}}")
        name = str(item["name"])
        if not _ENV_NAME.match(name):
            raise where.fail(at, f"'{name}' is not an environment variable name", "letters, digits, _ . -, not starting with a digit")
        if name == "PYTHONPATH" or name.startswith("PHX_"):
            raise where.fail(at, f"{name} is phalanx's", "pass it to the script with --env instead")
        if "value" in item and isinstance(item["value"], (dict, list)):
            raise where.fail(at, "value must be a string", "quote it")
    return [{k: (str(v) if k == "value" else v) for k, v in item.items()} for item in items]


def _resources(value: Any, where: _Where, path: tuple[Any, ...]) -> dict[str, dict[str, str]]:
    if not isinstance(value, dict) or set(value) - {"requests", "limits"}:
        raise where.fail(path, "must be a mapping with requests and/or limits", "e.g. {requests: {cpu: '8', memory: 64Gi}}")
    out: dict[str, dict[str, str]] = {}
    for part, amounts in value.items():
        if not isinstance(amounts, dict):
            raise where.fail((*path, part), "must be a mapping of resource names to quantities", "e.g. {memory: 64Gi}")
        for name, amount in amounts.items():
            if not _qualified(str(name)) or not _QUANTITY.match(str(amount)):
                raise where.fail((*path, part, name), f"'{amount}' is not a quantity", "e.g. 500m, 8, 64Gi, 1.5")
        out[str(part)] = {str(k): str(v) for k, v in amounts.items()}
    return out


def _runtime(value: Any, where: _Where, path: tuple[Any, ...]) -> str:
    return _name(value, where, path)


_CHECKS: dict[str, Checker] = {
    "node_selector": _mapping, "tolerations": _tolerations, "priority_class": _name, "service_account": _name,
    "image_pull_secrets": _names, "volumes": _volumes, "env": _env, "annotations": _annotations, "labels": _mapping,
    "resources": _resources, "runtime": _runtime,
}
