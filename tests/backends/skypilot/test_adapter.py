"""The SkyPilot adapter against a FAKE ``sky`` module, for the one path the real library cannot go
here: a launch that succeeds (it needs a cloud). Everything the real skypilot 0.14.1 can do offline
(task parsing, the SDK's signatures and errors against a real local API server, the dry run) is
tested against the real library in test_real_skypilot.py. The fake keeps to the shapes that file
checks (sky/client/sdk.py, sky/jobs/client/sdk.py): calls return request ids, ``get`` /
``stream_and_get`` resolve them, ``launch`` gives (job id, handle), ``jobs.launch`` (job ids,
handle), ``tail_logs`` blocks until the job ends and returns a ``JobExitCode`` (0, 100 failed,
103 cancelled), not the script's exit code. It proves what phalanx asks SkyPilot for, not what
SkyPilot does."""

import enum
import json
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from phalanx.backends.registry import get_backend
from phalanx.core.contracts import LaunchFile
from phalanx.core.paths import HomePaths, JobPaths, write_json
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources


class JobExitCode(enum.IntEnum):  # sky.exceptions.JobExitCode in 0.14.1 (test_real_skypilot checks the values)
    SUCCEEDED = 0
    FAILED = 100
    NOT_FINISHED = 101
    NOT_FOUND = 102
    CANCELLED = 103


class FakeSky(types.ModuleType):
    def __init__(self, exit_code=JobExitCode.SUCCEEDED):
        super().__init__("sky")
        self.calls, self.exit_code, self.ended, self.finished = [], exit_code, threading.Event(), False
        fake = self

        class Task:
            @staticmethod
            def from_yaml_config(config):
                fake.calls.append(("Task", config))
                return ("task", config["name"])

        self.Task = Task
        self.exceptions = types.SimpleNamespace(JobExitCode=JobExitCode, ClusterDoesNotExist=type("ClusterDoesNotExist", (ValueError,), {}))
        self.jobs = types.SimpleNamespace(
            launch=lambda task, name: self._req(("jobs.launch", name), ([7], None)),
            tail_logs=lambda job_id, follow, output_stream: self._tail(("jobs.tail_logs", job_id), output_stream),
            cancel=lambda job_ids=None, name=None: self._req(("jobs.cancel", job_ids), None, end=True),
            queue_v2=lambda refresh, skip_finished, job_ids: self._req(
                ("jobs.queue_v2", job_ids), ([] if self.finished else [{"job_id": j} for j in job_ids], len(job_ids), {}, len(job_ids))))

    def _req(self, call, value, end=False):
        self.calls.append(call)
        if end:
            self.ended.set()
        return ("request", value)

    def _tail(self, call, stream):
        self.calls.append(call)
        stream.write("hello from the nodes\n")
        self.ended.wait(30)
        return JobExitCode.CANCELLED if any(c[0] in ("cancel", "jobs.cancel") for c in self.calls) else self.exit_code

    def launch(self, task, cluster_name, down):
        return self._req(("launch", cluster_name, down), (3, "handle"))

    def job_status(self, cluster, job_ids):
        self.calls.append(("job_status", cluster, job_ids))
        status = types.SimpleNamespace(is_terminal=lambda: self.finished)  # sky.skylet.job_lib.JobStatus
        return ("request", {job_id: status for job_id in job_ids})

    def api_cancel(self, request_ids, silent=False):
        return self._req(("api_cancel", request_ids), None)

    def tail_logs(self, cluster, job_id, follow, output_stream):
        return self._tail(("tail_logs", cluster, job_id), output_stream)

    def cancel(self, cluster, job_ids):
        return self._req(("cancel", cluster, job_ids), None, end=True)

    def down(self, cluster):
        return self._req(("down", cluster), None)

    def get(self, request):
        return request[1]

    def stream_and_get(self, request, output_stream=None):
        return request[1]


def _start(tmp_path, monkeypatch, fake, **options):
    monkeypatch.setitem(sys.modules, "sky", fake)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(code / "train.py")), Resources(2, 1), name="t", backend="skypilot",
                   workdir=str(code), backend_options={"gpus": "L4:1", **options})
    backend = get_backend("skypilot")
    paths = JobPaths(tmp_path / "jobs" / "sky1")
    plan = backend.plan(spec, "sky1", 0, HomePaths(tmp_path), backend.facts(spec))
    paths.root.mkdir(parents=True)
    write_json(paths.spec, spec.to_dict())
    return backend.start(plan, paths), paths


def _wait(handles):
    deadline = time.monotonic() + 30
    while any(h.poll() is None for h in handles):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return [h.poll().exitcode for h in handles]  # NodeResult: the node's end, as the supervisor reads it


def test_fake_sky_launch_tail_and_report(tmp_path, monkeypatch):
    fake = FakeSky(exit_code=JobExitCode.SUCCEEDED)
    handles, paths = _start(tmp_path, monkeypatch, fake)
    fake.ended.set()
    assert _wait(handles) == [0, 0]
    assert ("launch", "phx-sky1-a0", True) in fake.calls and ("tail_logs", "phx-sky1-a0", 3) in fake.calls
    config = next(c[1] for c in fake.calls if c[0] == "Task")
    workdir = Path(config["workdir"])
    assert (workdir / "code" / "train.py").is_file() and (workdir / "lib" / "phalanx" / "launch" / "agent.py").is_file()
    assert workdir == paths.skypilot_workdir(0)  # JobPaths names it
    launches = json.loads((workdir / "launch.json").read_text())["nodes"]
    assert len(launches) == 2 and [LaunchFile.from_dict(n).node.node_rank for n in launches] == [0, 1]
    assert "hello from the nodes" in paths.agent_log(0, 0).read_text()
    assert json.loads(paths.scheduler_job(0).read_text())["job_id"] == "3"  # contracts.SchedulerRecord: ids are strings


def test_fake_sky_stop_cancels_and_tears_down(tmp_path, monkeypatch):
    fake = FakeSky()
    handles, paths = _start(tmp_path, monkeypatch, fake)
    while not any(c[0] == "tail_logs" for c in fake.calls):
        time.sleep(0.05)
    handles[0].signal(15)
    assert _wait(handles) == [143, 143]
    assert ("cancel", "phx-sky1-a0", [3]) in fake.calls and ("down", "phx-sky1-a0") in fake.calls
    assert json.loads(paths.node_result(0, 1).read_text())["stopped_by"] == "SIGTERM"


def test_fake_sky_a_cluster_the_user_named_is_used_and_kept(tmp_path, monkeypatch):
    """--cluster NAME: the job runs there (sky.launch reuses an existing cluster) and phalanx never
    tears it down, neither when the job ends (down=False) nor when it is stopped (cancel only)."""
    fake = FakeSky()
    handles, _paths = _start(tmp_path, monkeypatch, fake, cluster="mine")
    while not any(c[0] == "tail_logs" for c in fake.calls):
        time.sleep(0.05)
    handles[0].signal(15)
    assert _wait(handles) == [143, 143]
    assert ("launch", "mine", False) in fake.calls and ("cancel", "mine", [3]) in fake.calls
    assert not any(c[0] == "down" for c in fake.calls), fake.calls


def test_fake_sky_managed_jobs_go_through_sky_jobs(tmp_path, monkeypatch):
    fake = FakeSky(exit_code=JobExitCode.FAILED)
    handles, paths = _start(tmp_path, monkeypatch, fake, managed=True)
    fake.ended.set()
    assert _wait(handles) == [1, 1]  # JobExitCode FAILED (100) is a failure, not the script's exit code
    assert "SkyPilot job 7 (phx-sky1-a0) ended: FAILED" in paths.agent_log(0, 0).read_text()
    assert ("jobs.launch", "phx-sky1-a0") in fake.calls and ("jobs.tail_logs", 7) in fake.calls


def test_without_skypilot_the_start_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sky", None)
    from phalanx.errors import MissingDependency

    with pytest.raises(MissingDependency, match="phalanx\\[skypilot\\]"):
        _start(tmp_path, monkeypatch, None)


def test_fake_sky_a_retry_launches_anew_its_handles_keep_no_agent(tmp_path, monkeypatch):
    """SkyPilot's nodes run one attempt each (no kept agents): on a retry ``Backend.start`` with the
    ended attempt's handles launches attempt 1 as a new cluster, and letting the old handles go
    touches nothing of SkyPilot's (the attempt-0 cluster went down with its job, ``down=True``)."""
    fake = FakeSky(exit_code=JobExitCode.FAILED)
    handles, paths = _start(tmp_path, monkeypatch, fake)
    fake.ended.set()
    assert _wait(handles) == [1, 1]
    backend = get_backend("skypilot")
    spec = JobSpec.from_dict(json.loads(paths.spec.read_text()))
    plan = backend.plan(spec, "sky1", 1, HomePaths(tmp_path), backend.facts(spec))
    before = len(fake.calls)
    retried = backend.start(plan, paths, previous=handles)
    assert _wait(retried) == [1, 1] and all(new is not old for new, old in zip(retried, handles))
    calls = fake.calls[before:]
    assert ("launch", "phx-sky1-a1", True) in calls and ("tail_logs", "phx-sky1-a1", 3) in calls
    assert not any(c[0] in ("cancel", "down") for c in calls), calls  # nothing done to attempt 0
    assert json.loads(paths.node_result(1, 0).read_text())["exitcode"] == 1


@pytest.mark.parametrize("managed", [False, True])
def test_fake_sky_a_new_supervisor_follows_the_running_job_again(tmp_path, monkeypatch, managed):
    """attach: the attempt's scheduler.json names SkyPilot's job; while SkyPilot says it runs, a new
    supervisor follows it (tail, no second launch); once it has ended, there is nothing to attach."""
    fake = FakeSky(exit_code=JobExitCode.SUCCEEDED)
    options = {"managed": True} if managed else {}
    handles, paths = _start(tmp_path, monkeypatch, fake, **options)
    fake.ended.set()
    assert _wait(handles) == [0, 0]
    backend = get_backend("skypilot")
    spec = JobSpec.from_dict(json.loads(paths.spec.read_text()))
    plan = backend.plan(spec, "sky1", 0, HomePaths(tmp_path), backend.facts(spec))
    before = len(fake.calls)
    attached = backend.attach(plan, paths)
    assert attached is not None and _wait(attached) == [0, 0]
    calls = fake.calls[before:]
    assert not any(c[0] in ("launch", "jobs.launch") for c in calls), calls
    assert (("jobs.queue_v2", [7]) if managed else ("job_status", "phx-sky1-a0", [3])) in calls
    assert (("jobs.tail_logs", 7) if managed else ("tail_logs", "phx-sky1-a0", 3)) in calls
    assert "following SkyPilot job" in paths.agent_log(0, 0).read_text()
    fake.finished = True
    assert backend.attach(plan, paths) is None


def test_fake_sky_secrets_go_into_skypilots_task_secrets_at_launch_only(tmp_path, monkeypatch):
    """--secret on SkyPilot: the task phalanx plans and keeps (plan.json, the dry run) has no value;
    at launch the SDK's task gets them through ``Task.update_secrets`` (what SkyPilot sets in the run
    step's environment and shows redacted). The real library's behaviour: test_real_skypilot.py."""
    canary = "sky-canary-Jq2m8Vx1"
    monkeypatch.setenv("PHALANX_SECRETS_FILE", str(tmp_path / "cfg" / "secrets.json"))
    monkeypatch.setenv("PHALANX_SECRETS_STORE", "file")
    from phalanx.secrets.local import open_store

    open_store().set("hf", canary, owner="test")
    fake = FakeSky()
    given: list = []

    class Task(tuple):
        def update_secrets(self, values):
            given.append(dict(values))
            return self

    fake.Task = type("TaskClass", (), {"from_yaml_config": staticmethod(lambda config: (fake.calls.append(("Task", config)),
                                                                                          Task(("task", config["name"])))[1])})
    monkeypatch.setitem(sys.modules, "sky", fake)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(code / "train.py")), Resources(2, 1), name="t", backend="skypilot",
                   workdir=str(code), backend_options={"gpus": "L4:1"}, secrets={"HF_TOKEN": "hf"})
    backend = get_backend("skypilot")
    paths = JobPaths(tmp_path / "jobs" / "sky1")
    plan = backend.plan(spec, "sky1", 0, HomePaths(tmp_path), backend.facts(spec))
    paths.root.mkdir(parents=True)
    handles = backend.start(plan, paths)
    fake.ended.set()
    assert _wait(handles) == [0, 0]
    assert given == [{"HF_TOKEN": canary}]
    config = next(c[1] for c in fake.calls if c[0] == "Task")
    assert canary not in json.dumps(config) and canary not in plan.to_json() and "HF_TOKEN=<secret>" in plan.render()
    for path in tmp_path.joinpath("jobs").rglob("*"):
        if path.is_file():
            assert canary.encode() not in path.read_bytes(), path
