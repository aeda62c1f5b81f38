"""The SkyPilot backend: cloud VMs of any provider, provisioned by SkyPilot's SDK.

``phalanx run --backend skypilot --gpus H100:8 -n 2x8 --spot train.py``. A thin adapter; the
translation is ``task`` (pure, golden-tested), the node side ``entry``. SkyPilot (the optional
``skypilot`` extra) is imported only when a job starts. Its SDK is asynchronous: every call gives
a request id that ``sky.get`` (or ``sky.stream_and_get``) waits for; that waiting happens in a
thread of the handle, never in ``poll``.

- ``sky.launch(task, cluster_name=phx-JOB-aN, down=True)``: a cluster of ``num_nodes`` VMs for the
  attempt, torn down after it (``--cluster NAME``: that cluster, reused and kept, ``down=False``);
  phalanx's ``--max-retries`` retries a failed or preempted attempt;
- ``--managed``: ``sky.jobs.launch``; SkyPilot's managed-job recovery restarts preempted jobs,
  so phalanx does not retry (``--max-retries`` must be 0);
- stop: ``sky.cancel`` / ``sky.jobs.cancel``, then ``sky.down`` (not of a cluster the user named); the output of the job (all nodes,
  as ``sky logs`` shows it) is kept in node 0's ``agent.log``.

The plan is pure: the task (``Plan.submission`` as YAML, ``Plan.context`` as data) names the
attempt's staging directory (``JobPaths.skypilot_workdir``), which ``start`` fills.
"""

from __future__ import annotations

import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from ...core.contracts import LaunchFile, NodeResult, SchedulerRecord, read_launch, read_scheduler, write_scheduler
from ...core.paths import HomePaths, JobPaths, write_json
from ...core.plan import Plan
from ...core.spec import JobSpec
from ...launch.host import HostFacts
from ..base import Backend, Facts, NodeHandle, synthesize
from . import client
from .options import OPTIONS
from .task import WORKDIR, cluster_name, nodes, task_config


class SkyPilotBackend(Backend):
    name = "skypilot"
    leaves_out = "new"  # see Backend.leaves_out
    options = OPTIONS
    local_slots = False

    def shares_files(self, spec: JobSpec) -> bool:
        return False  # the VMs run the copy SkyPilot syncs to ~/sky_workdir

    def _facts(self, spec: JobSpec, host: HostFacts) -> Facts:
        """Nothing to look up: SkyPilot provisions the VMs (their addresses reach the nodes as
        SKYPILOT_NODE_IPS) and the rendezvous port follows from the job id."""
        return Facts(host)

    def _plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, facts: Facts) -> Plan:
        import yaml

        opts = dict(spec.backend_options)
        config = task_config(spec, job_id, attempt, str(paths.skypilot_workdir(attempt)), opts)
        context = {
            "task": config, "managed": bool(opts.get("managed")), "cluster": opts.get("cluster"),
            # What the VMs run: the job's snapshot, a sweep's shared one, or (--no-snapshot) the workdir.
            "code": spec.code_dir or (str(paths.code_dir) if spec.snapshot else spec.workdir),
        }
        return Plan(job_id=job_id, attempt=attempt, backend=self.name, nodes=nodes(spec, job_id, attempt), grace=spec.grace,
                    submission="# SkyPilot task (sky.Task.from_yaml_config)\n" + yaml.safe_dump(config, sort_keys=True),
                    context=context)

    def avoids(self, spec: JobSpec) -> str:
        # --cluster NAME: every attempt runs on the user's cluster, the same machines again
        return "" if spec.backend_options.get("cluster") else self.leaves_out

    def check(self, spec: JobSpec) -> None:
        """Before the job is recorded: SkyPilot itself reads the task, and a dry run of the launch
        (``client.preflight``) finds an enabled cloud offering the resources. Creates nothing."""
        facts = self.facts(spec)
        plan = self.plan(spec, "check", 0, HomePaths(facts.host.home or Path(".phalanx")), facts)  # the pure checks first
        client.preflight(dict(plan.context["task"]), cluster_name("check", 0, spec.backend_options))

    def _start(self, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
        launch = read_launch(paths.node_launch(plan.attempt, plan.nodes[0].node_rank))
        stage(plan, paths, Path(plan.context["code"]), launch.sample_interval if launch else 5.0)
        run = SkyRun(dict(plan.context["task"]), plan.context, paths, plan, secrets=self.secret_env(plan.nodes[0]))
        return [SkyNode(run, node.node_rank) for node in plan.nodes]

    def _attach(self, plan: Plan, paths: JobPaths) -> list[NodeHandle] | None:
        """A job launched by a supervisor that has vanished and still running on SkyPilot (asked
        once: ``client.running``): followed again, not launched again."""
        record = read_scheduler(paths.scheduler_job(plan.attempt))
        if record is None or record.scheduler != self.name or not record.job_id.isdigit():
            return None
        sky = client.sdk()
        cluster = cluster_name(plan.job_id, plan.attempt, plan.context)
        if not client.running(sky, cluster, int(record.job_id), bool(plan.context.get("managed"))):
            return None
        run = SkyRun(dict(plan.context["task"]), plan.context, paths, plan, attached=int(record.job_id))
        return [SkyNode(run, node.node_rank) for node in plan.nodes]


def stage(plan: Plan, paths: JobPaths, code_dir: Path, sample_interval: float) -> Path:
    """The workdir: the bundle (code/, lib/) unpacked, and ``launch.json`` with every node's
    launch file (``contracts.LaunchFile``; ``entry`` takes its own and fills in the addresses)."""
    from ...storage.bundle import build, code_files, unpack

    dest = paths.skypilot_workdir(plan.attempt)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="phalanx-sky-") as tmp:
        unpack(build(code_files(code_dir), Path(tmp) / "bundle.tar.gz").path, dest)
    launches = [LaunchFile(node, f"{WORKDIR}/job", plan.attempt, plan.grace, sample_interval).to_dict() for node in plan.nodes]
    write_json(dest / "launch.json", {"nodes": launches})
    return dest


class SkyRun:
    """One attempt on SkyPilot, driven from a thread: launch, follow, report (SDK calls: ``client``)."""

    def __init__(self, config: dict[str, Any], opts: Mapping[str, Any], paths: JobPaths, plan: Plan, attached: int | None = None,
                 secrets: dict[str, str] | None = None) -> None:
        self.config, self.opts, self.paths, self.plan = config, opts, paths, plan
        self.secrets = secrets or {}  # values, for SkyPilot's task secrets only (client.with_secrets)
        self.managed = bool(opts.get("managed"))
        self.cluster = cluster_name(plan.job_id, plan.attempt, opts)
        self.down = not opts.get("cluster")  # a cluster the user named is theirs: used, never torn down
        self.launching: Any = None  # the launch request while it provisions (cancelled by a stop)
        self.job_id: int | None = attached  # a job launched earlier (attach): followed, not launched again
        self.code: int | None = None
        self.ended = "not ended"  # SkyPilot's word for the end (JobExitCode name), for the result
        self.stopped_by: str | None = None
        self.sky = client.sdk()  # fails now, in start, when the extra is missing
        threading.Thread(target=self._run, daemon=True, name=f"phalanx-sky-{self.cluster}").start()

    def _log(self) -> Any:
        path = self.paths.agent_log(self.plan.attempt, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        return client.Plain(open(path, "a"))

    def _run(self) -> None:
        sky = self.sky
        try:
            task = client.with_secrets(client.load_task(sky, self.config), self.secrets)
            with self._log() as log:
                if self.job_id is None:
                    self.launching = client.start_launch(sky, task, self.cluster, self.managed, down=self.down)
                    if self.stopped_by:  # a stop that came before the request existed: cancel it now
                        self._cancel()
                    self.job_id = client.wait_launch(sky, self.launching, self.managed, log)
                    self.launching = None
                    self._record(**({"managed": True} if self.managed else {"cluster": self.cluster}))
                else:
                    log.write(f"phalanx: following SkyPilot job {self.job_id} ({self.cluster}) again; its output follows from the start\n")
                code = client.tail(sky, self.cluster, self.job_id, self.managed, log)
                self.ended, ok = client.outcome(sky, code)
                log.write(f"phalanx: SkyPilot job {self.job_id} ({self.cluster}) ended: {self.ended}\n")
            # SkyPilot says how the job ended, not the script's exit code (that is in the log above).
            self.code = 0 if ok else (128 + signal.SIGTERM if self.stopped_by else 1)
        except Exception as exc:  # noqa: BLE001 - whatever SkyPilot raised is the node's end, said in its log
            self.ended = f"{type(exc).__name__}: {client.one_line(exc)}"
            with self._log() as log:
                log.write(f"phalanx: SkyPilot: {self.ended}\n")
            self.code = 128 + signal.SIGTERM if self.stopped_by else 1

    def _record(self, **fields: Any) -> None:
        write_scheduler(self.paths.scheduler_job(self.plan.attempt),
                        SchedulerRecord("skypilot", str(self.job_id), time.time(), details=fields))

    def result(self, node_rank: int) -> NodeResult | None:
        """The node's end once SkyPilot's job has ended: its own report (SkyPilot does not bring
        the VMs' files back, so one is written here in its place)."""
        if self.code is None:
            return None
        return synthesize(self.paths, self.plan.attempt, NodeResult.synthesize(
            node_rank, self.code, f"SkyPilot job {self.job_id} ({self.cluster}) ended: {self.ended}",
            stopped_by=self.stopped_by, skypilot_job=self.job_id))

    def stop(self, signum: int) -> None:
        if self.stopped_by is None:
            self.stopped_by = signal.Signals(signum).name
            threading.Thread(target=self._cancel, daemon=True).start()

    def _cancel(self) -> None:
        try:
            client.stop(self.sky, self.cluster, self.job_id, self.managed, launching=self.launching, down=self.down)
        except Exception as exc:  # noqa: BLE001
            with self._log() as log:
                log.write(f"phalanx: cancelling on SkyPilot failed: {client.one_line(exc)}; check `sky status` / `sky jobs queue`\n")


class SkyNode(NodeHandle):
    kill_margin = 120.0  # cancelling and tearing down VMs takes a while

    def __init__(self, run: SkyRun, node_rank: int) -> None:
        self.run = run
        self.node_rank = node_rank

    def poll(self) -> NodeResult | None:
        return self.run.result(self.node_rank)

    def signal(self, signum: int) -> None:
        self.run.stop(signum)

    def kill(self) -> None:
        self.run.stop(signal.SIGKILL)

