"""The Ray backend's adapter to the backend interface (``backends/base.py``): options, facts,
plan, check, start, attach. Thin: the driver is :mod:`.driver`, the Jobs API :mod:`.client`, what
is submitted :mod:`.submission`, the supervisor's side of a running job :mod:`.node`.

``phalanx run --backend ray --address http://head:8265 -n 2x4 train.py``. One attempt is one Ray
job, ``phalanx-<job>-<attempt>``; its id, the cluster's address and where each node landed are in
the attempt's ``scheduler.json`` (``contracts.SchedulerRecord``). The nodes keep their copy of the
job under ``~/.phalanx/ray`` (their own home), laid out like ``$PHALANX_HOME``; the local job
directory stays the truth. The plan is pure: nothing is asked of the cluster before ``check``
(once, before the job is recorded) and ``start``; what ``start`` needs beyond the nodes is in
``Plan.context`` (the request, the cluster's address, what is shipped and mirrored back).
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from ...core.contracts import SchedulerRecord, read_launch, read_scheduler, write_scheduler
from ...core.env import Topology
from ...core.paths import HomePaths, JobPaths
from ...core.spec import JobSpec, in_snapshot
from ...errors import BackendError, UsageError
from ...storage.channels import is_single_file
from ...core.plan import Plan, late_addresses
from ...launch.nodes import RESTART_SAFE_ENV, build_nodes
from ...launch.host import HostFacts
from ..base import Backend, Facts, NodeHandle
from ..options import validate
from . import relay, submission
from .options import DEFAULT_PENDING_TIMEOUT, OPTIONS, validate_section

REMOTE_HOME = "~/.phalanx/ray"  # on each Ray node, in that node's home
PORT_RANGE = (29400, 29900)
MIN_RAY = "2.10"


class RayBackend(Backend):
    name = "ray"
    options = OPTIONS
    local_slots = False  # Ray places a sweep's trials; only --parallel limits them

    def shares_files(self, spec: JobSpec) -> bool:
        return False  # the nodes get a shipped copy of the code (the Ray working_dir)

    def _facts(self, spec: JobSpec, host: HostFacts) -> Facts:
        """No addresses to look up: the placement group places the nodes (the driver fills their
        addresses in) and the rendezvous port follows from the job id. Which inputs are single
        files decides where the job finds them on the nodes."""
        return Facts(host, single_files=frozenset(c.name for c in spec.channels if is_single_file(c)))

    def _plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, facts: Facts) -> Plan:
        opts = spec.backend_options
        section = validate_section(opts.get("ray"))
        # What the working_dir carries: the job's snapshot, the one a sweep's trials share, or the
        # working directory itself (--no-snapshot).
        code = spec.code_dir or (str(paths.code_dir) if spec.snapshot else spec.workdir)
        nnodes = spec.resources.nnodes
        remote_home = HomePaths(Path(REMOTE_HOME))
        remote = remote_home.job(job_id)
        addrs = late_addresses(nnodes)  # the placement group decides; the driver fills them in
        # Inputs travel in the working_dir (staged here first, as for ssh hosts) into the job
        # directory on each node; a single file lies inside its input's directory there.
        inputs = {c.name: str(home.channel_path(c)) for c in spec.channels}
        channels = tuple((c.name, str(remote.shipped_input(c.name) / Path(c.source).name) if c.name in facts.single_files
                          else str(remote.shipped_input(c.name))) for c in spec.channels)
        digest = int(hashlib.sha256(f"{job_id}:{attempt}".encode()).hexdigest(), 16)
        port = PORT_RANGE[0] + digest % (PORT_RANGE[1] - PORT_RANGE[0])
        topo = Topology(
            job_id=job_id, attempt=attempt, node_addrs=addrs, master_port=port,
            worker_ports=tuple(PORT_RANGE[0] + (digest + 1 + i) % (PORT_RANGE[1] - PORT_RANGE[0])
                               for i in range(nnodes * spec.procs_per_node_started)),
            state_dir=str(remote_home.state_dir(spec.state_key)), output_dir=str(remote.output_dir), job_dir=str(remote.root),
            num_gpus=int(opts.get("gpus_per_node") or 0), preset_env=frozenset(facts.host.env), channels=channels,
        )
        spec = in_snapshot(spec.with_(python=relay.PYTHON), str(remote.code_dir), shipped=True)
        nodes = build_nodes(spec, topo, remote, addrs, addrs, {"PHALANX_AUTO_IFNAME": "1", **RESTART_SAFE_ENV})
        pending = opts.get("pending_timeout")
        request = {
            "driver": {"pending_timeout": float(pending if pending is not None else DEFAULT_PENDING_TIMEOUT),
                       "gpus": opts.get("gpus_per_node"), "cpus": float(opts.get("cpus_per_node") or 1.0),
                       "master_port": port, "grace": spec.grace,
                       "trees": {"state": topo.state_dir, "output": topo.output_dir}},
            "env_vars": section.get("env_vars", {}), "pip": section.get("pip", []),
            "python": opts.get("remote_python") or section.get("py_executable"),
        }
        address = opts.get("address") or "$RAY_ADDRESS"
        text = submission.render(submission.submission_id(job_id, attempt), address, request, nnodes)
        context = {
            "request": request, "address": opts.get("address"), "token_file": opts.get("token_file"),
            "name": spec.name, "code": code, "inputs": inputs,
            # The nodes' state and output directories, mirrored back into these local ones.
            "trees": {"state": [topo.state_dir, str(home.state_dir(spec.state_key))],
                      "output": [topo.output_dir, str(paths.output_dir)]},
        }
        return Plan(job_id=job_id, attempt=attempt, backend=self.name, nodes=nodes, grace=spec.grace, submission=text,
                    context=context)

    # -- before anything is recorded: the checks that make bad input exit 2 ---------------

    def check(self, spec: JobSpec) -> None:
        self.preflight(spec)

    def preflight(self, spec: JobSpec) -> None:
        """Reach the cluster and check what the job needs of it: its address, the token, a Ray
        version the driver works with, and enough nodes (unless ``--pending-timeout`` says to
        wait for them). Raises UsageError naming the problem and the fix; starts nothing."""
        opts = validate(self.name, self.options, spec.backend_options)
        validate_section(opts.get("ray"))
        client = connect(opts)
        version = client.ray_version()
        if version and _version(version) < _version(MIN_RAY):
            raise UsageError(f"the Ray cluster at {client.address} runs Ray {version}; phalanx's driver needs Ray {MIN_RAY} or newer",
                             "upgrade the cluster's Ray, or run elsewhere")
        nodes = client.nodes()
        gpus = opts.get("gpus_per_node")
        if gpus is None:
            gpus = max([int(n["resources"].get("GPU", 0)) for n in nodes] or [0])
        need = {"CPU": float(opts.get("cpus_per_node") or 1.0), **({"GPU": float(gpus)} if gpus else {})}
        fit = [n for n in nodes if all(float(n["resources"].get(k, 0)) >= v for k, v in need.items())]
        nnodes = spec.resources.nnodes
        if len(fit) < nnodes and opts.get("pending_timeout") is None:
            each = ", ".join(f"{k} {v:g}" for k, v in need.items())
            have = "; ".join(f"{n['ip']}: " + ", ".join(f"{k} {float(n['resources'].get(k, 0)):g}" for k in ("CPU", "GPU"))
                             for n in nodes)
            raise UsageError(
                f"-n {nnodes}x{spec.resources.nproc_per_node} needs {nnodes} Ray node(s) with {each} each, one job node per "
                f"Ray node; the cluster at {client.address} has {len(fit)} ({have})",
                f"ask for at most {len(fit)} node(s) or fewer GPUs (--gpus-per-node), or add --pending-timeout SECONDS "
                "to wait for an autoscaler to add nodes")

    # -- start and attach -------------------------------------------------------------------

    def _start(self, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
        from .node import RayJob

        context = plan.context
        request = _request(plan)
        try:
            client = connect(context)
        except UsageError as exc:  # at a retry, the cluster is gone: the attempt cannot start
            raise BackendError(exc.message, exc.hint) from None
        sub_id = submission.submission_id(plan.job_id, plan.attempt)
        launch = read_launch(paths.node_launch(plan.attempt, plan.nodes[0].node_rank))
        job = submission.driver_job(plan, request, launch.sample_interval if launch else 5.0)
        with tempfile.TemporaryDirectory(prefix="phalanx-ray-") as staging:
            try:
                submission.stage(Path(staging), Path(context["code"]), _trees(plan)["state"], job,
                                 {name: Path(path) for name, path in context.get("inputs", {}).items()})
            except UsageError as exc:
                raise BackendError(exc.message, exc.hint) from None
            client.submit(submission.entrypoint(request.get("python")),
                          submission.runtime_env(request, staging, plan.grace, self.secret_env(plan.nodes[0])), sub_id,
                          {"phalanx_job": plan.job_id, "phalanx_attempt": str(plan.attempt),
                           "phalanx_name": str(context.get("name", ""))[:100]})
        record = SchedulerRecord(self.name, sub_id, time.time(), address=client.address)
        write_scheduler(paths.scheduler_job(plan.attempt), record)
        return _handles(RayJob(client, sub_id, paths, plan.attempt, len(plan.nodes), _trees(plan)), plan, record)

    def _attach(self, plan: Plan, paths: JobPaths) -> list[NodeHandle] | None:
        """The attempt's Ray job, while the cluster says it has not ended (the driver runs on the
        cluster, so it outlives a supervisor that dies). Found by the Ray job id and the address
        in the attempt's ``scheduler.json``."""
        from .node import RayJob

        record = read_scheduler(paths.scheduler_job(plan.attempt))
        if record is None or record.scheduler != self.name:
            return None
        try:
            client = connect({**plan.context, "address": record.address or plan.context.get("address")})
        except UsageError:
            return None
        if client.status(record.job_id)[0] in ("SUCCEEDED", "FAILED", "STOPPED", "GONE"):
            return None
        return _handles(RayJob(client, record.job_id, paths, plan.attempt, len(plan.nodes), _trees(plan)), plan, record)


def _handles(job: Any, plan: Plan, record: SchedulerRecord) -> list[NodeHandle]:
    from .node import RayNode

    handles: list[NodeHandle] = []
    for node in plan.nodes:
        handle = RayNode(job, node.node_rank)
        handle.where = f"Ray job {record.job_id}" + (f" at {record.address}" if record.address else "")
        handle.submitted = record.submitted
        handles.append(handle)
    return handles


def connect(opts: Mapping[str, Any]) -> Any:
    from .client import RayClient, find_token, resolve_address

    return RayClient(resolve_address(opts.get("address")), find_token(opts.get("token_file")))


def _request(plan: Plan) -> dict[str, Any]:
    """What the plan asks of Ray (``Plan.context``): the driver's settings, the runtime_env."""
    request = plan.context.get("request")
    if not isinstance(request, dict):
        raise BackendError(f"the plan of attempt {plan.attempt} has no Ray request", "plan the job again (phalanx resume)")
    return request


def _trees(plan: Plan) -> dict[str, Path]:
    """The local directories the nodes' state and output directories are mirrored into."""
    return {name: Path(pair[1]) for name, pair in plan.context.get("trees", {}).items()}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())
