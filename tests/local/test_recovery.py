"""Job-level retries on kept node agents (launch/control.py): the agents of the failed attempt
run the next one, with a fresh rendezvous and new workers; a dead agent is replaced; stops in the
retry window leave nothing behind. Real agents, real gloo, real kills; no timed assertions."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import phalanx
from tests.local.test_run import _alive, _status, _wait_for

pytestmark = pytest.mark.local

# Attempt 0: every rank records its process group's store, then the last rank fails and the others
# are cut off. Attempt 1: the ranks say "ready" and wait for the test's go before finishing.
SCRIPT = """
import json, os, sys, time
import torch, torch.distributed as dist
attempt = int(os.environ["PHALANX_ATTEMPT"])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(1)
dist.all_reduce(t)
state = os.environ["PHALANX_STATE_DIR"]
with open(os.path.join(state, f"a{attempt}_r{rank}.json"), "w") as fh:
    json.dump({"master": os.environ["MASTER_ADDR"] + ":" + os.environ["MASTER_PORT"], "sum": t.item(),
               "restart": os.environ["TORCHELASTIC_RESTART_COUNT"], "pid": os.getpid()}, fh)
dist.barrier()
if attempt == 0:
    if rank == world - 1:
        sys.exit(3)
    dist.all_reduce(t)  # the peer is gone: gloo fails here
print("ready", flush=True)
while not os.path.exists(os.path.join(state, "go")):
    time.sleep(0.1)
dist.all_reduce(t)
print("done", t.item(), flush=True)
dist.destroy_process_group()
"""


def _results(job_dir: Path, attempt: int) -> dict[int, dict]:
    return {int(p.parent.name.split("_")[1]): json.loads(p.read_text())
            for p in job_dir.glob(f"attempt_{attempt}/node_*/result.json")}


def _ready(job_dir: Path, attempt: int, ranks: int) -> bool:
    logs = [job_dir / f"attempt_{attempt}" / f"rank_{r}" / "output.log" for r in range(ranks)]
    return all(log.exists() and "ready" in log.read_text() for log in logs)


def _endpoint(job_dir: Path, attempt: int) -> int:
    launch = json.loads((job_dir / f"attempt_{attempt}" / "node_0" / "launch.json").read_text())
    arg = next(a for a in launch["node"]["torchrun_argv"] if a.startswith("--rdzv-endpoint="))
    return int(arg.rsplit(":", 1)[1])


def _listening(pid: int) -> set[int]:
    return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def test_retry_runs_on_the_kept_agents_with_a_fresh_rendezvous(phx_home, tmp_path):
    script = tmp_path / "recover.py"
    script.write_text(SCRIPT)
    job_id = phalanx("run", "-d", "--name", "kept", "--max-retries", "1", "-n", "2x2", str(script), check=True).stdout.strip()
    job_dir = Path(_status(job_id)["job_dir"])
    state = phx_home / "state" / "kept"
    _wait_for(lambda: _ready(job_dir, 1, 4), timeout=240, what="attempt 1 to run")

    before = _results(job_dir, 0)
    assert sorted(before) == [0, 1] and all(r["agent_pid"] for r in before.values())
    agents = {node: r["agent_pid"] for node, r in before.items()}
    # Every rank of attempt 1 is a child of the agent that ran its node in attempt 0, and an
    # interpreter that agent started ahead, while the supervisor decided (launch/standby.py).
    for rank in range(4):
        proc = json.loads((job_dir / "attempt_1" / f"rank_{rank}" / "proc.json").read_text())
        worker = psutil.Process(proc["pid"])
        assert worker.ppid() == agents[proc["node_rank"]]
        assert worker.cmdline()[1:4] == ["-u", "-m", "phalanx.launch.standby"]
    # A fresh rendezvous: a new port, served by the kept agent of node 0, and attempt 0's store gone
    # from it; the workers' store is new too, and the rank that served attempt 0's has exited.
    old_port, new_port = _endpoint(job_dir, 0), _endpoint(job_dir, 1)
    assert old_port != new_port
    served = _listening(agents[0])
    assert new_port in served and old_port not in served
    old = {r: json.loads((state / f"a0_r{r}.json").read_text()) for r in range(4)}
    new = {r: json.loads((state / f"a1_r{r}.json").read_text()) for r in range(4)}
    assert len({o["master"] for o in old.values()}) == 1 and len({n["master"] for n in new.values()}) == 1
    assert old[0]["master"] != new[0]["master"]
    assert _alive([o["pid"] for o in old.values()]) == []
    assert {n["sum"] for n in new.values()} == {4.0} and {n["restart"] for n in new.values()} == {"0"}

    (state / "go").touch()
    assert phalanx("wait", job_id, "--timeout", "120").returncode == 0
    final = _status(job_id)
    assert final["state"] == "SUCCEEDED" and final["attempt"] == 1
    assert [(a["outcome"], a["retry"]) for a in final["attempts"]] == [("failed", True), ("succeeded", False)]
    assert final["attempts"][0]["message"].startswith("rank 3")
    after = _results(job_dir, 1)
    assert {node: r["agent_pid"] for node, r in after.items()} == agents
    for rank in range(4):
        assert "done 16.0" in (job_dir / "attempt_1" / f"rank_{rank}" / "output.log").read_text()
    assert (job_dir / "attempt_1" / "node_1" / "agent.log").exists()
    _wait_for(lambda: _alive(agents.values()) == [], timeout=30, what="the agents to go once released")


def test_an_agent_that_died_is_replaced(phx_home, tmp_path):
    script = tmp_path / "recover.py"
    script.write_text(SCRIPT.replace("    if rank == world - 1:\n        sys.exit(3)\n", "    time.sleep(600)\n"))
    job_id = phalanx("run", "-d", "--name", "replaced", "--max-retries", "1", "-n", "2x1", str(script),
                     check=True).stdout.strip()
    job_dir = Path(_status(job_id)["job_dir"])
    state = phx_home / "state" / "replaced"
    _wait_for(lambda: all((state / f"a0_r{r}.json").exists() for r in range(2)), timeout=180, what="attempt 0 to run")
    ranks = {r: json.loads((job_dir / "attempt_0" / f"rank_{r}" / "proc.json").read_text()) for r in range(2)}
    agents = {p["node_rank"]: psutil.Process(p["pid"]).ppid() for p in ranks.values()}
    psutil.Process(agents[1]).send_signal(signal.SIGKILL)  # the node is lost
    _wait_for(lambda: _ready(job_dir, 1, 2), timeout=240, what="attempt 1 to run")
    (state / "go").touch()
    assert phalanx("wait", job_id, "--timeout", "120").returncode == 0
    final = _status(job_id)
    assert final["state"] == "SUCCEEDED"
    assert "node agent 1 was killed by SIGKILL" in final["attempts"][0]["message"]
    lost = _results(job_dir, 0)[1]
    assert lost["synthesized"] and lost.get("agent_pid") is None
    after = {node: r["agent_pid"] for node, r in _results(job_dir, 1).items()}
    assert after[0] == agents[0]  # kept
    assert after[1] not in (None, agents[1])  # a new one took the dead one's place


def test_stop_in_the_retry_window_leaves_nothing_behind(phx_home, tmp_path):
    script = tmp_path / "recover.py"
    script.write_text(SCRIPT)  # attempt 1 never gets its go: only the stop ends it
    job_id = phalanx("run", "-d", "--name", "window", "--max-retries", "1", "-n", "2x1", str(script),
                     check=True).stdout.strip()
    record = _status(job_id)
    job_dir = Path(record["job_dir"])
    supervisor = psutil.Process(record["supervisor_pid"])
    seen: set[int] = set()
    watching = threading.Event()

    def watch() -> None:  # every process the job had: agents, workers, whatever they started
        while not watching.is_set():
            try:
                seen.update(p.pid for p in supervisor.children(recursive=True))
            except psutil.NoSuchProcess:
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        # The supervisor writes the launch files just before it hands the attempt to the agents.
        _wait_for(lambda: (job_dir / "attempt_1" / "node_1" / "launch.json").exists(), timeout=240,
                  what="the retry to start")
        stopped = phalanx("stop", job_id, "--timeout", "60")
    finally:
        watching.set()
        watcher.join()
    assert stopped.returncode == 0, stopped.stderr
    final = _status(job_id)
    assert final["state"] == "CANCELLED"
    assert [a["outcome"] for a in final["attempts"]] == ["failed", "cancelled"]
    seen.update(json.loads(p.read_text())["pid"] for p in job_dir.glob("attempt_*/rank_*/proc.json"))
    assert len(seen) >= 4 and _alive(seen) == []  # two agents and two ranks at least


def test_a_killed_supervisor_takes_its_kept_agents_and_their_workers(phx_home, tmp_path):
    """Issue 17's survival with kept agents: kill -9 the supervisor while the retry runs on the
    agents of the failed attempt (and on workers they started ahead). Nothing of the job survives
    (the line ends, the agents die with their parent, the workers with theirs) and it shows LOST."""
    script = tmp_path / "recover.py"
    script.write_text(SCRIPT)  # attempt 1 never gets its go: it runs until the supervisor is killed
    job_id = phalanx("run", "-d", "--name", "orphaned", "--max-retries", "1", "-n", "2x1", str(script),
                     check=True).stdout.strip()
    record = _status(job_id)
    job_dir = Path(record["job_dir"])
    _wait_for(lambda: _ready(job_dir, 1, 2), timeout=240, what="attempt 1 to run")
    agents = [r["agent_pid"] for r in _results(job_dir, 0).values()]
    workers = [json.loads((job_dir / "attempt_1" / f"rank_{r}" / "proc.json").read_text())["pid"] for r in range(2)]
    assert sorted(psutil.Process(w).ppid() for w in workers) == sorted(agents)  # the retry is on the kept agents
    supervisor = psutil.Process(record["supervisor_pid"])
    tree = [p.pid for p in supervisor.children(recursive=True)]
    assert set(agents) <= set(tree) and set(workers) <= set(tree)
    supervisor.kill()
    _wait_for(lambda: _alive(tree) == [], timeout=30, what="no agent or worker to survive")
    assert _status(job_id)["state"] == "LOST"
