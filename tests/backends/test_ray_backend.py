"""The ray backend without a cluster: the relay protocol, the plan (what --dry-run prints), the
job file's ``ray:`` section, the preflight's verdicts on what a cluster reports (a fake client,
named as such: the real cluster is tests/cluster/test_ray.py), and that the CLI never imports Ray."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.backends.ray import backend as ray_backend
from phalanx.backends.ray import relay, submission
from phalanx.backends.ray.options import validate_section
from phalanx.backends.registry import get_backend
from phalanx.core.paths import HomePaths
from phalanx.core.plan import Plan
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources
from phalanx.errors import UsageError
from phalanx.launch.frames import Receiver


def _spec(tmp_path: Path, **opts) -> JobSpec:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(tmp_path / "train.py"), ("--lr", "0.1")),
                   Resources(nnodes=2, nproc_per_node=4), name="train", workdir=str(tmp_path), backend="ray",
                   snapshot=True, backend_options={"address": "http://head:8265", **opts})


def _plan(spec: JobSpec, job_id: str, attempt: int, home: HomePaths):
    backend = get_backend("ray")
    return backend.plan(spec, job_id, attempt, home, backend.facts(spec))


def test_relay_round_trip_under_any_chunking(tmp_path):
    """Frames relayed as log lines and read back in arbitrary pieces give the node's files."""
    frames = (relay.frame({"f": "rank_0/output.log", "o": 0}, b"hello \xff\n" * 5000)
              + relay.frame({"f": "node_1/result.json", "w": 1}, b'{"exitcode": 0}\n') + relay.frame({"exit": 0}))
    text = "Runtime env is setting up.\n" + relay.event_line({"placed": [{"ip": "10.0.0.2"}]})
    text += "".join(relay.data_lines(1, frames)) + relay.end_line(1) + "driver says bye\n"
    got: dict[int, bytearray] = {}
    ends, events, other = [], [], []
    demux = relay.Demux(lambda n, b: got.setdefault(n, bytearray()).extend(b), ends.append, events.append, other.append)
    rng = random.Random(0)
    i = 0
    while i < len(text):
        step = rng.randint(1, 70000)
        demux.feed(text[i:i + step])
        i += step
    demux.close()
    assert bytes(got[1]) == frames and ends == [1] and events == [{"placed": [{"ip": "10.0.0.2"}]}]
    assert other == ["Runtime env is setting up.", "driver says bye"]
    assert demux.consumed == len(text)
    import io

    code = Receiver(tmp_path).receive(io.BytesIO(bytes(got[1])))
    assert code == 0 and (tmp_path / "rank_0" / "output.log").read_bytes() == b"hello \xff\n" * 5000


def test_lost_node_frames_read_as_a_preemption(tmp_path):
    import io

    data = relay.lost_frames(1, {"ip": "10.0.0.3", "node_id": "ab" * 28}, "Ray node ... was lost", 0)
    assert Receiver(tmp_path).receive(io.BytesIO(data)) == 137
    result = json.loads((tmp_path / "node_1" / "result.json").read_text())
    # what the supervisor's _taken_by_scheduler looks for: stopped from outside, no rank failed
    assert result["stopped_by"] and result["failures"] == [] and result["exitcode"] == 137
    assert result["host"] == "10.0.0.3 (Ray node abababababab)"


class _LogOnlyClient:
    """The Jobs API as RayJob uses it: the job's log (all of it at once), its status."""

    def __init__(self, text: str) -> None:
        self.text = text

    def tail(self, submission_id, stop):
        yield self.text

    def status(self, submission_id):
        return "RUNNING", ""

    def logs(self, submission_id):
        return self.text


def test_a_failure_a_peers_loss_caused_is_reported_after_the_loss(tmp_path):
    """Node 1's Ray node dies: node 0's rank fails at once (its peer's connection broke), seconds
    before the driver can report the loss. The supervisor must see the loss alone first (the
    attempt was taken: preempted), then node 0's failure; supervise's outcome reads it so."""
    from phalanx.backends.ray.node import RayJob
    from phalanx.core.contracts import NodeResult
    from phalanx.core.paths import JobPaths
    from phalanx.supervise.outcome import taken_by_scheduler

    failed = NodeResult(0, 1, "10.0.0.2", failures=(), details={}).to_dict()
    failed["failures"] = [{"rank": 0, "exitcode": 1, "timestamp": 1.0}]
    node0 = relay.frame({"f": "node_0/result.json", "w": 1}, json.dumps(failed).encode()) + relay.frame({"exit": 1})
    place = {"ip": "10.0.0.3", "node_id": "cd" * 28}
    text = ("".join(relay.data_lines(0, node0)) + relay.end_line(0)
            + relay.event_line({"lost": {"node": 1, **place, "message": "lost"}})
            + "".join(relay.data_lines(1, relay.lost_frames(1, place, "Ray node lost", 0))) + relay.end_line(1))
    paths = JobPaths(tmp_path / "j")
    for n in (0, 1):
        paths.node_dir(0, n).mkdir(parents=True)  # as Backend.start leaves them
    job = RayJob(_LogOnlyClient(text), "phalanx-j-0", paths, 0, 2, {})
    assert job.followed.wait(10)
    ticks = [[job.poll(n) for n in (0, 1)] for _ in range(3)]  # the supervisor polls every node each tick
    first = next(t for t in ticks if any(r is not None for r in t))
    assert first[0] is None and first[1] is not None and first[1].stopped_by == "SIGKILL"
    assert ticks[-1][0] is not None and ticks[-1][0].failures[0].rank == 0
    assert taken_by_scheduler([ticks[-1][0], ticks[-1][1]], [1]) == 137  # only node 1 had failed when it was seen


def test_plan_is_what_dry_run_prints(tmp_path):
    spec = _spec(tmp_path, gpus_per_node=4, pending_timeout=60)
    plan = _plan(spec, "abcd1234", 0, HomePaths(tmp_path / "home"))
    assert [n.host for n in plan.nodes] == ["@NODE_ADDR_0@", "@NODE_ADDR_1@"]  # the placement group decides
    assert plan.nodes[0].agent_argv[0] == relay.PYTHON  # the node's own Ray interpreter
    assert plan.nodes[0].cwd == "~/.phalanx/ray/jobs/abcd1234/code"
    assert any(a.startswith("--rdzv-endpoint=@NODE_ADDR_0@:") for a in plan.nodes[0].torchrun_argv or ())
    assert plan.nodes[1].env["PHALANX_STATE_DIR"] == "~/.phalanx/ray/state/train"
    text = plan.render()
    assert "# Ray job phalanx-abcd1234-0 at http://head:8265" in text
    assert "STRICT_SPREAD, 2 bundle(s) of {CPU 1, GPU 4}" in text and "pending at most 60s" in text
    assert '"RAY_JOB_STOP_WAIT_TIME_S": "50"' in text  # the grace (30) + the driver's margin
    request = ray_backend._request(plan)
    job = submission.driver_job(plan, request, 5.0)
    assert job["gpus"] == 4 and job["master_port"] and len(job["nodes"]) == 2
    assert job["trees"] == {"state": "~/.phalanx/ray/state/train", "output": "~/.phalanx/ray/jobs/abcd1234/output"}
    # what start and a later attach need, in the plan (plan.json keeps it), and nothing asked of Ray to make it
    assert Plan.from_dict(json.loads(plan.to_json())) == plan and plan.context["address"] == "http://head:8265"
    assert plan.context["trees"]["state"] == ["~/.phalanx/ray/state/train", str(tmp_path / "home" / "state" / "train")]
    assert job["nodes"][0]["version"] == 1 and job["nodes"][0]["sample_interval"] == 5.0  # contracts.LaunchFile


def test_runtime_env_and_interpreter_from_the_job_file_section(tmp_path):
    section = {"pip": ["einops==0.8.0"], "env_vars": {"NCCL_DEBUG": "INFO"}, "py_executable": "/opt/py/bin/python"}
    plan = _plan(_spec(tmp_path, ray=section), "abcd1234", 1, HomePaths(tmp_path))
    request = ray_backend._request(plan)
    env = submission.runtime_env(request, "/stage", 30.0)
    assert env["pip"] == ["einops==0.8.0"] and env["py_executable"] == "/opt/py/bin/python"
    assert env["env_vars"]["NCCL_DEBUG"] == "INFO" and env["working_dir"] == "/stage"
    assert submission.entrypoint(request["python"]) == "exec /opt/py/bin/python -m phalanx.backends.ray.driver"
    assert "python_worker_command" in submission.entrypoint(None)  # default: the interpreter Ray runs with


@pytest.mark.parametrize("section, said", [
    ({"pips": ["x"]}, "unknown key(s) pips"),
    ({"pip": [1]}, "ray.pip must be a list"),
    ({"env_vars": ["A=1"]}, "ray.env_vars must be a mapping"),
    ({"py_executable": " "}, "ray.py_executable must be a command"),
    ("pip", "must be a mapping"),
])
def test_bad_ray_section_is_refused(section, said):
    with pytest.raises(UsageError, match=said.replace("(", r"\(").replace(")", r"\)")):
        validate_section(section)


def test_address_is_required_and_must_be_the_jobs_api(monkeypatch):
    from phalanx.backends.ray.client import resolve_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(UsageError, match="needs the cluster's address"):
        resolve_address(None)
    with pytest.raises(UsageError, match="Ray Client address"):
        resolve_address("ray://head:10001")
    monkeypatch.setenv("RAY_ADDRESS", "head:8265")
    assert resolve_address(None) == "http://head:8265"


class FakeClient:
    """Stands in for RayClient with what a cluster's dashboard reports (recorded shapes)."""

    address = "http://head:8265"

    def __init__(self, version: str, nodes: list[dict]) -> None:
        self._version, self._nodes = version, nodes

    def ray_version(self) -> str:
        return self._version

    def nodes(self) -> list[dict]:
        return self._nodes


@pytest.mark.parametrize("version, nodes, opts, said", [
    ("2.5.1", [], {}, "runs Ray 2.5.1; phalanx's driver needs Ray 2.10"),
    ("2.60.0", [{"ip": "10.0.0.1", "resources": {"CPU": 8.0}}], {},
     "needs 2 Ray node(s) with CPU 1 each, one job node per Ray node; the cluster at http://head:8265 has 1 (10.0.0.1: CPU 8, GPU 0)"),
    ("2.60.0", [{"ip": f"10.0.0.{i}", "resources": {"CPU": 8.0, "GPU": 2.0}} for i in (1, 2)], {"gpus_per_node": 4},
     "with CPU 1, GPU 4 each"),
])
def test_preflight_names_what_the_cluster_lacks(tmp_path, monkeypatch, version, nodes, opts, said):
    monkeypatch.setattr(ray_backend, "connect", lambda opts: FakeClient(version, nodes))
    with pytest.raises(UsageError) as err:
        ray_backend.RayBackend().preflight(_spec(tmp_path, **opts))
    assert said in str(err.value)


def test_preflight_passes_a_cluster_that_fits_or_may_grow(tmp_path, monkeypatch):
    nodes = [{"ip": f"10.0.0.{i}", "resources": {"CPU": 4.0, "GPU": 8.0}} for i in (1, 2)]
    monkeypatch.setattr(ray_backend, "connect", lambda opts: FakeClient("2.60.0", nodes))
    ray_backend.RayBackend().preflight(_spec(tmp_path))
    monkeypatch.setattr(ray_backend, "connect", lambda opts: FakeClient("2.60.0", nodes[:1]))
    ray_backend.RayBackend().preflight(_spec(tmp_path, pending_timeout=600))  # an autoscaler may add nodes


def test_cli_never_imports_ray():
    probe = ("import sys\nfrom phalanx.cli.main import main\n"
             "try:\n    main(['run', '--help'])\nexcept SystemExit:\n    pass\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "import phalanx.backends.ray.options\n"
             "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if m.startswith('ray'))\nprint('clean')\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("clean"), proc.stderr
    assert "--address" in subprocess.run([sys.executable, "-m", "phalanx", "run", "--help"], capture_output=True,
                                         text=True, timeout=60).stdout


def test_secrets_go_into_the_submissions_runtime_env_only():
    """--secret on Ray: the values are the job's runtime_env env_vars (Ray sets them in the driver and
    every actor, so the node agents and ranks have them; docs/secrets.md: Ray shows a job's
    runtime_env to whoever can see the job); a variable of the ray: section's env_vars gives way."""
    from phalanx.backends.ray import submission

    request = {"env_vars": {"HF_HOME": "/data/hf", "HF_TOKEN": "from-the-section"}}
    env = submission.runtime_env(request, "/stage", 30.0, {"HF_TOKEN": "sekret-value"})
    assert env["env_vars"] == {"HF_HOME": "/data/hf", "HF_TOKEN": "sekret-value", "RAY_JOB_STOP_WAIT_TIME_S": "50"}
    assert submission.runtime_env(request, "/stage", 30.0)["env_vars"]["HF_TOKEN"] == "from-the-section"
