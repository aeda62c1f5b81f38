"""How the check before an attempt and the nodes left out reach the plans (pure), and torch's
rendezvous waits sized for the node count (launch/rendezvous.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from phalanx.backends.base import Facts
from phalanx.backends.registry import get_backend
from phalanx.core.contracts import AttemptRecord, OutcomeKind, append_attempt, read_attempts
from phalanx.core.paths import HomePaths, JobPaths
from phalanx.core.plan import NodePlan, Plan
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources
from phalanx.launch import rendezvous
from phalanx.launch.host import HostFacts
from phalanx.launch.nodes import health_check
from phalanx.supervise import history

TRAIN = Entrypoint(EntrypointKind.SCRIPT, "/work/train.py", ())
FACTS = Facts(HostFacts(gpus=0, cpus=2, env={}), ports=tuple(itertools.islice(itertools.count(29500), 8)))


def plan(spec: JobSpec, backend: str = "local") -> Plan:
    return get_backend(backend).plan(spec.with_(python="python3", workdir="/work"), "job1", 0,
                                     HomePaths(Path("/home/u/.phalanx")), FACTS)


def test_the_check_is_part_of_every_nodes_plan_and_shown_by_dry_run():
    assert health_check(JobSpec(TRAIN)) == ()
    own = plan(JobSpec(TRAIN, Resources(2, 1), backend="local", health_check=True))
    assert [n.health_check for n in own.nodes] == [("python3", "-m", "phalanx.health.doctor_probe", "--node-only",
                                                     "--burn", "1")] * 2
    mine = plan(JobSpec(TRAIN, Resources(2, 1), health_check=True, health_check_cmd="nvidia-smi -q | grep -q Healthy"))
    assert mine.nodes[1].health_check == ("/bin/sh", "-c", "nvidia-smi -q | grep -q Healthy")
    assert "check:    /bin/sh -c 'nvidia-smi -q | grep -q Healthy'" in mine.render()
    node = mine.nodes[0]
    assert NodePlan.from_dict(node.to_dict()) == node
    # a plan without a check reads and writes as before the field existed (golden files, old launch files)
    assert "health_check" not in plan(JobSpec(TRAIN, Resources(2, 1))).nodes[0].to_dict()


def test_slurm_retry_excludes_the_nodes_left_out_and_agents_name_their_node():
    first = plan(JobSpec(TRAIN, Resources(2, 1), backend="slurm"), "slurm").submission
    assert "--exclude" not in first and "--node-name-from SLURMD_NODENAME" in first
    retry = plan(JobSpec(TRAIN, Resources(2, 1), backend="slurm", left_out=("n1", "gpu-07")), "slurm").submission
    assert "#SBATCH --exclude=n1,gpu-07\n" in retry
    # the user's own #SBATCH lines still come last (they win)
    extra = plan(JobSpec(TRAIN, Resources(1, 1), backend="slurm", left_out=("n1",),
                         backend_options={"sbatch": ["--exclude=n9"]}), "slurm").submission
    assert extra.index("--exclude=n1") < extra.index("--exclude=n9")


def test_attempts_keep_the_nodes_left_out_and_a_resumed_job_avoids_them(tmp_path):
    paths = JobPaths(tmp_path)
    entry = {"node": "node2", "node_rank": 1, "why": "failed its health check: exit 3", "left_out": True,
             "how": "left out of the next attempt"}
    append_attempt(paths.attempts_log, AttemptRecord(0, 1.0, 2.0, OutcomeKind.FAILED, 1, "m", True, "nodes left out", (entry,)))
    append_attempt(paths.attempts_log, AttemptRecord(1, 3.0, 4.0, OutcomeKind.FAILED, 1, "m", False, "no retries left"))
    read = read_attempts(paths.attempts_log)
    assert read[0].left_out == (entry,) and read[1].left_out == ()
    assert "left_out" not in read[1].to_dict()
    assert history.left_out(paths) == ("node2",)


def test_rendezvous_waits_are_sized_for_the_node_count(monkeypatch):
    assert rendezvous.spread(1) == 0 and rendezvous.spread(2) == pytest.approx(0.003)
    assert rendezvous.spread(1000) == 0.3  # torch's own for large jobs
    assert rendezvous.poll_interval(2) == pytest.approx(0.04)
    assert rendezvous.poll_interval(500) == 1.0
    dynamic = pytest.importorskip("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
    from torch.distributed.elastic.rendezvous import utils

    slept: list[float] = []
    monkeypatch.setattr(utils.time, "sleep", slept.append)
    original, init = dynamic._delay, dynamic._BackendRendezvousStateHolder.__init__
    with rendezvous.tuned(2):
        holder = dynamic._BackendRendezvousStateHolder(backend=None, settings=None)
        assert holder._cache_duration == pytest.approx(0.04)
        dynamic._delay(seconds=(0, 0.3))  # the first round's spread: under torch's 10 ms floor for two nodes
        dynamic._delay(seconds=1)  # the poll while waiting for the other nodes
    assert slept == [pytest.approx(0.04)]
    assert (dynamic._delay, dynamic._BackendRendezvousStateHolder.__init__) == (original, init)
    assert dynamic._BackendRendezvousStateHolder(backend=None, settings=None)._cache_duration == 1
    dynamic._delay(seconds=1)
    assert slept[-1] == 1


def test_a_kept_agent_closes_its_rendezvous_behind_it(monkeypatch):
    dynamic = pytest.importorskip("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
    import threading

    closed = threading.Event()
    where: list[str] = []

    def shutdown(self):
        where.append(threading.current_thread().name)
        closed.set()
        return True

    monkeypatch.setattr(dynamic.DynamicRendezvousHandler, "shutdown", shutdown)
    with rendezvous.tuned(2):  # a one-attempt agent: torch's close, in its own thread
        assert dynamic.DynamicRendezvousHandler.shutdown(object()) is True
    assert where == [threading.current_thread().name]
    closed.clear()
    with rendezvous.tuned(2, close_behind=True):
        assert dynamic.DynamicRendezvousHandler.shutdown(object()) is True
        assert closed.wait(30)
    assert where[-1] == "phalanx-rendezvous-close"
    assert dynamic.DynamicRendezvousHandler.shutdown is shutdown


def test_rendezvous_steps_are_named_as_torch_names_them():
    dynamic = pytest.importorskip("torch.distributed.elastic.rendezvous.dynamic_rendezvous")

    def record(naming):  # as DynamicRendezvousHandler._record calls it
        return naming()

    def join_step(naming):
        return record(naming)

    assert join_step(rendezvous.method_name) == join_step(dynamic.get_method_name) == "join_step"
    with rendezvous.tuned(4):
        assert dynamic.get_method_name is rendezvous.method_name
    assert dynamic.get_method_name is not rendezvous.method_name


def test_how_each_backend_avoids_a_bad_node_on_the_retry():
    from phalanx.supervise import leaveout

    spec = JobSpec(TRAIN, Resources(2, 1))
    assert {name: get_backend(name).avoids(spec) for name in ("local", "ssh", "slurm", "k8s", "sagemaker", "skypilot")} \
        == {"local": "", "ssh": "exclude", "slurm": "exclude", "k8s": "exclude", "sagemaker": "new", "skypilot": "new"}
    # a SkyPilot cluster the user named is the same machines on every attempt: nothing is avoided
    named = get_backend("skypilot").avoids(spec.with_(backend="skypilot", backend_options={"cluster": "mine"}))
    assert named == ""
    entry, = leaveout.unusable(named, {"gpu-3": "no answer"}).entries
    assert (entry["left_out"], entry["how"]) == (False, "cannot be left out by this backend")
    entry, = leaveout.unusable("new", {"gpu-3": "no answer"}).entries
    assert entry["how"] == "the next attempt gets new machines"
