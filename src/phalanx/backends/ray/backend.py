"""The Ray backend's adapter to the backend interface (``backends/base.py``): options, plan,
preflight, start, attach. Thin: the driver is :mod:`.driver`, the Jobs API :mod:`.client`, what is
submitted :mod:`.submission`, the supervisor's side of a running job :mod:`.node`.

``phalanx run --backend ray --address http://head:8265 -n 2x4 train.py``. One attempt is one Ray
job, ``phalanx-<job>-<attempt>``; its id, the cluster's address and where each node landed are in
the attempt's ``scheduler.json``. The nodes keep their copy of the job under ``~/.phalanx/ray``
(their own home), laid out like ``$PHALANX_HOME``; the local job directory stays the truth.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from ...core.env import Topology
from ...core.paths import HomePaths, JobPaths, read_json, write_json
from ...core.spec import JobSpec, in_snapshot
from ...errors import BackendError, UsageError
from ...core.plan import Plan, late_addresses
from ...launch.nodes import RESTART_SAFE_ENV, build_nodes
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

    def _plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, facts: Facts) -> Plan:
        opts = spec.backend_options
        section = validate_section(opts.get("ray"))
        if spec.channels:
            raise UsageError("--input is not shipped to a Ray cluster yet",
                             "read the data from a URI the nodes reach (pass it as a script argument)")
        nnodes = spec.resources.nnodes
        remote_home = HomePaths(Path(REMOTE_HOME))
        remote = remote_home.job(job_id)
        addrs = late_addresses(nnodes)  # the placement group decides; the driver fills them in
        digest = int(hashlib.sha256(f"{job_id}:{attempt}".encode()).hexdigest(), 16)
        port = PORT_RANGE[0] + digest % (PORT_RANGE[1] - PORT_RANGE[0])
        topo = Topology(
            job_id=job_id, attempt=attempt, node_addrs=addrs, master_port=port,
            worker_ports=tuple(PORT_RANGE[0] + (digest + 1 + i) % (PORT_RANGE[1] - PORT_RANGE[0])
                               for i in range(nnodes * spec.procs_per_node_started)),
            state_dir=str(remote_home.state_dir(spec.state_key)), output_dir=str(remote.output_dir), job_dir=str(remote.root),
            num_gpus=int(opts.get("gpus_per_node") or 0), preset_env=frozenset(facts.host.env),
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
        text += "# request: " + json.dumps(request, sort_keys=True) + "\n"
        return Plan(job_id=job_id, attempt=attempt, backend=self.name, nodes=nodes, grace=spec.grace, submission=text)

    def shares_files(self, spec: JobSpec) -> bool:
        return False  # the nodes get a shipped copy of the code (the Ray working_dir)

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
        from ... import config
        from .node import RayJob, RayNode

        spec = JobSpec.from_dict(json.loads(paths.spec.read_text()))
        opts = validate(self.name, self.options, spec.backend_options)
        request = _request(plan)
        try:
            client = connect(opts)
        except UsageError as exc:  # at a retry, the cluster is gone: the attempt cannot start
            raise BackendError(exc.message, exc.hint) from None
        home = HomePaths(config.home())
        sub_id = submission.submission_id(plan.job_id, plan.attempt)
        job = submission.driver_job(plan, request, spec.sample_interval)
        with tempfile.TemporaryDirectory(prefix="phalanx-ray-") as staging:
            try:
                # The snapshot, or the directory a sweep's trials share (or --no-snapshot's workdir).
                code = paths.code_dir if spec.snapshot else Path(spec.workdir)
                submission.stage(Path(staging), code, home.state_dir(spec.state_key), job)
            except UsageError as exc:
                raise BackendError(exc.message, exc.hint) from None
            client.submit(submission.entrypoint(request.get("python")),
                          submission.runtime_env(request, staging, plan.grace), sub_id,
                          {"phalanx_job": plan.job_id, "phalanx_attempt": str(plan.attempt), "phalanx_name": spec.name[:100]})
        write_json(paths.scheduler_job(plan.attempt),
                   {"scheduler": "ray", "job_id": sub_id, "address": client.address, "submitted": time.time()})
        ray_job = RayJob(client, sub_id, paths, plan.attempt, len(plan.nodes), _trees(home, spec, paths))
        return [RayNode(ray_job, node.node_rank) for node in plan.nodes]

    def _attach(self, plan: Plan, paths: JobPaths) -> list[NodeHandle] | None:
        """The attempt's Ray job, while the cluster says it has not ended (the driver runs on the
        cluster, so it outlives a supervisor that dies)."""
        from ... import config
        from .node import RayJob, RayNode

        recorded = read_json(paths.scheduler_job(plan.attempt)) or {}
        if recorded.get("scheduler") != self.name:
            return None
        spec = JobSpec.from_dict(json.loads(paths.spec.read_text()))
        opts = validate(self.name, self.options, spec.backend_options)
        try:
            client = connect({**opts, "address": recorded.get("address") or opts.get("address")})
        except UsageError:
            return None
        sub_id = str(recorded["job_id"])
        if client.status(sub_id)[0] in ("SUCCEEDED", "FAILED", "STOPPED", "GONE"):
            return None
        ray_job = RayJob(client, sub_id, paths, plan.attempt, len(plan.nodes),
                         _trees(HomePaths(config.home()), spec, paths))
        return [RayNode(ray_job, node.node_rank) for node in plan.nodes]


def connect(opts: dict[str, Any]) -> Any:
    from .client import RayClient, find_token, resolve_address

    return RayClient(resolve_address(opts.get("address")), find_token(opts.get("token_file")))


def _request(plan: Plan) -> dict[str, Any]:
    for line in plan.submission.splitlines():
        if line.startswith("# request: "):
            return dict(json.loads(line[len("# request: "):]))
    raise BackendError("the plan has no Ray request", "plan the job again (phalanx resume)")


def _trees(home: HomePaths, spec: JobSpec, paths: JobPaths) -> dict[str, Path]:
    """The local directories the nodes' state and output directories are mirrored into."""
    return {"state": home.state_dir(spec.state_key), "output": paths.output_dir}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())
