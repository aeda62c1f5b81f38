"""The objects one attempt creates, as pure functions of the plan (golden-tested, and checked
against the real schemas in the tests).

Default kind ``job``: a ``batch/v1`` Indexed Job plus a headless Service, no operator needed
(Kubernetes' "Job with Pod-to-Pod Communication",
https://kubernetes.io/docs/tasks/job/job-with-pod-to-pod-communication/). Node ``i`` is the Job's completion index ``i``
and is reached at ``<name>-<i>.<name>`` (the pod's hostname in the Service's subdomain). The
Job never retries on its own (``backoffLimit: 0``, ``restartPolicy: Never``,
``podReplacementPolicy: Failed``): phalanx owns retries, so an attempt is one Job, and a retry
is a new Job with a new name. The other kinds (``kinds.py``, which also lists an attempt's
objects: ``kinds.render``) carry the same pod.

Every object is named ``phx-<job id>-a<attempt>`` (a DNS label whatever the job id looks
like) and labelled ``phalanx.dev/job-id`` and ``phalanx.dev/attempt``, so phalanx finds all of
them again from any machine. Beside the workload:

- a ConfigMap ``launch.json`` holding every node's part of the plan (and the code bundle
  itself when no object store is configured and it is small);
- a Secret holding the presigned URL of the code bundle (object store path) and the job's
  secrets (``--secret``), each as key ``env.VAR``, which the node container takes as ``VAR``
  through ``secretKeyRef``: the value is in no manifest phalanx renders or keeps, only in the
  Secret the cluster stores (``SECRET_VALUE``, filled in at start).

Both are owned by the workload once it exists (``ownerReferences``), so deleting it, or its
TTL running out, removes them too.

Values known only when the attempt starts (the bundle's URL, digest and bytes; the same for
the job's state directory, restored into ``/phx/state`` before the node starts, so a retry or
``phalanx resume`` continues from its checkpoint) are the placeholders in ``PLACEHOLDERS``;
``--dry-run`` prints them as such.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ...errors import UsageError
from ...storage.bundle import FETCH

MANAGED_BY = "app.kubernetes.io/managed-by"
JOB_ID = "phalanx.dev/job-id"
ATTEMPT = "phalanx.dev/attempt"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
PORT = 29500  # torchrun's and the Trainer's default rendezvous port; every pod has its own
ROOT = "/phx"  # emptyDir: code/ and lib/ (the bundle), job/ (the job directory), state/
LAUNCH_DIR = "/phx-launch"  # the ConfigMap: launch.json[.gz], bundle.tar.gz (no object store)
CONTAINER = "node"
FETCH_CONTAINER = "phx-fetch"
BUNDLE_URL = "@BUNDLE_URL@"
BUNDLE_SHA256 = "@BUNDLE_SHA256@"
BUNDLE_BYTES = "@BUNDLE_TAR_GZ@"
STATE_URL = "@STATE_URL@"  # '' when the state directory is empty
STATE_SHA256 = "@STATE_SHA256@"
STATE_BYTES = "@STATE_TAR_GZ@"  # dropped when there is no state
PLACEHOLDERS = (BUNDLE_URL, BUNDLE_SHA256, BUNDLE_BYTES, STATE_URL, STATE_SHA256, STATE_BYTES)
SECRET_KEY_PREFIX = "env."  # a job secret's key in the attempt's Secret: env.HF_TOKEN


def secret_value(var: str) -> str:
    """The placeholder of secret variable ``var`` in the Secret: ``start`` fills the value in the
    object it sends to the API server; what is rendered, printed and kept holds this."""
    return f"@SECRET:{var}@"

# The init step: the code bundle into /phx, then the job's state directory (when it has one)
# into /phx/state, each with storage/bundle.py's FETCH (python3's standard library only).
FETCH_INIT = (
    "import os\n"
    "e = os.environ\n"
    "for url, digest, into in (('PHX_BUNDLE_URL', 'PHX_BUNDLE_SHA256', '/phx'), ('PHX_STATE_URL', 'PHX_STATE_SHA256', '/phx/state')):\n"
    "    if e.get(url):\n"
    "        e['PHX_BUNDLE_URL'], e['PHX_BUNDLE_SHA256'], e['PHX_BUNDLE_DIR'] = e[url], e.get(digest, ''), into\n"
    f"        exec({FETCH!r}, {{}})\n"
)
CONFIGMAP_MAX = 1024 * 1024  # bytes of data a ConfigMap may hold (the API server refuses more)
LAUNCH_GZIP_ABOVE = 128 * 1024  # launch.json beyond this travels gzipped (many nodes)
POD_ENTRY = "phalanx.backends.kubernetes.pod"


@dataclass(frozen=True)
class Workload:
    """Everything the manifests of one attempt depend on. Built by the backend's plan."""

    kind: str  # job | pytorchjob | trainjob | jobset
    name: str  # of every object of the attempt
    job_id: str
    attempt: int
    job_name: str
    command: str  # what the job runs (an annotation, for ps from other machines)
    nnodes: int
    nproc_per_node: int
    image: str
    launch: Mapping[str, Any]  # every node's launch.json part (pod.py picks its own)
    grace_seconds: int  # terminationGracePeriodSeconds: phalanx's grace + the agent's margin
    bundle_in_configmap: bool  # no object store: the bundle travels in the ConfigMap
    gpus_per_node: int = 0
    memory: str | None = None  # --memory: the container's memory request and limit
    queue: str | None = None
    ttl_seconds: int | None = 3600  # None: kept (--keep-failed)
    section: Mapping[str, Any] = field(default_factory=dict)  # the job file's kubernetes: section
    avoid_nodes: tuple[str, ...] = ()  # Kubernetes nodes an earlier attempt found bad (JobSpec.left_out)
    secrets: tuple[str, ...] = ()  # the variables --secret puts in the node container (names only)

    @property
    def has_secret(self) -> bool:
        """Whether the attempt has a Secret: the bundle's URL (object store) or job secrets."""
        return not self.bundle_in_configmap or bool(self.secrets)


def object_name(job_id: str, attempt: int) -> str:
    """``phx-<id>-a<attempt>``: a DNS label for any job id (unsafe characters replaced; the
    id's digest added when that changed it, so two ids never share a name)."""
    safe = re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-")
    if safe != job_id:
        safe = f"{safe[:20]}-{hashlib.sha256(job_id.encode()).hexdigest()[:8]}".strip("-")
    return f"phx-{safe}-a{attempt}"


def label_value(text: str) -> str:
    """``text`` if it is a valid label value, else a digest of it (labels are for finding)."""
    if len(text) <= 63 and re.match(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", text):
        return text
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def labels(job_id: str, attempt: int) -> dict[str, str]:
    return {MANAGED_BY: "phalanx", JOB_ID: label_value(job_id), ATTEMPT: str(attempt)}


def selector(job_id: str, attempt: int | None = None) -> str:
    """The label selector of a job's objects (of one attempt, or all)."""
    parts = [f"{MANAGED_BY}=phalanx", f"{JOB_ID}={label_value(job_id)}"]
    if attempt is not None:
        parts.append(f"{ATTEMPT}={attempt}")
    return ",".join(parts)


def node_hosts(kind: str, name: str, nnodes: int) -> tuple[str, ...]:
    """Each node's DNS name inside the cluster, in node-rank order (node 0 hosts the rendezvous).
    Raises UsageError when a name would exceed the 63 characters of a DNS label."""
    if kind == "job":
        labels_ = [f"{name}-{i}" for i in range(nnodes)]
        hosts = [f"{label}.{name}" for label in labels_]
    elif kind in ("jobset", "trainjob"):  # <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>
        labels_ = [f"{name}-node-0-{i}" for i in range(nnodes)]
        hosts = [f"{label}.{name}" for label in labels_]
    else:  # pytorchjob: the operator's Service per replica
        labels_ = [f"{name}-master-0", *(f"{name}-worker-{i}" for i in range(nnodes - 1))]
        hosts = list(labels_)
    longest = max(labels_, key=len)
    if len(longest) > 63:
        raise UsageError(f"the pod name '{longest}' would be {len(longest)} characters, more than the 63 of a DNS label",
                         "use fewer nodes, or shorter job ids")
    return tuple(hosts)


def rank_variable(kind: str) -> str:
    """The variable in which the kind's controller tells a pod its node rank."""
    return {"job": "JOB_COMPLETION_INDEX", "jobset": "JOB_COMPLETION_INDEX", "trainjob": "PET_NODE_RANK",
            "pytorchjob": "RANK"}[kind]


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """The objects as one YAML stream (``kubectl apply -f`` takes it); text with newlines
    (the launch plan) as literal blocks, so it reads as it is. Without PyYAML (the supervisor
    pod's image need not have it) one JSON document per line: JSON is YAML, so kubectl and
    ``from_yaml`` read it the same."""
    try:
        import yaml
    except ImportError:
        return "".join("---\n" + json.dumps(o, sort_keys=False) + "\n" for o in objects)

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value and not value.endswith((" ", "\t")) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return "".join("---\n" + yaml.dump(o, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=10_000)
                   for o in objects)


def from_yaml(text: str) -> list[dict[str, Any]]:
    try:
        import yaml
    except ImportError:  # what to_yaml wrote without it
        return [json.loads(doc) for doc in text.split("---\n") if doc.strip()]

    return [o for o in yaml.safe_load_all(text) if o]


def metadata(w: Workload, queue: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": w.name, "labels": labels(w.job_id, w.attempt)}
    if queue and w.queue:
        meta["labels"][QUEUE_LABEL] = w.queue
    meta["annotations"] = {"phalanx.dev/job-name": w.job_name, "phalanx.dev/command": w.command[:1000],
                           "phalanx.dev/topology": f"{w.nnodes}x{w.nproc_per_node}"}
    return meta


def launch_data(w: Workload) -> tuple[str, dict[str, str], dict[str, str]]:
    """The launch file's name in the ConfigMap and the ConfigMap's data and binaryData."""
    text = json.dumps(w.launch, sort_keys=True, indent=1) + "\n"
    if len(text) <= LAUNCH_GZIP_ABOVE:
        return "launch.json", {"launch.json": text}, {}
    packed = gzip.compress(text.encode(), mtime=0)
    if len(packed) > CONFIGMAP_MAX // 2:
        raise UsageError(f"the launch plan of {w.nnodes} nodes is {len(packed) >> 10} KiB even compressed, too big for a ConfigMap",
                         "use fewer nodes, or a shorter environment (--env)")
    return "launch.json.gz", {}, {"launch.json.gz": base64.b64encode(packed).decode()}


def config_map(w: Workload) -> dict[str, Any]:
    _, data, binary = launch_data(w)
    if w.bundle_in_configmap:
        binary = {**binary, "bundle.tar.gz": BUNDLE_BYTES, "state.tar.gz": STATE_BYTES}
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(w)}
    if data:
        obj["data"] = data
    if binary:
        obj["binaryData"] = binary
    obj["immutable"] = True
    return obj


def secret(w: Workload) -> dict[str, Any]:
    data = {} if w.bundle_in_configmap else {"bundle-url": BUNDLE_URL, "state-url": STATE_URL}
    data.update({SECRET_KEY_PREFIX + var: secret_value(var) for var in w.secrets})
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata(w), "type": "Opaque", "immutable": True,
            "stringData": data}


def service(w: Workload) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": metadata(w),
        "spec": {
            "clusterIP": "None",
            # Resolvable before the pods are ready: the rendezvous happens before "ready".
            "publishNotReadyAddresses": True,
            "selector": labels(w.job_id, w.attempt),
            "ports": [{"name": "rdzv", "port": PORT, "targetPort": PORT}],
        },
    }


def indexed_job(w: Workload) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "completionMode": "Indexed", "completions": w.nnodes, "parallelism": w.nnodes,
        "backoffLimit": 0,  # phalanx retries (a new Job); the controller never does
        "podReplacementPolicy": "Failed",  # never two pods for one index at a time
    }
    if w.ttl_seconds is not None:
        spec["ttlSecondsAfterFinished"] = w.ttl_seconds
    template = pod_template(w, rank_from=rank_variable("job"))
    template["spec"] = {"subdomain": w.name, **template["spec"]}
    spec["template"] = template
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata(w, queue=True), "spec": spec}


def pod_command(w: Workload, rank_from: str) -> list[str]:
    """The node container's command: the in-pod entry, which picks this node's part of the
    plan by ``rank_from`` and waits for node 0's name before starting the node agent."""
    launch, _, _ = launch_data(w)
    node0 = node_hosts(w.kind, w.name, w.nnodes)[0]
    argv = ["python3", "-m", POD_ENTRY, "--launch", f"{LAUNCH_DIR}/{launch}", "--node-rank-from", rank_from]
    return argv + (["--wait-for", node0] if w.nnodes > 1 else [])


def fetch_env(w: Workload) -> list[dict[str, Any]]:
    if w.bundle_in_configmap:
        url: dict[str, Any] = {"name": "PHX_BUNDLE_URL", "value": f"{LAUNCH_DIR}/bundle.tar.gz"}
        state: dict[str, Any] = {"name": "PHX_STATE_URL", "value": STATE_URL}
    else:
        url = {"name": "PHX_BUNDLE_URL", "valueFrom": {"secretKeyRef": {"name": w.name, "key": "bundle-url"}}}
        state = {"name": "PHX_STATE_URL", "valueFrom": {"secretKeyRef": {"name": w.name, "key": "state-url"}}}
    return [url, {"name": "PHX_BUNDLE_SHA256", "value": BUNDLE_SHA256}, state,
            {"name": "PHX_STATE_SHA256", "value": STATE_SHA256}]


def container_env(w: Workload) -> list[dict[str, Any]]:
    secrets = [{"name": var, "valueFrom": {"secretKeyRef": {"name": w.name, "key": SECRET_KEY_PREFIX + var}}}
               for var in w.secrets]
    return [{"name": "PYTHONPATH", "value": f"{ROOT}/lib"}, *w.section.get("env", []), *secrets]


def resources(w: Workload) -> dict[str, Any]:
    res = {part: dict(amounts) for part, amounts in (w.section.get("resources") or {}).items()}
    if w.gpus_per_node:
        res.setdefault("limits", {})["nvidia.com/gpu"] = str(w.gpus_per_node)
    if w.memory:  # the flag over the section: a memory limit below the request is refused by the API
        res.setdefault("requests", {})["memory"] = w.memory
        res.setdefault("limits", {})["memory"] = w.memory
    return res


def volume_mounts(w: Workload) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": "phx", "mountPath": ROOT}, {"name": "phx-launch", "mountPath": LAUNCH_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    for v in w.section.get("volumes", []):
        mount = {k: v[k] for k in ("name", "mountPath", "readOnly", "subPath") if k in v}
        mounts.append(mount)
    return mounts


def volumes(w: Workload) -> list[dict[str, Any]]:
    vols: list[dict[str, Any]] = [
        {"name": "phx", "emptyDir": {}},
        {"name": "phx-launch", "configMap": {"name": w.name}},
        # The 64 MiB default /dev/shm kills DataLoader workers and NCCL's shared-memory transport.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    for v in w.section.get("volumes", []):
        vols.append({k: val for k, val in v.items() if k not in ("mountPath", "readOnly", "subPath")})
    return vols


def node_container(w: Workload, rank_from: str, name: str = CONTAINER) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name, "image": w.image, "command": pod_command(w, rank_from), "workingDir": f"{ROOT}/code",
        "env": container_env(w),
        # The Training Operator takes MASTER_PORT from the port of this name (else 23456).
        "ports": [{"name": "pytorchjob-port" if w.kind == "pytorchjob" else "rdzv", "containerPort": PORT}],
    }
    res = resources(w)
    if res:
        container["resources"] = res
    # The node's result travels in the termination message too (pod.py writes it there).
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    container["volumeMounts"] = volume_mounts(w)
    return container


def fetch_container(w: Workload) -> dict[str, Any]:
    """Downloads and unpacks the bundle with nothing but the image's python3."""
    return {
        "name": FETCH_CONTAINER, "image": w.image, "command": ["python3", "-c", FETCH_INIT], "env": fetch_env(w),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "phx", "mountPath": ROOT}, {"name": "phx-launch", "mountPath": LAUNCH_DIR, "readOnly": True}],
    }


def pod_template(w: Workload, rank_from: str, container: str = CONTAINER) -> dict[str, Any]:
    section = w.section
    meta: dict[str, Any] = {"labels": {**section.get("labels", {}), **labels(w.job_id, w.attempt)},
                            # Sidecars (istio) keep a finished pod running; TorchX turns them off too.
                            "annotations": {"sidecar.istio.io/inject": "false", **section.get("annotations", {})}}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": w.grace_seconds,
        "enableServiceLinks": False,  # no env var per Service of the namespace
        "initContainers": [fetch_container(w)],
        "containers": [node_container(w, rank_from, container)],
        "volumes": volumes(w),
    }
    spec.update(scheduling(section))
    if w.avoid_nodes:  # a retry keeps off the nodes the attempt before found bad: by node name, exactly
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": list(w.avoid_nodes)}]}]}}}
    return {"metadata": meta, "spec": spec}


def scheduling(section: Mapping[str, Any]) -> dict[str, Any]:
    """Pod fields from the kubernetes: section that place and identify the pod."""
    out: dict[str, Any] = {}
    if section.get("node_selector"):
        out["nodeSelector"] = dict(section["node_selector"])
    if section.get("tolerations"):
        out["tolerations"] = [dict(t) for t in section["tolerations"]]
    if section.get("priority_class"):
        out["priorityClassName"] = section["priority_class"]
    if section.get("service_account"):
        out["serviceAccountName"] = section["service_account"]
    if section.get("image_pull_secrets"):
        out["imagePullSecrets"] = [{"name": n} for n in section["image_pull_secrets"]]
    return out


def fill(objects: list[dict[str, Any]], values: Mapping[str, str | None]) -> list[dict[str, Any]]:
    """``objects`` with every placeholder string replaced by its value; a None value drops
    the key holding it. Pure."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items() if not (isinstance(v, str) and v in values and values[v] is None)}
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, str) and node in values:
            return values[node]
        return node

    return [walk(o) for o in objects]


def owner_reference(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A reference making an object a dependent of ``obj`` (as the API server returned it)."""
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "blockOwnerDeletion": True}
