"""The SLURM backend against a stateful fake of sbatch/squeue/scancel/scontrol (fake_slurm.py):
submission, status, stop, jobs that end without their agents, preemption and requeue, queue
time and the stall clock, jobs whose supervisor vanished."""

import json
import signal
import time
from pathlib import Path

import pytest

from phalanx.api import jobs, query
from phalanx.backends import commands
from phalanx.backends.slurm import backend as slurm
from phalanx.backends.registry import get_backend
from phalanx.core.paths import HomePaths, JobPaths, read_json, write_json
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources
from phalanx.core.state import JobState
from phalanx.errors import BackendError
from phalanx.monitor.readback import read_metrics
from phalanx.supervise.attempt import write_launch_files
from phalanx.supervise.job import JobRun
from phalanx.supervise.leftover import resume_plan
from phalanx.supervise.submit import create_job

from .fake_slurm import FakeSlurm

SPEC = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/work/train.py"), Resources(2, 1), name="t", backend="slurm",
               python="python3", workdir="/work")


@pytest.fixture
def fake(monkeypatch):
    fake = FakeSlurm()
    monkeypatch.setattr(commands, "run", fake)
    queue = slurm.SlurmQueue()
    queue.every = 0.0
    monkeypatch.setattr(slurm, "QUEUE", queue)
    return fake


@pytest.fixture
def started(fake, tmp_path):
    """A submitted 2-node job: (fake, its FakeJob, the handles, the job's paths)."""
    backend = get_backend("slurm")
    paths = JobPaths(tmp_path / "jobs" / "j1")
    plan = backend.plan(SPEC, "j1", 0, HomePaths(tmp_path), backend.facts(SPEC))
    write_launch_files(plan, paths)
    handles = backend.start(plan, paths)
    return fake, fake.jobs["41"], handles, paths


def _code(result):
    """What a node handle's poll says, as an exit code (None while the node runs)."""
    return None if result is None else result.exitcode


def _report(paths: JobPaths, node_rank: int, code: int, **extra) -> None:
    write_json(paths.node_result(0, node_rank), {"node_rank": node_rank, "exitcode": code, "failures": [], **extra})


def test_start_submits_the_planned_script(started):
    fake, job, handles, paths = started
    assert fake.calls_to("sbatch") == [["sbatch", "--parsable", str(paths.batch_script(0))]]
    assert job.script == paths.batch_script(0).read_text() and "#SBATCH --nodes=2" in job.script
    assert read_json(paths.scheduler_job(0))["job_id"] == "41"
    assert [h.node_rank for h in handles] == [0, 1] and handles[0].job is handles[1].job


def test_status_follows_the_nodes_then_the_job(started):
    fake, job, handles, paths = started
    assert [_code(h.poll()) for h in handles] == [None, None]  # pending
    job.state = "RUNNING"
    _report(paths, 1, 1)
    assert [_code(h.poll()) for h in handles] == [None, 1]  # a failed node shows at once: fail fast
    _report(paths, 0, 143)
    assert [_code(h.poll()) for h in handles] == [None, None]  # all reported; the job is still ending
    job.state = "COMPLETED"
    assert [_code(h.poll()) for h in handles] == [143, 1]


def test_one_squeue_answers_for_every_job(fake, tmp_path):
    backend = get_backend("slurm")
    handles = []
    for job_id in ("a", "b"):
        paths = JobPaths(tmp_path / job_id)
        plan = backend.plan(SPEC, job_id, 0, HomePaths(tmp_path), backend.facts(SPEC))
        write_launch_files(plan, paths)
        handles += backend.start(plan, paths)
    fake.calls.clear()
    slurm.QUEUE.every = 60.0
    slurm.QUEUE.refresh()
    assert [_code(h.poll()) for h in handles] == [None] * 4
    assert fake.calls == [["squeue", "--noheader", "--states=all", "--jobs=41,42", "--format=%i|%T|%r"]]


def test_stop_signals_once_then_kills(started):
    fake, job, handles, paths = started
    job.state = "RUNNING"
    for h in handles:
        h.signal(signal.SIGTERM)
    assert job.signals == ["TERM"] and job.state == "RUNNING"  # the agents run their grace period
    for h in handles:
        h.kill()
    assert fake.calls_to("scancel") == [["scancel", "--signal=TERM", "41"], ["scancel", "--full", "--signal=KILL", "41"],
                                        ["scancel", "41"]]
    assert job.state == "CANCELLED"
    assert [_code(h.poll()) for h in handles] == [137, 137]
    result = read_json(paths.node_result(0, 1))
    assert result["stopped_by"] == "SIGKILL" and result["slurm_state"] == "CANCELLED"


def test_stopping_a_pending_job_cancels_it(started):
    fake, job, handles, paths = started
    handles[0].signal(signal.SIGTERM)
    assert job.state == "CANCELLED" and job.signals == []
    assert [_code(h.poll()) for h in handles] == [143, 143]


def test_a_job_that_ends_without_its_agents_says_why(started):
    fake, job, handles, paths = started
    paths.batch_log(0).write_text("srun: error: Unable to create step for job 41: Invalid generic resource\n")
    job.state, job.exit_code = "FAILED", "1:0"
    assert [_code(h.poll()) for h in handles] == [1, 1]
    log = paths.agent_log(0, 0).read_text()
    assert "batch.log: srun: error: Unable to create step" in log
    assert "SLURM job 41 ended FAILED before node agent 0 reported" in log
    assert "stopped_by" not in read_json(paths.node_result(0, 0))


def test_a_job_that_can_never_start_is_cancelled(started):
    fake, job, handles, paths = started
    job.reason = "PartitionNodeLimit"
    assert _code(handles[0].poll()) is None
    assert job.state == "CANCELLED"
    assert "can never start as asked (PartitionNodeLimit)" in paths.agent_log(0, 1).read_text()
    assert [_code(h.poll()) for h in handles] == [1, 1]
    assert "stopped_by" not in read_json(paths.node_result(0, 0)), "not a preemption: retrying cannot help"


def test_refused_submission_is_a_backend_error(fake, tmp_path):
    fake.refuse = "invalid partition specified: gpu"
    backend = get_backend("slurm")
    plan = backend.plan(SPEC, "j1", 0, HomePaths(tmp_path), backend.facts(SPEC))
    with pytest.raises(BackendError, match="sbatch did not take the job: .*Invalid partition name specified"):
        backend.start(plan, JobPaths(tmp_path / "jobs" / "j1"))


# -- through the supervisor ---------------------------------------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PHALANX_HOME", str(tmp_path / "phx"))
    return HomePaths(tmp_path / "phx")


def _agents(fake: FakeSlurm, home: HomePaths, outcomes: list[tuple[int, dict]]):
    """Each submission plays one attempt: both node agents report ``outcomes[attempt]``."""

    def play(job):
        attempt = len(fake.jobs) - 1
        code, extra = outcomes[attempt]
        paths = next(JobPaths(p) for p in home.jobs.iterdir())
        for node in (0, 1):
            write_json(paths.node_result(attempt, node), {"node_rank": node, "exitcode": code, "failures": [], **extra})
        job.state = "COMPLETED" if code == 0 else "FAILED"

    fake.on_submit = play


def test_slurm_preemption_is_requeued_while_retries_remain(fake, home):
    _agents(fake, home, [(143, {"stopped_by": "SIGTERM"}), (0, {})])
    record, code = jobs.run(SPEC.with_(max_retries=1))
    assert code == 0 and record.state is JobState.SUCCEEDED and record.attempt == 1
    attempts = [json.loads(line) for line in Path(record.job_dir, "attempts.jsonl").read_text().splitlines()]
    assert [(a["outcome"], a["retry"], a["reason"]) for a in attempts] == [
        ("preempted", True, "preempted; requeued"), ("succeeded", False, "succeeded")]
    assert len(fake.calls_to("sbatch")) == 2


def test_slurm_preemption_without_retries_is_resumable(fake, home):
    _agents(fake, home, [(143, {"stopped_by": "SIGTERM"})])
    record, code = jobs.run(SPEC)
    assert code == 143 and record.state is JobState.PREEMPTED
    assert "phalanx resume" in record.root_cause_dict()["message"]


def test_refused_submission_fails_the_job_with_the_reason(fake, home):
    fake.refuse = "invalid partition specified: gpu"
    record, code = jobs.run(SPEC)
    assert code == 1 and record.state is JobState.FAILED
    assert "sbatch did not take the job" in record.root_cause_dict()["message"]


def _first_node_then_the_rest(fake: FakeSlurm, home: HomePaths, first: dict):
    """Node 0 ends with ``first`` while node 1 runs on until phalanx stops it (fail fast)."""

    def paths():
        return next(JobPaths(p) for p in home.jobs.iterdir())

    def submit(job):
        write_json(paths().node_result(0, 0), {"node_rank": 0, **first})
        job.state = "RUNNING"

    def stopped(job, sig):
        write_json(paths().node_result(0, 1), {"node_rank": 1, "exitcode": 143, "failures": [], "stopped_by": "SIGTERM"})
        job.state = "FAILED"

    fake.on_submit, fake.on_signal = submit, stopped


def test_a_node_taken_first_makes_the_attempt_preempted(fake, home):
    _first_node_then_the_rest(fake, home, {"exitcode": 143, "failures": [], "stopped_by": "SIGTERM"})
    record, code = jobs.run(SPEC)
    assert record.state is JobState.PREEMPTED and code == 143
    assert fake.jobs["41"].signals == ["TERM"]  # fail fast reached the other node


def test_a_crash_stays_a_failure_though_phalanx_stopped_the_rest(fake, home):
    crash = {"exitcode": 1, "failures": [{"rank": 0, "exitcode": 1, "timestamp": 1.0}]}
    _first_node_then_the_rest(fake, home, crash)
    record, code = jobs.run(SPEC)
    assert record.state is JobState.FAILED and code == 1
    assert record.root_cause_dict()["rank"] == 0


def test_the_agent_finds_its_part_by_the_schedulers_node_rank(tmp_path, monkeypatch, fake):
    from phalanx.launch import agent

    backend = get_backend("slurm")
    paths = JobPaths(tmp_path / "jobs" / "j1")
    plan = backend.plan(SPEC, "j1", 0, HomePaths(tmp_path), backend.facts(SPEC))
    write_launch_files(plan, paths)
    template = str(paths.node_launch(0, "{node_rank}"))
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("PHALANX_NODE_ADDRS", "10.1.0.7,10.1.0.8")
    node, data = agent._load(template, "SLURM_NODEID")
    assert node.node_rank == 1 and data.attempt == 0
    assert "--local-addr=10.1.0.8" in node.torchrun_argv and "--rdzv-endpoint=10.1.0.7:" in " ".join(node.torchrun_argv)
    monkeypatch.setenv("PHALANX_NODE_ADDRS", "")
    with pytest.raises(SystemExit) as exc:
        agent._load(template, "SLURM_NODEID")
    assert exc.value.code == 2


def test_every_slurm_option_is_a_flag_and_documented():
    from typer.testing import CliRunner

    from phalanx.backends.slurm.sbatch import OPTIONS
    from phalanx.cli.main import app

    page = (Path(__file__).resolve().parents[2] / "docs" / "slurm.md").read_text()
    helptext = CliRunner().invoke(app, ["run", "--help-all"], terminal_width=200).output
    for option in OPTIONS:
        assert option.flag in helptext and option.help.split(" (")[0][:30] in " ".join(helptext.split())
        assert f"`{option.flag}" in page, f"document {option.flag} in docs/slurm.md"


# -- queue time and lost supervisors --------------------------------------------------------


@pytest.mark.parametrize("state, running", [
    ("PENDING", False), ("CONFIGURING", False), ("REQUEUED", False), ("SUSPENDED", False),
    ("RUNNING", True), ("COMPLETING", True),
])
def test_a_node_runs_only_while_slurm_runs_the_job(started, state, running):
    fake, job, handles, paths = started
    job.state = state
    assert [h.running() for h in handles] == [running, running]


def test_the_stall_clock_starts_when_slurm_runs_the_job(fake, home):
    """Queue time is not silence: pending longer than --stall-timeout, the job is not stalled;
    once it runs and its ranks print nothing for that long, it is."""
    submitted: dict[str, float] = {}

    def submit(job):
        submitted[job.id] = time.monotonic()

    def queue(job):
        if job.state == "PENDING" and time.monotonic() - submitted[job.id] > 2.5:
            job.state = "RUNNING"

    def stopped(job, sig):
        paths = next(JobPaths(p) for p in home.jobs.iterdir())
        for node in (0, 1):
            _report(paths, node, 143, stopped_by="SIGTERM")
        job.state = "FAILED"

    fake.on_submit, fake.on_squeue, fake.on_signal = submit, queue, stopped
    began = time.monotonic()
    record, code = jobs.run(SPEC.with_(stall_timeout=1.5))
    assert record.state is JobState.FAILED and code == 124
    assert "--stall-timeout" in record.root_cause_dict()["message"]
    assert fake.jobs["41"].signals == ["TERM"], "stopped while it ran, not cancelled in the queue"
    assert time.monotonic() - began >= 2.5 + 1.5


def _lost(fake: FakeSlurm, home: HomePaths, state: str = "RUNNING"):
    """A job whose supervisor submitted attempt 0 (SLURM job 41), then vanished: LOST."""
    store = jobs.open_store()
    plan = jobs.plan_job(SPEC)
    record = create_job(store, jobs.home(), SPEC, plan)
    JobRun(store, home, record, plan).start()
    fake.jobs["41"].state = state
    assert store.transition(record.id, JobState.LOST)
    return store, store.get(record.id), fake.jobs["41"]


def test_resume_watches_the_attempt_a_lost_supervisor_left_running(fake, home):
    store, record, job = _lost(fake, home)
    paths = JobPaths(Path(record.job_dir))
    paths.rank_log(0, 0).parent.mkdir(parents=True)
    paths.rank_log(0, 0).write_text("step=1 loss=0.5\nstep=2 loss=0.25\n")
    # what the vanished supervisor had collected (an older phalanx: JSON lines), and a torn block of ours
    paths.rank_metrics_jsonl(0, 0).write_text('{"name":"loss","value":0.5,"step":1,"rank":0,"attempt":0,"time":1.0}\n')
    paths.rank_metrics(0, 0).write_bytes(b"PXM1 torn")
    resumed = time.monotonic()

    def ends_later(job):
        if time.monotonic() - resumed > 1.0 and job.state == "RUNNING":
            for node in (0, 1):
                _report(paths, node, 0)
            job.state = "COMPLETED"

    fake.on_squeue = ends_later
    said: list[str] = []
    record, code = jobs.resume(record.id, events=said.append)
    assert code == 0 and record.state is JobState.SUCCEEDED and record.attempt == 0
    assert len(fake.calls_to("sbatch")) == 1, "no second copy of a job that still runs"
    assert any("attempt 0 still runs as SLURM job 41" in line for line in said), said
    assert [(a["attempt"], a["outcome"]) for a in query.attempt_history(record)] == [(0, "succeeded")]
    assert not paths.attempt(1).exists()
    metrics = read_metrics(paths, 0, 0)
    assert not paths.rank_metrics_jsonl(0, 0).exists()
    assert [(m["name"], m["step"]) for m in metrics] == [("loss", 1), ("loss", 2)], "read again, not repeated"


@pytest.mark.parametrize("state, signals, recorded", [("RUNNING", ["TERM"], True), ("PENDING", [], True),
                                                     ("RUNNING", ["TERM"], False)])
def test_stop_of_a_lost_job_stops_what_slurm_still_runs(fake, home, state, signals, recorded):
    store, record, job = _lost(fake, home, state)
    paths = JobPaths(Path(record.job_dir))
    if not recorded:  # the supervisor died before it wrote down sbatch's answer: squeue finds it by --comment
        paths.scheduler_job(0).unlink()

    def stopped(job, sig):
        for node in (0, 1):
            _report(paths, node, 143, stopped_by="SIGTERM")
        job.state = "FAILED"

    fake.on_signal = stopped
    said: list[str] = []
    after = jobs.stop(record.id, events=said.append)
    assert after.state is JobState.LOST and job.signals == signals and job.state in ("FAILED", "CANCELLED")
    assert "phalanx stop stopped SLURM job 41 (attempt 0)" in after.root_cause_dict()["message"]
    assert any("still runs; stopping it" in line for line in said), said
    assert [(a["attempt"], a["outcome"]) for a in query.attempt_history(after)] == [(0, "cancelled")]
    scancels = len(fake.calls_to("scancel"))
    assert jobs.stop(record.id).state is JobState.LOST  # idempotent
    assert len(fake.calls_to("scancel")) == scancels

    def succeeds(job):
        for node in (0, 1):
            write_json(paths.node_result(1, node), {"node_rank": node, "exitcode": 0, "failures": []})
        job.state = "COMPLETED"

    fake.on_submit = succeeds  # nothing of attempt 0 runs any more: resume starts attempt 1
    record, code = jobs.resume(record.id)
    assert code == 0 and record.attempt == 1 and len(fake.calls_to("sbatch")) == 2


def test_an_attempt_that_ended_meanwhile_is_not_started_again(fake, home):
    store, record, job = _lost(fake, home)
    plan = resume_plan(record, HomePaths(home.root))
    assert plan.attempt == 0  # still running when resume looked...
    job.state = "COMPLETED"  # ...and over when the new supervisor does
    assert store.reopen(record.id, plan.attempt)
    run = JobRun(store, home, store.get(record.id), plan)
    run.start()
    assert run.plan.attempt == 1 and store.get(record.id).attempt == 1
    assert len(fake.calls_to("sbatch")) == 2 and read_json(JobPaths(Path(record.job_dir)).scheduler_job(0))["job_id"] == "41"
