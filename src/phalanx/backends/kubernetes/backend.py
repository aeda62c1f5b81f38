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
- ``follow.py``/``node.py``: pods to node states and results, pod logs to the job directory;
- ``pod.py``: the container's entry inside the pod.

Inside a pod the job directory is ``/phx/job`` (laid out like any job's), the code ``/phx/code``
(the working directory), phalanx ``/phx/lib``, the state directory ``/phx/state``; each node
mirrors its files back through its log, so ``phalanx logs``, ``status`` and ``metrics`` read
the local job directory as for any backend, and keep working after the pods are gone.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Mapping

from ...core.contracts import NodeResult, SchedulerRecord, read_scheduler, write_scheduler
from ...core.env import Topology
from ...core.paths import HomePaths, JobPaths, write_atomic
from ...core.plan import Plan
from ...core.spec import Framework, JobSpec, in_snapshot
from ...errors import BackendError, UsageError
from ...launch.host import HostFacts
from ...launch.nodes import RESTART_SAFE_ENV, build_nodes
from ..base import Backend, Facts, NodeHandle
from ..options import validate
from . import delivery, kinds, manifests, options, supervisor
from .client import ApiError, Client, apply
from .ref import Ref
from .follow import Attempt

POD_JOB_DIR = manifests.ROOT + "/job"
POD_CODE = manifests.ROOT + "/code"
POD_STATE = manifests.ROOT + "/state"
POD_MARGIN = 15  # seconds of pod grace beyond --grace: the agent's own stop, the last frames
TTL = 3600  # seconds a finished workload stays when phalanx cannot delete it (supervisor gone)


class KubernetesBackend(Backend):
    name = "k8s"
    leaves_out = "exclude"  # see Backend.leaves_out
    options = options.OPTIONS
    local_slots = False  # the cluster places trials of a sweep

    def shares_files(self, spec: JobSpec) -> bool:
        return False  # the pods run the shipped copy of the code (the bundle, unpacked in /phx/code)

    def _facts(self, spec: JobSpec, host: HostFacts) -> Facts:
        """Nothing to ask the cluster: the controller names the pods, node 0 is reached by its
        DNS name and the port is fixed. The cluster is asked in ``check`` and ``start``."""
        return Facts(host)

    def check(self, spec: JobSpec) -> None:
        """Cluster checks before the job is recorded (see ``preflight.py``): what the plan refuses
        first (offline), then the kubeconfig, namespace, RBAC, operator, GPUs and the bundle's
        size. Raises UsageError; creates nothing."""
        from .preflight import check

        facts = self.facts(spec)
        home = HomePaths(facts.host.home or Path(".phalanx"))  # the plan only names paths under it
        self.plan(spec, "preflight", 0, home, facts)
        opts = validate(self.name, self.options, spec.backend_options)
        store = delivery.choose(opts.get("code_uri"), spec.output_uri).store
        if opts.get("in_cluster") and store is None:
            raise UsageError("--in-cluster keeps the job record in an object store; none is configured",
                             "give one with --code-uri s3://BUCKET/PREFIX (or --output s3://...)")
        if opts.get("in_cluster") and not str(store).startswith("s3://"):  # presigned PUT URLs: S3 only so far
            raise UsageError(f"--in-cluster keeps the job record in an s3:// store; {store} is not one",
                             "give --code-uri s3://BUCKET/PREFIX")
        check(spec, opts, home.root)

    def plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, facts: Facts) -> Plan:
        """The attempt's plan; with ``--in-cluster`` its notes (``--dry-run``) also name the
        supervisor pod and show the Role its service account needs, to apply before the first run."""
        plan = super().plan(spec, job_id, attempt, home, facts)
        opts = self.validated(spec).backend_options
        if not opts.get("in_cluster"):
            return plan
        from dataclasses import replace

        from . import supobjects

        account = (opts.get("pod") or {}).get("service_account") or "default"
        role = supobjects.role(str(opts.get("namespace") or "NAMESPACE"), account,
                               supobjects.supervisor_verbs(str(opts["k8s_kind"])))
        notes = [f"--in-cluster: the supervisor runs in the cluster as Job {supobjects.name(job_id)} "
                 f"(python3 -m {supobjects.ENTRY} {job_id}), service account '{account}', which needs this Role "
                 "(kubectl apply -f -):", *manifests.to_yaml(role).splitlines()]
        return replace(plan, notes=plan.notes + tuple(notes))

    def host_supervisor(self, record: Any, plan: Plan, events: Any = None) -> dict[str, Any] | None:
        """``--in-cluster``: the supervisor runs in a pod of the cluster (``hosted.py``)."""
        if not record.spec.backend_options.get("in_cluster"):
            return None
        from . import hosted

        return hosted.submit(record, plan, events)

    def stop_elsewhere(self, store: Any, record: Any, events: Any, stop_attempt: Any) -> Any:
        from . import hosted

        return hosted.stop(store, record, events, stop_attempt)

    def refresh_hosted(self, store: Any, record: Any, home: HomePaths) -> Any:
        from . import hosted

        return hosted.refresh(store, record, home)

    def find_hosted(self, ref: str, store: Any, home: HomePaths) -> Any:
        from . import hosted

        return hosted.find(ref, store, home)

    def import_hosted(self, store: Any, home: HomePaths) -> int:
        from . import hosted

        return hosted.find_all(store, home)

    def describe_hosted(self, record: Any) -> str:
        from . import hosted

        return hosted.describe(record)

    def _plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, facts: Facts) -> Plan:
        opts = spec.backend_options  # validated: each value already read with options.py's rules
        if spec.channels:
            raise UsageError("inputs (--input) do not reach Kubernetes pods yet",
                             "read the data from object storage in the script, or mount it (kubernetes: volumes)")
        if not spec.snapshot and not spec.code_dir:
            raise UsageError("the k8s backend ships the code snapshot to the pods",
                             "drop --no-snapshot; a working directory too big to snapshot needs a .phalanxignore")
        if spec.secrets and opts.get("in_cluster"):
            raise UsageError("secrets (--secret) do not reach a supervisor that runs in the cluster yet: it could "
                             "not read them for the attempts it starts",
                             "drop --in-cluster (the supervisor then runs here and hands them to each attempt's Secret)")
        kind = str(opts["k8s_kind"])
        name = manifests.object_name(job_id, attempt)
        hosts = manifests.node_hosts(kind, name, spec.resources.nnodes)
        section = opts.get("pod") or {}
        pod_spec = in_snapshot(spec, POD_CODE, shipped=True).with_(python="python3")
        pod_paths = JobPaths(Path(POD_JOB_DIR))
        nworkers = spec.resources.nnodes * spec.procs_per_node_started
        topo = Topology(
            job_id=job_id, attempt=attempt, node_addrs=hosts, master_port=manifests.PORT,
            worker_ports=tuple(manifests.PORT + 1 + i for i in range(nworkers)) if spec.framework is Framework.TF else (),
            state_dir=POD_STATE, output_dir=str(pod_paths.output_dir), job_dir=POD_JOB_DIR,
            num_gpus=int(opts.get("gpus_per_node") or 0), num_cpus=facts.host.cpus,
            # The pod's environment is the image's plus the section's env, not this machine's.
            preset_env=frozenset(_section_env_names(section)),
        )
        nodes = build_nodes(pod_spec, topo, pod_paths, hosts, hosts, dict(RESTART_SAFE_ENV))
        launch = {"job_dir": POD_JOB_DIR, "attempt": attempt, "grace": spec.grace, "sample_interval": spec.sample_interval,
                  "nodes": [n.to_dict() for n in nodes]}
        way = delivery.choose(opts.get("code_uri"), spec.output_uri)
        workload = manifests.Workload(
            kind=kind, name=name, job_id=job_id, attempt=attempt, job_name=spec.name, command=spec.entrypoint.display(),
            nnodes=spec.resources.nnodes, nproc_per_node=spec.resources.nproc_per_node, image=str(opts["image"]),
            launch=launch, grace_seconds=int(math.ceil(spec.grace)) + POD_MARGIN, bundle_in_configmap=way.store is None,
            gpus_per_node=int(opts.get("gpus_per_node") or 0), memory=opts.get("memory"), queue=opts.get("queue"),
            ttl_seconds=None if opts.get("keep_failed") else TTL, section=section, avoid_nodes=spec.left_out,
            secrets=tuple(sorted(spec.secrets)),
        )
        context = {
            "kind": kind, "context": opts.get("context"), "namespace": opts.get("namespace"),
            # The bundle's source: the job's snapshot, or the one a sweep's trials share.
            "code": spec.code_dir or str(paths.code_dir),
            "code_uri": opts.get("code_uri"), "output_uri": spec.output_uri,
            # The pods' output and state directories, mirrored back into these local ones; the
            # state directory also travels to the pods with the code.
            "trees": {"output": str(paths.output_dir), "state": str(home.state_dir(spec.state_key))},
            "pending_timeout": opts.get("pending_timeout"), "keep_failed": bool(opts.get("keep_failed")),
            "procs_per_node": spec.procs_per_node_started,  # the global ranks each node runs, for results
        }
        submission = manifests.to_yaml(kinds.render(workload))
        return Plan(job_id=job_id, attempt=attempt, backend=self.name, nodes=nodes, grace=spec.grace, submission=submission,
                    context=context)

    def _start(self, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
        ctx = plan.context
        trees = _trees(plan)
        try:
            client = Client(_credentials(ctx))
            if supervisor.active():  # in the supervisor pod (--in-cluster): its bundle, the state through the store
                values = supervisor.pod_values(trees.get("state"))
            else:
                values = delivery.ship(Path(ctx["code"]), delivery.choose(ctx.get("code_uri"), ctx.get("output_uri")),
                                       trees["state"])
        except UsageError as exc:  # the cluster or the bundle changed since the check
            raise BackendError(exc.message, exc.hint) from None
        write_atomic(paths.manifests(plan.attempt), plan.submission)
        # The job's secrets go into the attempt's Secret, in the objects sent to the API server
        # only (the file above and --dry-run keep the placeholders); pods take them by secretKeyRef.
        secrets = {manifests.secret_value(var): value for var, value in self.secret_env(plan.nodes[0]).items()}
        objects = manifests.fill(manifests.from_yaml(plan.submission), {**values, **secrets})
        kind = str(ctx["kind"])
        ref = Ref(namespace=client.namespace, context=client.creds.context, kind=kind, api_kind=objects[-1]["kind"],
                  name=objects[-1]["metadata"]["name"], job_id=plan.job_id, attempt=plan.attempt,
                  container=kinds.NODE_CONTAINER[kind])
        uid = apply(client, objects)
        record = ref.record(submitted=time.time(), uid=uid)
        write_scheduler(paths.scheduler_job(plan.attempt), record)
        return _handles(client, ref, record, plan, paths)

    def _attach(self, plan: Plan, paths: JobPaths) -> list[NodeHandle] | None:
        """The attempt's workload, found by its scheduler.json or its labels, while it still
        exists in the cluster (finished or not: its pods still say how it ended)."""
        ctx = plan.context
        known = read_scheduler(paths.scheduler_job(plan.attempt))
        if known is not None and known.scheduler != self.name:
            return None
        details: Mapping[str, Any] = known.details if known is not None else {}
        try:
            client = Client(_credentials({"context": details.get("context") or ctx.get("context"),
                                          "namespace": details.get("namespace") or ctx.get("namespace")}))
            kind = str(details.get("kind") or ctx.get("kind") or options.DEFAULT_KIND)
            api_kind = str(details.get("api_kind") or objects_kind(kind))
            found = client.list(api_kind, labels=manifests.selector(plan.job_id, plan.attempt))
        except (UsageError, ApiError):
            return None  # no cluster to ask: nothing to watch from here
        if not found:
            return None
        ref = Ref(namespace=client.namespace, context=client.creds.context, kind=kind, api_kind=api_kind,
                  name=found[0]["metadata"]["name"], job_id=plan.job_id, attempt=plan.attempt,
                  container=kinds.NODE_CONTAINER[kind])
        # Found by its labels: said in the handles, not written down (status, which only looks,
        # attaches too); the watcher writes scheduler.json once it is asked about the nodes.
        record = known if known is not None else ref.record(found_by="labels")
        return _handles(client, ref, record, plan, paths)


def _handles(client: Client, ref: Ref, record: SchedulerRecord, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
    ctx = plan.context
    per_node = int(ctx.get("procs_per_node") or 1)
    ranks = [[n * per_node + i for i in range(per_node)] for n in range(len(plan.nodes))]
    attempt = Attempt(client, ref, paths, ranks, int(math.ceil(plan.grace)) + POD_MARGIN, _trees(plan),
                      pending_timeout=ctx.get("pending_timeout"), keep_failed=bool(ctx.get("keep_failed")))
    handles: list[NodeHandle] = []
    for node in plan.nodes:
        handle = K8sNode(attempt, node.node_rank)
        handle.where = f"{ref.api_kind} {ref.name} in namespace {ref.namespace}"
        handle.submitted = record.submitted
        handles.append(handle)
    return handles


def _trees(plan: Plan) -> dict[str, Path]:
    """The local directories the pods' output and state directories are mirrored into."""
    return {name: Path(path) for name, path in plan.context.get("trees", {}).items()}


def _section_env_names(section: Mapping[str, Any]) -> list[str]:
    env = section.get("env") or {}
    if isinstance(env, Mapping):
        return [str(k) for k in env]
    return [str(e.get("name")) for e in env if isinstance(e, Mapping)]


def objects_kind(kind: str) -> str:
    from .preflight import KIND_OF

    return KIND_OF[kind]


def _credentials(opts: Mapping[str, Any]) -> Any:
    from .kubeconfig import IN_CLUSTER, load

    # An attempt a supervisor pod started names the context "in-cluster": from a pod that is its
    # service account, from elsewhere the kubeconfig's current context.
    context = opts.get("context")
    return load(None if context == IN_CLUSTER else context, opts.get("namespace"))


class K8sNode(NodeHandle):
    """One node of an attempt, as the supervisor sees it: its pod, through the shared Attempt."""

    kill_margin = 20.0  # API round trips, the pod entry's final mirror scan, the log's last frames

    def __init__(self, attempt: Attempt, node_rank: int) -> None:
        self.attempt = attempt
        self.node_rank = node_rank

    def poll(self) -> NodeResult | None:
        return self.attempt.poll(self.node_rank)

    def signal(self, signum: int) -> None:
        self.attempt.signal(signum)

    def kill(self) -> None:
        self.attempt.kill()

    def running(self) -> bool:
        return self.attempt.running(self.node_rank)
