"""Checks against the cluster before anything is created (``phalanx run`` calls them before it
records the job): every problem is a UsageError (one line, the fix, exit 2), and nothing
exists yet to clean up.

- the kubeconfig and context (``kubeconfig.load``), and that the API server answers;
- the namespace exists;
- RBAC: each verb phalanx needs on each resource (SelfSubjectAccessReview), named when missing;
- the opt-in kind's API (its operator) is installed, and a TrainJob's runtime exists;
- some node offers the GPUs asked for (skipped when nodes cannot be listed, and with
  ``--pending-timeout``: a cluster that adds GPU nodes on demand has none until asked);
- the code bundle can travel the way chosen (``delivery.estimate``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ...core.spec import JobSpec
from ...errors import UsageError
from . import delivery, options
from .client import RESOURCES, ApiError, Client, Resource
from .kubeconfig import load

KIND_OF = {"job": "Job", "pytorchjob": "PyTorchJob", "trainjob": "TrainJob", "jobset": "JobSet"}
RUNTIMES = Resource("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", namespaced=False)


def connect(opts: Mapping[str, Any], timeout: float = 30.0) -> Client:
    return Client(load(opts.get("context"), opts.get("namespace")), timeout=timeout)


def needed(kind: str, object_store: bool) -> list[tuple[str, str, str]]:
    """(verb, kind, subresource) phalanx uses in one attempt's life."""
    top = KIND_OF[kind]
    verbs = [("create", top, ""), ("get", top, ""), ("delete", top, ""), ("create", "ConfigMap", ""),
             ("patch", "ConfigMap", ""), ("list", "Pod", ""), ("delete", "Pod", ""), ("get", "Pod", "log"),
             ("list", "Event", "")]
    if object_store:
        verbs += [("create", "Secret", ""), ("patch", "Secret", "")]
    if kind == "job":
        verbs += [("create", "Service", ""), ("patch", "Service", "")]
    return verbs


def check(spec: JobSpec, opts: Mapping[str, Any], home: Path) -> Client:
    """Every check above; returns the client they used. Raises UsageError."""
    client = connect(opts, timeout=15.0)
    kind = str(opts.get("k8s_kind") or options.DEFAULT_KIND)
    _namespace(client)
    way = delivery.choose(opts.get("code_uri"), spec.output_uri)
    missing = [f"{verb} {RESOURCES[k].display}{'/' + sub if sub else ''}" for verb, k, sub in needed(kind, way.store is not None)
               if client.can(verb, k, sub=sub) is False]
    if missing:
        raise UsageError(f"not allowed in namespace '{client.namespace}' (RBAC): {', '.join(missing)}",
                         "ask the cluster's admins for a Role granting these, or use another --namespace or --context")
    if kind != "job":
        _api_installed(client, KIND_OF[kind])
    if kind == "trainjob":
        runtime = str((opts.get("pod") or {}).get("runtime") or options.DEFAULT_RUNTIME)
        try:
            client.request("GET", RUNTIMES.path(None, runtime))
        except ApiError as exc:
            if exc.code == 404:
                raise UsageError(f"the cluster has no ClusterTrainingRuntime '{runtime}'",
                                 "name one that exists in the job file (kubernetes: {runtime: NAME}); "
                                 "kubectl get clustertrainingruntimes lists them") from None
    gpus = int(opts.get("gpus_per_node") or 0)
    if gpus and opts.get("pending_timeout") is None:
        _gpus(client, gpus, (opts.get("pod") or {}).get("node_selector") or {})
    delivery.estimate(spec, home, way)
    return client


def _namespace(client: Client) -> None:
    try:
        client.get("Namespace", client.namespace)
    except ApiError as exc:
        if exc.code == 404:
            raise UsageError(f"namespace '{client.namespace}' does not exist (context {client.creds.context})",
                             f"create it (kubectl create namespace {client.namespace}) or pick another with --namespace") from None
        if exc.code == 401:
            raise UsageError(f"the API server {client.creds.server} refused the credentials of context {client.creds.context}",
                             "log in to the cluster again, then retry") from None
        if exc.code == 0:
            raise UsageError(exc.message, exc.hint) from None
        # 403: reading namespaces is often not allowed; the RBAC check below says what matters


def _api_installed(client: Client, kind: str) -> None:
    res = RESOURCES[kind]
    try:
        client.request("GET", res.api)
    except ApiError as exc:
        if exc.code == 404:
            raise UsageError(f"the cluster does not serve {kind} ({res.group}/{res.version}): its operator is not installed",
                             "install it, or use the default --k8s-kind job (no operator needed)") from None
        raise


def _gpus(client: Client, gpus: int, node_selector: Mapping[str, str]) -> None:
    try:
        nodes = client.list("Node")
    except ApiError:
        return  # listing nodes is often not allowed: the scheduler will say
    fitting = [n for n in nodes if all(((n.get("metadata") or {}).get("labels") or {}).get(k) == v
                                       for k, v in node_selector.items())]
    offers = [_count(((n.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu")) for n in fitting]
    best = max(offers, default=0)
    if best < gpus:
        where = f"{len(fitting)} node(s) matching kubernetes.node_selector" if node_selector else f"{len(nodes)} node(s)"
        raise UsageError(f"no node offers {gpus} nvidia.com/gpu (the most any of {where} offers is {best})",
                         "lower --gpus-per-node; where GPU nodes are added on demand, pass --pending-timeout SECONDS "
                         "to wait for one instead")


def _count(value: Any) -> int:
    try:
        return int(str(value or 0))
    except ValueError:
        return 0
