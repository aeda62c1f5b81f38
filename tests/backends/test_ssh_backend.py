"""The ssh backend against a stateful fake of the OpenSSH client (fake_ssh.py): facts and the
pure plan, the preflight, copying to the hosts, and whole jobs whose nodes run for real on fake
hosts (directories with their own home) through the real remote end and agent: files mirrored
back, a stop over the link, a host that is lost. The same backend against a real sshd:
tests/cluster/test_ssh*.py."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from phalanx.api import jobs, query
from phalanx.backends.registry import get_backend
from phalanx.backends.ssh import Shipment, SshBackend
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Channel, Entrypoint, EntrypointKind, JobSpec, Resources, Spawn
from phalanx.core.state import JobState
from phalanx.errors import BackendError, UsageError
from phalanx.launch.host import HostFacts
from phalanx.supervise.attempt import write_launch_files

from .fake_ssh import FakeSsh
from .golden_files import assert_golden

SCRIPT = """\
import os, pathlib, sys, time
rank = os.environ["RANK"]
print(f"rank {rank} on node {os.environ['PHALANX_NODE_RANK']} loss=0.{rank}", flush=True)
pathlib.Path(os.environ["PHALANX_OUTPUT_DIR"], f"out{rank}.txt").write_text(f"from rank {rank}")
pathlib.Path(os.environ["PHALANX_STATE_DIR"], f"ckpt{rank}.txt").write_text("step=1")
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    fake = FakeSsh(tmp_path, ["gpu1", "gpu2", "gpu3", "gpu4"]).install(monkeypatch)
    yield fake
    fake.close()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PHALANX_HOME", str(tmp_path / "phx"))
    return HomePaths(tmp_path / "phx")


def _spec(tmp_path: Path, *args: str, nnodes: int = 2, **options) -> JobSpec:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text(SCRIPT)
    return JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(work / "train.py"), args), Resources(nnodes, 1), name="t",
                   backend="ssh", spawn=Spawn.SELF, python=sys.executable, workdir=str(work), snapshot=True, grace=3.0,
                   backend_options={"hosts": "gpu1,gpu2", **options})


def test_facts_ask_ssh_once_per_host_and_the_plan_asks_nothing(fake, tmp_path):
    backend = get_backend("ssh")
    spec = _spec(tmp_path)
    facts = backend.facts(spec, HostFacts(cpus=2))
    assert [c[:2] + c[-1:] for c in fake.calls] == [["ssh", "-G", "gpu1"], ["ssh", "-G", "gpu2"]]
    assert facts.addresses == ("10.0.0.1", "10.0.0.2")
    fake.calls.clear()
    home = HomePaths(Path("/home/u/.phalanx"))
    plan = backend.plan(spec, "job1234", 0, home, facts)
    assert backend.plan(spec, "job1234", 0, home, facts) == plan and fake.calls == []  # pure
    assert plan.nodes[1].env["PHALANX_NODE_ADDRS"] == "10.0.0.1,10.0.0.2" and plan.nodes[1].host == "gpu2"
    assert plan.nodes[1].env["PHALANX_JOB_DIR"] == "~/.phalanx/remote/jobs/job1234"  # the host's own copy
    spec = spec.with_(workdir="/work", entrypoint=Entrypoint(EntrypointKind.SCRIPT, "/work/train.py"), python="python3")
    assert_golden("ssh_2x1.json", backend.plan(spec, "job1234", 0, home, facts).to_json(), "plan for ssh_2x1")
    with pytest.raises(UsageError, match="-n asks for 3 nodes but 2 host"):
        backend.plan(spec.with_(resources=Resources(3, 1)), "j", 0, home, facts)


def test_preflight_names_every_host_that_cannot_run_the_job(fake, tmp_path):
    backend = SshBackend()
    spec = _spec(tmp_path, nnodes=4).with_(resources=Resources(4, 2), spawn=Spawn.AUTO,
                                            backend_options={"hosts": "gpu1,gpu2,gpu3,gpu4"})
    plan = backend.plan(spec, "j1", 0, HomePaths(tmp_path / "phx"), backend.facts(spec))
    backend.preflight({}, ["gpu1", "gpu2", "gpu3", "gpu4"], plan)  # all well
    fake.hosts["gpu1"].port_busy = True
    fake.hosts["gpu2"].reachable = False
    fake.hosts["gpu3"].phalanx = False
    fake.hosts["gpu4"].torch = "1.0.0"
    with pytest.raises(BackendError) as err:
        backend.preflight({}, ["gpu1", "gpu2", "gpu3", "gpu4"], plan)
    text = str(err.value)
    assert "gpu1: the rendezvous port" in text and "is in use" in text
    assert "gpu2: ssh: connect to host 10.0.0.2 port 22: Connection refused" in text
    assert f"gpu3: phalanx is not installed for {sys.executable}" in text
    assert "gpu4: torch 1.0.0 differs from this machine's" in text


def test_code_state_and_inputs_reach_every_host_and_inputs_only_once(fake, tmp_path, home):
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0").write_text("rows")
    spec = _spec(tmp_path).with_(channels=(Channel("train", str(data), str(data)),))
    home.state_dir("t").mkdir(parents=True)
    (home.state_dir("t") / "ckpt.pt").write_text("step=4")
    backend = SshBackend()
    plan = backend.plan(spec, "j1", 0, home, backend.facts(spec))
    items = [Shipment.from_dict(s) for s in plan.context["ship"]]
    home.job("j1").code_dir.mkdir(parents=True)
    (home.job("j1").code_dir / "train.py").write_text(SCRIPT)
    backend.ship({}, ["gpu1", "gpu2"], items)
    for host in ("gpu1", "gpu2"):
        remote = fake.hosts[host].home / ".phalanx" / "remote"
        assert (remote / "jobs" / "j1" / "code" / "train.py").read_text() == SCRIPT
        assert (remote / "state" / "t" / "ckpt.pt").read_text() == "step=4"
        assert [p.read_text() for p in (remote / "cache" / "channels").glob("*/part-0")] == ["rows"]
    copies = len(fake.calls_to("tar -xf"))
    backend.ship({}, ["gpu1", "gpu2"], items)
    assert len(fake.calls_to("tar -xf")) == copies + 4, "code and state again, the unchanged input not"


def test_a_job_runs_on_two_hosts_and_what_they_write_comes_back(fake, tmp_path, home):
    record, code = jobs.run(_spec(tmp_path))
    assert code == 0 and record.state is JobState.SUCCEEDED, query.attempt_history(record)
    paths = record.paths
    assert [paths.rank_log(0, r).read_text() for r in (0, 1)] == ["rank 0 on node 0 loss=0.0\n", "rank 1 on node 1 loss=0.1\n"]
    assert sorted(p.name for p in paths.output_dir.iterdir()) == ["out0.txt", "out1.txt"]  # every node's, not node 0's
    # the job's own state directory (no --name): statedir.for_job
    assert sorted(p.name for p in home.state_dir(record.spec.state_key).iterdir()) == ["ckpt0.txt", "ckpt1.txt"]
    assert [json.loads(paths.node_result(0, n).read_text())["exitcode"] for n in (0, 1)] == [0, 0]
    for host, rank in (("gpu1", 0), ("gpu2", 1)):  # each host ran from its own copy
        remote = fake.hosts[host].home / ".phalanx" / "remote" / "jobs" / record.id
        assert (remote / "code" / "train.py").exists() and (remote / "output" / f"out{rank}.txt").exists()
    ranks = query.rank_statuses(record)
    assert [(r.rank, r.node_rank, r.state) for r in ranks] == [(0, 0, "succeeded"), (1, 1, "succeeded")]


def test_stop_goes_over_the_link_and_the_ranks_get_their_grace(fake, tmp_path, home):
    backend = SshBackend()
    spec = _spec(tmp_path, "60")
    plan = backend.plan(spec, "j1", 0, home, backend.facts(spec))
    paths = home.job("j1")
    paths.code_dir.mkdir(parents=True)
    (paths.code_dir / "train.py").write_text(SCRIPT)
    paths.output_dir.mkdir()
    home.state_dir("t").mkdir(parents=True)
    write_launch_files(plan, paths)
    handles = backend.start(plan, paths)
    _wait_for(lambda: all(paths.rank_log(0, r).exists() and paths.rank_log(0, r).read_text() for r in (0, 1)), "both ranks")
    for h in handles:
        h.signal(signal.SIGTERM)
    _wait_for(lambda: all(h.poll() is not None for h in handles), "both nodes to stop")
    results = [h.poll() for h in handles]
    assert [(r.exitcode, r.stopped_by, r.synthesized) for r in results] == [(143, "SIGTERM", False)] * 2


def test_a_lost_host_fails_the_job_and_leaves_nothing_running(fake, tmp_path, home, monkeypatch):
    from phalanx.supervise import job

    started = []

    class Cutting(job.JobRun):
        def tick(self) -> None:  # once both ranks print, gpu2's link breaks
            if not started and all(self.paths.rank_log(0, r).exists() and self.paths.rank_log(0, r).read_text()
                                   for r in (0, 1)):
                started.append(time.monotonic())
                fake.cut("gpu2")
            super().tick()

    monkeypatch.setattr(job, "JobRun", Cutting)
    record, code = jobs.run(_spec(tmp_path, "60"))
    assert record.state is JobState.FAILED and code == 255 and started
    cause = record.root_cause_dict()
    assert cause["node_rank"] == 1 and "node agent 1 exited with code 255" in cause["message"]
    result = json.loads(record.paths.node_result(0, 1).read_text())
    assert result["synthesized"] and "the connection to gpu2 ended without the node's exit" in result["error"]
    pids = [json.loads(record.paths.rank_proc(0, r).read_text())["pid"] for r in (0, 1)]
    _wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids),
              "the ranks on both hosts to end")


def _wait_for(check, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_secret_travels_on_the_links_stdin_never_on_a_command_line(fake, tmp_path, home, monkeypatch):
    """--secret over ssh: every command phalanx ran (ssh -G, the preflight, the copies, the links)
    is free of the value; the ranks on both hosts got it (the remote end put it in the agent's
    environment) and what they printed of it is masked; no file on the hosts holds it."""
    import hashlib

    canary = "ssh-canary-Pq7w3Zx0"
    monkeypatch.setenv("PHALANX_SECRETS_FILE", str(tmp_path / "cfg" / "secrets.json"))
    monkeypatch.setenv("PHALANX_SECRETS_STORE", "file")
    from phalanx.secrets.local import open_store

    open_store().set("db", canary, owner="test")
    spec = _spec(tmp_path).with_(secrets={"DB_PASSWORD": "db"})
    (Path(spec.workdir) / "train.py").write_text(
        "import hashlib, os\nv = os.environ['DB_PASSWORD']\n"
        "print('rank', os.environ['RANK'], hashlib.sha256(v.encode()).hexdigest(), 'pw=' + v, flush=True)\n")
    record, code = jobs.run(spec)
    assert code == 0 and record.state is JobState.SUCCEEDED, query.attempt_history(record)
    digest = hashlib.sha256(canary.encode()).hexdigest()
    assert [record.paths.rank_log(0, r).read_text() for r in (0, 1)] == [f"rank {r} {digest} pw=********\n" for r in (0, 1)]
    assert fake.calls and not [c for c in fake.calls if canary in " ".join(map(str, c))]
    for host in ("gpu1", "gpu2"):
        for path in fake.hosts[host].home.rglob("*"):
            if path.is_file():
                assert canary.encode() not in path.read_bytes(), path
