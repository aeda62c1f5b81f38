"""The SLURM backend: one batch job per attempt, one node agent per allocated node.

``phalanx run --backend slurm --partition gpu --time 4:00:00 -n 4x8 train.py``. The plan is
the batch script (``backends/slurm/sbatch.py``, what ``--dry-run`` prints) plus each node's
``launch.json``; ``start`` submits the script with ``sbatch`` and returns one handle per node,
all sharing the SLURM job. The job directory is on a filesystem the nodes share with this
machine (``$PHALANX_HOME``), so logs, results and metrics need no copying.

- **status** comes from each node's ``result.json`` and ``squeue`` (``-t all``: no accounting
  database needed), asked at most every ``SlurmQueue.every`` seconds for all jobs of this
  process at once;
- **stop** is ``scancel --signal=TERM`` (the agents give their ranks the grace period), then
  ``scancel --full --signal=KILL``; a job still pending is simply cancelled;
- **preemption**: SLURM's own SIGTERM (a time limit's ``--signal`` lead, a preemption, an
  admin's ``scancel``) reaches the agents as a stop the supervisor did not ask for; the
  supervisor records the attempt as preempted and runs it again while retries remain;
- **queue time** is not run time: a node handle is not ``running()`` while the job is pending,
  requeued or suspended, so ``--stall-timeout`` counts from when the job runs;
- **a lost supervisor** leaves the batch job running (the agents are slurmstepd's children,
  not the supervisor's). Its id stays in the attempt's ``scheduler.json`` (or, when the
  supervisor died before writing it down, squeue finds it by its ``--comment``,
  ``phalanx:JOB:ATTEMPT``); ``attach`` gives
  a new supervisor (``phalanx resume``) handles for it instead of a second submission, and
  ``phalanx stop`` of the LOST job cancels it through the same handles.

Nothing runs here but the supervisor; nothing is killed by name.
"""

from __future__ import annotations

import signal
import time
from typing import Any

from ...core.contracts import NodeResult, SchedulerRecord, read_node_result, read_scheduler, write_scheduler
from ...core.env import Topology
from ...core.paths import HomePaths, JobPaths, safe_name, write_atomic
from ...core.plan import Plan, late_addresses
from ...core.spec import Framework, JobSpec, in_snapshot
from ...errors import BackendError
from ...launch.nodes import RESTART_SAFE_ENV, agent_argv, build_nodes
from .. import commands
from . import sbatch
from ..base import Backend, Facts, NodeHandle, synthesize

# Job states after which nothing of the job runs any more (squeue --states=all).
ENDED = {
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT",
}
GONE = "GONE"  # squeue no longer knows the job (purged after MinJobAge)
# Ends that take the job from outside, as a preemption does: the ranks got SIGTERM first.
TAKEN = {"PREEMPTED", "TIMEOUT", "CANCELLED", "DEADLINE"}
# States in which the job's processes do not run (yet, or for now): queued, nodes booting,
# requeued, suspended or stopped. The stall clock does not count them.
WAITING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED", "STOPPED"}
# Pending reasons that never clear by waiting: the job can never start as asked.
NEVER_STARTS = {"PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints", "InvalidAccount", "InvalidQOS"}


class SlurmBackend(Backend):
    name = "slurm"
    options = sbatch.OPTIONS
    leaves_out = "exclude"  # see Backend.leaves_out
    local_slots = False  # the scheduler places trials of a sweep, not this machine's cores

    def _plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, facts: Facts) -> Plan:
        opts = spec.backend_options
        lead = sbatch.check(opts, spec.grace)
        if spec.secrets:
            sbatch.check_secrets(opts)
        if spec.snapshot:
            spec = in_snapshot(spec, str(paths.code_dir))
        nnodes = spec.resources.nnodes
        addrs = late_addresses(nnodes)  # the allocation decides; each agent fills them in
        nworkers = nnodes * spec.procs_per_node_started
        topo = Topology(
            job_id=job_id,
            attempt=attempt,
            node_addrs=addrs,
            master_port=facts.port(0),
            worker_ports=tuple(facts.port(1 + i) for i in range(nworkers)) if spec.framework is Framework.TF else (),
            state_dir=str(home.state_dir(spec.state_key)),
            output_dir=str(paths.output_dir),
            job_dir=str(paths.root),
            num_gpus=int(opts.get("gpus_per_node") or 0),
            channels=tuple((c.name, str(home.channel_path(c))) for c in spec.channels),
            num_cpus=facts.host.cpus,
            preset_env=frozenset(facts.host.env),
        )
        nodes = build_nodes(spec, topo, paths, addrs, addrs, dict(RESTART_SAFE_ENV))
        script = sbatch.render(sbatch.BatchJob(
            job_id=job_id,
            attempt=attempt,
            name=safe_name(spec.name),
            command=spec.entrypoint.display(),
            nnodes=nnodes,
            cpus_per_task=spec.procs_per_node_started,
            workdir=spec.workdir,
            batch_log=str(paths.batch_log(attempt)),
            agent_log=str(paths.agent_log(attempt, "%n")),
            agent_argv=(*agent_argv(spec.python, paths, attempt, "{node_rank}"), "--node-rank-from", "SLURM_NODEID",
                        "--node-name-from", "SLURMD_NODENAME"),
            options=opts,
            lead=lead,
            exclude=spec.left_out,
        ))
        return Plan(job_id=job_id, attempt=attempt, backend=self.name, nodes=nodes, grace=spec.grace, submission=script)

    def _start(self, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
        script = paths.batch_script(plan.attempt)
        write_atomic(script, plan.submission)
        # Secrets go in sbatch's environment, which SLURM hands to the batch step and srun to every
        # node's agent (sbatch's default --export=ALL); the script file never holds them.
        secrets = self.secret_env(plan.nodes[0]) if plan.nodes else {}
        proc = commands.run(["sbatch", "--parsable", str(script)], env=secrets or None)
        job_id = proc.stdout.strip().split(";")[0]
        if proc.returncode != 0 or not job_id.isdigit():
            said = [line.strip().removeprefix("sbatch: error: ") for line in proc.stderr.splitlines() if line.strip()]
            raise BackendError(
                f"sbatch did not take the job: {'; '.join(said) or f'exit status {proc.returncode}'}",
                f"check the SLURM options (--partition, --account, --time, --sbatch); the script is {script}",
            )
        submitted = time.time()
        write_scheduler(paths.scheduler_job(plan.attempt), SchedulerRecord(self.name, job_id, submitted))
        job = SlurmJob(job_id, paths, plan.attempt, len(plan.nodes), submitted=submitted)
        return [SlurmNode(job, node.node_rank) for node in plan.nodes]

    def _attach(self, plan: Plan, paths: JobPaths) -> list[NodeHandle] | None:
        """The batch job recorded in the attempt's ``scheduler.json`` (or carrying its
        ``--comment``), unless squeue says it has
        ended (the agents run under slurmstepd, so they outlive a supervisor that dies). While
        squeue cannot answer, the job counts as running: watching it is safer than submitting
        a second copy."""
        record = read_scheduler(paths.scheduler_job(plan.attempt))
        job_id = record.job_id if record is not None and record.scheduler == self.name else ""
        if not job_id.isdigit():  # the supervisor died while sbatch ran, or before it wrote down its answer
            job_id = find_submission(plan.job_id, plan.attempt) or ""
            if not job_id:
                return None
            record = SchedulerRecord(self.name, job_id, found_by="comment")
            write_scheduler(paths.scheduler_job(plan.attempt), record)
        if ended(QUEUE.state(job_id)[0]):
            return None
        job = SlurmJob(job_id, paths, plan.attempt, len(plan.nodes), submitted=record.submitted if record else None)
        return [SlurmNode(job, node.node_rank) for node in plan.nodes]


def find_submission(job_id: str, attempt: int) -> str | None:
    """The SLURM job that carries this attempt's ``--comment``, from this user's queue; None
    when there is none, or squeue cannot tell."""
    import getpass

    tag = sbatch.submission_tag(job_id, attempt)
    proc = commands.run(["squeue", "--noheader", "--states=all", f"--user={getpass.getuser()}", "--format=%i|%k"])
    found = [line.split("|", 1)[0].strip() for line in proc.stdout.splitlines() if line.strip().endswith("|" + tag)]
    found = [i for i in found if i.isdigit()]
    return max(found, key=int) if proc.returncode == 0 and found else None


class SlurmQueue:
    """The states of this process's SLURM jobs: one ``squeue`` for all of them, at most once
    every ``every`` seconds (a sweep may watch many jobs; slurmctld should not notice)."""

    every = 2.0

    def __init__(self) -> None:
        self.states: dict[str, tuple[str, str]] = {}  # job id -> (state, pending reason)
        self.watched: set[str] = set()
        self.asked_at = float("-inf")

    def state(self, job_id: str) -> tuple[str, str]:
        """(state, reason); ``UNKNOWN`` while squeue cannot answer, ``GONE`` once it forgot the job."""
        known = self.states.get(job_id)
        if known is not None and ended(known[0]):
            return known  # final: no need to ask again
        if job_id not in self.watched or time.monotonic() - self.asked_at >= self.every:
            self.watch(job_id)
            self.refresh()
        return self.states.get(job_id, ("UNKNOWN", ""))

    def watch(self, job_id: str) -> None:
        """Include ``job_id`` in every ``squeue`` from now until it has ended."""
        self.watched.add(job_id)

    def refresh(self) -> None:
        self.asked_at = time.monotonic()
        ids = sorted(self.watched, key=int)
        if not ids:
            return
        proc = commands.run(["squeue", "--noheader", "--states=all", f"--jobs={','.join(ids)}", "--format=%i|%T|%r"])
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:  # squeue says so only when it knows none of them
                self.states.update({i: (GONE, "") for i in ids})
            # else slurmctld is busy or away: keep what we knew, ask again later
        else:
            seen = {}
            for line in proc.stdout.splitlines():
                parts = line.strip().split("|")
                if len(parts) == 3 and parts[1]:
                    seen[parts[0]] = (parts[1].split()[0], parts[2])
            self.states.update({i: seen.get(i, (GONE, "")) for i in ids})
        self.watched -= {i for i in ids if ended(self.states.get(i, ("UNKNOWN", ""))[0])}


def ended(state: str) -> bool:
    return state in ENDED or state == GONE


QUEUE = SlurmQueue()


class SlurmJob:
    """One attempt's batch job, shared by its node handles."""

    # Seconds the batch job may outlive the last node's report (srun and the batch shell exit
    # right after); then it is cancelled, so a finished job leaves nothing behind.
    linger = 30.0

    def __init__(self, job_id: str, paths: JobPaths, attempt: int, nnodes: int, queue: SlurmQueue | None = None,
                 submitted: float | None = None) -> None:
        self.job_id = job_id
        self.submitted = submitted
        self.paths = paths
        self.attempt = attempt
        self.nnodes = nnodes
        self.queue = queue or QUEUE
        self.queue.watch(job_id)
        self.results: dict[int, NodeResult] = {}
        self.signalled: int | None = None
        self.killed = False
        self.unstartable: str | None = None  # why SLURM can never start the job as asked
        self._all_reported_at: float | None = None

    def poll(self, node_rank: int) -> NodeResult | None:
        """The node's result.json, or None while it runs. Once every node has reported, all
        count as running until the batch job itself has ended."""
        result = self._result(node_rank)
        if result is not None:
            if len(self.results) < self.nnodes or self._ended():
                return result
            # Every node reported: the job itself ends a moment later; wait for that.
            self._all_reported_at = self._all_reported_at or time.monotonic()
            if time.monotonic() - self._all_reported_at > self.linger:
                self.kill()
                return result
            return None
        state, reason = self.queue.state(self.job_id)
        if state == "PENDING" and reason in NEVER_STARTS and self.unstartable is None:
            self.unstartable = reason
            self._note(f"SLURM job {self.job_id} can never start as asked ({reason}); phalanx cancelled it")
            self.kill()
            return None
        if not ended(state):
            return None
        return self._result(node_rank) or self._report_for(node_rank, state)

    def _ended(self) -> bool:
        return ended(self.queue.state(self.job_id)[0])

    def running(self) -> bool:
        """False while SLURM keeps the job from running (``WAITING``: queued, held, requeued,
        suspended); True once it runs, and when squeue cannot tell."""
        return self.queue.state(self.job_id)[0] not in WAITING

    def _result(self, node_rank: int) -> NodeResult | None:
        if node_rank not in self.results:
            result = read_node_result(self.paths.node_result(self.attempt, node_rank))
            if result is None:
                return None
            self.results[node_rank] = result
        return self.results[node_rank]

    def _report_for(self, node_rank: int, state: str) -> NodeResult:
        """The job ended without this node's agent reporting (never started, killed, node lost):
        write its result.json in the agent's place, and say why in its agent.log."""
        stopped_by = None
        if self.unstartable is not None:
            code = 1  # a failure to fix, not a preemption to wait out
        elif self.killed:
            code, stopped_by = 128 + signal.SIGKILL, "SIGKILL"
        elif self.signalled is not None:
            code, stopped_by = 128 + self.signalled, signal.Signals(self.signalled).name
        elif state in TAKEN:
            code, stopped_by = 128 + signal.SIGTERM, "SIGTERM"
        else:
            code = self._exit_code() or 1
        message = f"SLURM job {self.job_id} ended {state} before node agent {node_rank} reported"
        self._note(f"{message}; the batch script's output: {self.paths.batch_log(self.attempt)}", [node_rank])
        result = synthesize(self.paths, self.attempt, NodeResult.synthesize(
            node_rank, code, message, stopped_by=stopped_by, slurm_job=self.job_id, slurm_state=state))
        self.results[node_rank] = result
        return result

    def _exit_code(self) -> int | None:
        """The batch job's exit code (``ExitCode=code:signal``), while scontrol still knows it."""
        proc = commands.run(["scontrol", "show", "job", "--oneliner", self.job_id])
        for word in proc.stdout.split():
            if word.startswith("ExitCode="):
                code, _, sig = word[len("ExitCode="):].partition(":")
                if sig.isdigit() and int(sig):
                    return 128 + int(sig)
                return int(code) if code.isdigit() else None
        return None

    def _note(self, text: str, node_ranks: list[int] | None = None) -> None:
        tail = _tail_lines(self.paths.batch_log(self.attempt), 10)
        for node_rank in range(self.nnodes) if node_ranks is None else node_ranks:
            log = self.paths.agent_log(self.attempt, node_rank)
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a") as fh:
                fh.write("".join(f"batch.log: {line}\n" for line in tail) + f"phalanx: {text}\n")

    def signal(self, signum: int) -> None:
        """Once per job (every node handle forwards the same stop): the agents get ``signum``
        and run their grace period; a job that has not started yet is just cancelled."""
        if self.signalled is not None or self.killed:
            return
        self.signalled = signum
        sent = commands.run(["scancel", f"--signal={signal.Signals(signum).name[3:]}", self.job_id])
        if sent.returncode != 0:  # SLURM signals only running jobs
            self.queue.refresh()
            if self.queue.state(self.job_id)[0] in ("PENDING", "REQUEUED", "SUSPENDED"):
                commands.run(["scancel", self.job_id])

    def kill(self) -> None:
        """SIGKILL to the batch shell and every step, then cancel the job. Idempotent."""
        if self.killed:
            return
        self.killed = True
        commands.run(["scancel", "--full", "--signal=KILL", self.job_id])
        commands.run(["scancel", self.job_id])


class SlurmNode(NodeHandle):
    """One node of a SLURM job, as the supervisor sees it."""

    kill_margin = 10.0  # scancel round trips and slurmstepd's own clean-up

    def __init__(self, job: SlurmJob, node_rank: int) -> None:
        self.job = job
        self.node_rank = node_rank
        self.where = f"SLURM job {job.job_id}"
        self.submitted = job.submitted

    def poll(self) -> NodeResult | None:
        return self.job.poll(self.node_rank)

    def signal(self, signum: int) -> None:
        self.job.signal(signum)

    def kill(self) -> None:
        self.job.kill()

    def running(self) -> bool:
        return self.job.running()


def _tail_lines(path: Any, count: int) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 4096))
            return fh.read().decode(errors="replace").splitlines()[-count:]
    except OSError:
        return []
