"""The Kubernetes backend: ``phalanx run --backend k8s -n 2x4 train.py``.

One attempt is one workload in the cluster (an Indexed Job and its headless Service by
default; ``--k8s-kind`` PyTorchJob, TrainJob or JobSet), one pod per node, each running the node
agent from the code bundle (``delivery.py``: no image to build). This module is the thin adapter
onto the backend interface; the parts live beside it:

- ``options.py``: the options and the job file's ``kubernetes:`` section, checked offline;
- ``manifests.py``/``kinds.py``: the objects (pure; ``plan`` renders them, ``--dry-run`` prints
  them, ``start`` applies exactly them with the bundle's URL filled in);
- ``preflight.py``: cluster checks before the job is recorded (namespace, RBAC, operator, GPUs);
- ``client.py``/``kubeconfig.py``: the API server, as kubectl reaches it;
- ``watch.py``/``node.py``: pods to node states and results, pod logs to the job directory;
- ``pod.py``: the container's entry inside the pod.

Inside a pod the job directory is ``/phx/job`` (laid out like any job's), the code ``/phx/code``
(the working directory), phalanx ``/phx/lib``, the state directory ``/phx/state``; each node
mirrors its files back through its log, so ``phalanx logs``, ``status`` and ``metrics`` read
the local job directory as for any backend, and keep working after the pods are gone.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from ...core.env import Topology
from ...core.paths import HomePaths, JobPaths, read_json, write_atomic, write_json
from ...core.spec import EntrypointKind, Framework, JobSpec, in_snapshot
from ...errors import BackendError, UsageError
from ...launch.plan import Plan
from ..base import Backend, NodeHandle, PortSource
from ..local import RESTART_SAFE_ENV, build_nodes
from ..options import validate
from . import delivery, kinds, manifests, options
from .client import ApiError, Client
from .watch import Attempt, Ref

POD_JOB_DIR = manifests.ROOT + "/job"
POD_CODE = manifests.ROOT + "/code"
POD_STATE = manifests.ROOT + "/state"
POD_MARGIN = 15  # seconds of pod grace beyond --grace: the agent's own stop, the last frames
TTL = 3600  # seconds a finished workload stays when phalanx cannot delete it (supervisor gone)


class KubernetesBackend(Backend):
    name = "k8s"
    options = options.OPTIONS
    local_slots = False  # the cluster places trials of a sweep

    def preflight(self, spec: JobSpec) -> None:
        """Cluster checks before the job is recorded (see ``preflight.py``); raises UsageError."""
        from ... import config
        from .preflight import check

        opts = validate(self.name, self.options, spec.backend_options)
        self.plan(spec, "preflight", 0, HomePaths(config.home()))  # what plan refuses, refused first
        check(spec, opts, config.home())

    def _plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, ports: PortSource) -> Plan:
        opts = spec.backend_options
        options.check(dict(opts))
        if spec.channels:
            raise UsageError("inputs (--input) do not reach Kubernetes pods yet",
                             "read the data from object storage in the script, or mount it (kubernetes: volumes)")
        if not spec.snapshot:
            raise UsageError("the k8s backend ships the code snapshot to the pods",
                             "drop --no-snapshot; a working directory too big to snapshot needs a .phalanxignore")
        kind = str(opts["k8s_kind"])
        name = manifests.object_name(job_id, attempt)
        hosts = manifests.node_hosts(kind, name, spec.resources.nnodes)
        pod_spec = in_pod(spec)
        pod_paths = JobPaths(Path(POD_JOB_DIR))
        nworkers = spec.resources.nnodes * spec.procs_per_node_started
        topo = Topology(
            job_id=job_id, attempt=attempt, node_addrs=hosts, master_port=manifests.PORT,
            worker_ports=tuple(manifests.PORT + 1 + i for i in range(nworkers)) if spec.framework is Framework.TF else (),
            state_dir=POD_STATE, output_dir=str(pod_paths.output_dir), job_dir=POD_JOB_DIR,
            num_gpus=int(opts.get("gpus_per_node") or 0),
        )
        nodes = build_nodes(pod_spec, topo, pod_paths, hosts, hosts, dict(RESTART_SAFE_ENV))
        launch = {"job_dir": POD_JOB_DIR, "attempt": attempt, "grace": spec.grace, "sample_interval": spec.sample_interval,
                  "nodes": [n.to_dict() for n in nodes]}
        way = delivery.choose(opts.get("code_uri"), spec.output_uri)
        workload = manifests.Workload(
            kind=kind, name=name, job_id=job_id, attempt=attempt, job_name=spec.name, command=spec.entrypoint.display(),
            nnodes=spec.resources.nnodes, nproc_per_node=spec.resources.nproc_per_node, image=str(opts["image"]),
            launch=launch, grace_seconds=int(math.ceil(spec.grace)) + POD_MARGIN, bundle_in_configmap=way.store is None,
            gpus_per_node=int(opts.get("gpus_per_node") or 0), queue=opts.get("queue"),
            ttl_seconds=None if opts.get("keep_failed") else TTL, section=opts.get("kubernetes") or {},
        )
        submission = manifests.to_yaml(manifests.render(workload))
        return Plan(job_id=job_id, attempt=attempt, backend=self.name, nodes=nodes, grace=spec.grace, submission=submission)

    def _start(self, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
        spec = JobSpec.from_dict(json.loads(paths.spec.read_text()))
        opts = validate(self.name, self.options, spec.backend_options)
        from ... import config

        try:
            client = Client(_credentials(opts))
            values = delivery.ship(paths.code_dir, delivery.choose(opts.get("code_uri"), spec.output_uri),
                                   HomePaths(config.home()).state_dir(spec.name))
        except UsageError as exc:  # the cluster or the bundle changed since the preflight
            raise BackendError(exc.message, exc.hint) from None
        write_atomic(paths.manifests(plan.attempt), plan.submission)
        objects = manifests.fill(manifests.from_yaml(plan.submission), values)
        kind = str(opts["k8s_kind"])
        ref = Ref(namespace=client.namespace, context=client.creds.context, kind=kind, api_kind=objects[-1]["kind"],
                  name=objects[-1]["metadata"]["name"], job_id=plan.job_id, attempt=plan.attempt,
                  container=kinds.NODE_CONTAINER[kind])
        uid = apply(client, objects)
        write_json(paths.scheduler_job(plan.attempt), ref.record(uid=uid, submitted=time.time()))
        return self._handles(client, ref, plan, paths, spec, opts)

    def _attach(self, plan: Plan, paths: JobPaths) -> list[NodeHandle] | None:
        """The attempt's workload, found by its scheduler.json or its labels, while it still
        exists in the cluster (finished or not: its pods still say how it ended)."""
        spec = JobSpec.from_dict(json.loads(paths.spec.read_text()))
        opts = validate(self.name, self.options, spec.backend_options)
        known = read_json(paths.scheduler_job(plan.attempt)) or {}
        try:
            client = Client(_credentials({**opts, "context": known.get("context") or opts.get("context"),
                                          "namespace": known.get("namespace") or opts.get("namespace")}))
            kind = str(known.get("kind") or opts["k8s_kind"])
            api_kind = str(known.get("api_kind") or objects_kind(kind))
            found = client.list(api_kind, labels=manifests.selector(plan.job_id, plan.attempt))
        except (UsageError, ApiError):
            return None  # no cluster to ask: nothing to watch from here
        if not found:
            return None
        ref = Ref(namespace=client.namespace, context=client.creds.context, kind=kind, api_kind=api_kind,
                  name=found[0]["metadata"]["name"], job_id=plan.job_id, attempt=plan.attempt,
                  container=kinds.NODE_CONTAINER[kind])
        if not known:
            write_json(paths.scheduler_job(plan.attempt), ref.record(found_by="labels"))
        return self._handles(client, ref, plan, paths, spec, opts)

    def _handles(self, client: Client, ref: Ref, plan: Plan, paths: JobPaths, spec: JobSpec,
                 opts: dict[str, Any]) -> list[NodeHandle]:
        from ... import config

        per_node = spec.procs_per_node_started
        ranks = [[n * per_node + i for i in range(per_node)] for n in range(len(plan.nodes))]
        trees = {"output": paths.output_dir, "state": HomePaths(config.home()).state_dir(spec.name)}
        attempt = Attempt(client, ref, paths, ranks, int(math.ceil(plan.grace)) + POD_MARGIN, trees,
                          pending_timeout=opts.get("pending_timeout"), keep_failed=bool(opts.get("keep_failed")))
        return [K8sNode(attempt, node.node_rank) for node in plan.nodes]


def objects_kind(kind: str) -> str:
    from .preflight import KIND_OF

    return KIND_OF[kind]


def _credentials(opts: dict[str, Any]) -> Any:
    from .kubeconfig import load

    return load(opts.get("context"), opts.get("namespace"))


def in_pod(spec: JobSpec) -> JobSpec:
    """``spec`` as it runs inside a pod: from the unpacked code (``/phx/code``), with the
    image's python3. Raises UsageError when the script is not part of the code."""
    pod = in_snapshot(spec, POD_CODE).with_(python="python3")
    entry = pod.entrypoint
    if entry.kind is EntrypointKind.SCRIPT and not entry.target.startswith(POD_CODE + "/"):
        raise UsageError(f"the script {entry.target} is outside the working directory {spec.workdir}, so it is not in the "
                         "code shipped to the pods", "run from a directory that holds the script (or pass --workdir)")
    return pod


def apply(client: Client, objects: list[dict[str, Any]]) -> str:
    """Create ``objects`` in order, then make the workload (the last) their owner; the
    workload's uid. On any refusal everything created so far is deleted again and a
    BackendError says what was refused."""
    created: list[tuple[str, str]] = []
    try:
        answers = []
        for obj in objects:
            answers.append(client.create(obj["kind"], obj))
            created.append((obj["kind"], obj["metadata"]["name"]))
        owner = manifests.owner_reference(answers[-1])
        for obj in objects[:-1]:
            client.patch(obj["kind"], obj["metadata"]["name"], {"metadata": {"ownerReferences": [owner]}})
    except ApiError as exc:
        for kind, name in reversed(created):
            try:
                client.delete(kind, name, propagation="Foreground", grace=0)
            except ApiError:
                pass
        what = f"creating the {objects[len(created)]['kind']}" if len(created) < len(objects) else "setting owners"
        raise BackendError(f"the cluster refused {what}: {exc.message}", exc.hint) from None
    return str(answers[-1]["metadata"].get("uid", ""))


class K8sNode(NodeHandle):
    """One node of an attempt, as the supervisor sees it: its pod, through the shared Attempt."""

    kill_margin = 20.0  # API round trips, the pod entry's final mirror scan, the log's last frames

    def __init__(self, attempt: Attempt, node_rank: int) -> None:
        self.attempt = attempt
        self.node_rank = node_rank

    def poll(self) -> int | None:
        return self.attempt.poll(self.node_rank)

    def signal(self, signum: int) -> None:
        self.attempt.signal(signum)

    def kill(self) -> None:
        self.attempt.kill()

    def running(self) -> bool:
        return self.attempt.running(self.node_rank)
