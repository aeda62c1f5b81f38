"""The ray backend on a real Ray cluster (tests/cluster/ray_cluster.py): a head and a worker,
each a "machine" in its own network namespace, with a home of its own (so nothing of a job is
read across nodes or from this machine's job directory: every file that arrives here came through
the Ray job's log), token authentication on and a PATH whose python has no Ray.

One cluster for the whole session; each test is one or two small jobs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, phalanx
from tests.local.test_run import _status

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRAIN = str(EXAMPLES / "train_ddp.py")

SLEEPY = textwrap.dedent("""\
    import time
    import torch.distributed as dist
    dist.init_process_group("gloo")
    for i in range(600):
        print(f"rank {dist.get_rank()} step {i}", flush=True)
        time.sleep(0.3)
""")

BOOM = textwrap.dedent("""\
    import time
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")
    time.sleep(120)
""")


def _detached(*args: str, cwd: Path | None = None) -> str:
    extra = {"cwd": cwd} if cwd else {}
    return phalanx("run", "-d", "--grace", "3", "--backend", "ray", *args, check=True, **extra).stdout.strip()


def _wait(job_id: str, timeout: float = 150) -> dict:
    waited = phalanx("wait", job_id, "--timeout", str(timeout), timeout=timeout + 30)
    if waited.returncode == 124:
        phalanx("stop", job_id, timeout=90)
    return _status(job_id)


def _scheduler(status: dict, attempt: int = 0) -> dict:
    return json.loads(Path(status["job_dir"], f"attempt_{attempt}", "scheduler.json").read_text())


def _job_processes(cluster, job_id: str) -> list[str]:
    """What still runs of ``job_id`` on either node: its agents, ranks or node actors."""
    left = []
    for node in ("head", "worker"):
        for pid in cluster.node_pids(node):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if job_id in cmd or "NodeAgent" in cmd:
                left.append(f"{node}: {pid} {cmd[:120]}")
    return left


def _write(tmp_path: Path, name: str, text: str) -> Path:
    workdir = tmp_path / "project"
    workdir.mkdir(exist_ok=True)
    (workdir / name).write_text(text)
    return workdir


def test_ddp_on_two_ray_nodes(ray_env, phx_home):
    """A real 2-node gloo DDP training: gradients agree, each rank on its own Ray node, and every
    rank's log is in the local job directory, arrived through the Ray job (no shared filesystem)."""
    job_id = _detached("-n", "2x1", TRAIN, "--epochs", "1", "--steps-per-epoch", "3", "--print-grad-checksum")
    status = _wait(job_id)
    logs = phalanx("logs", job_id).stdout
    assert status["state"] == "SUCCEEDED", f"{status}\n{logs}"
    grads = dict(re.findall(r"grad_checksum rank=(\d) value=(\S+)", logs))
    assert set(grads) == {"0", "1"} and grads["0"] == grads["1"], logs
    assert {r["host"] for r in status["ranks"]} == {"ray-head", "ray-worker"}
    scheduler = _scheduler(status)
    assert scheduler["job_id"] == f"phalanx-{job_id}-0" and scheduler["address"] == ray_env.address
    assert sorted(n["ip"] for n in scheduler["nodes"]) == sorted([ray_env.head_addr, ray_env.worker_addr])
    # The nodes ran from their own homes; what is here was relayed, byte for byte.
    for rank in (0, 1):
        node = "head" if status["ranks"][rank]["host"] == "ray-head" else "worker"
        remote = ray_env.home(node) / ".phalanx" / "ray" / "jobs" / job_id / "attempt_0" / f"rank_{rank}" / "output.log"
        local = Path(status["job_dir"], "attempt_0", f"rank_{rank}", "output.log")
        assert local.read_bytes() == remote.read_bytes() and local.stat().st_size > 0
    assert (Path(status["job_dir"]) / "output" / "model.pt").is_file()  # PHALANX_OUTPUT_DIR came back
    shown = phalanx("status", job_id).stdout
    assert f"ray job phalanx-{job_id}-0" in shown.lower(), shown


READS_INPUTS = textwrap.dedent("""\
    import hashlib, os, pathlib, socket
    rank = os.environ["RANK"]
    tree = pathlib.Path(os.environ["PHALANX_CHANNEL_DATA"])
    for f in sorted(p for p in tree.rglob("*") if p.is_file()):
        print(f"rank {rank} on {socket.gethostname()} data {f.relative_to(tree)} {hashlib.sha256(f.read_bytes()).hexdigest()}")
    one = pathlib.Path(os.environ["SM_CHANNEL_VOCAB"])
    print(f"rank {rank} vocab {one.name} {one.read_text()!r}")
""")


def test_inputs_travel_to_every_ray_node(ray_env, phx_home, tmp_path):
    """--input: a local directory (nested, with a binary file) and a single local file reach both
    Ray nodes through the working_dir, byte for byte, where PHALANX_CHANNEL_*/SM_CHANNEL_* say."""
    data = tmp_path / "data"
    (data / "shards").mkdir(parents=True)
    (data / "shards" / "a.bin").write_bytes(os.urandom(200_000))
    (data / "labels.csv").write_text("x,y\n1,2\n")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("hello world")
    workdir = _write(tmp_path, "reads.py", READS_INPUTS)
    job_id = _detached("-n", "2x1", "--input", f"data={data}", "--input", f"vocab={vocab}", "reads.py", cwd=workdir)
    status = _wait(job_id)
    logs = phalanx("logs", job_id).stdout
    assert status["state"] == "SUCCEEDED", f"{status}\n{logs}"
    want = {f"{p.relative_to(data)} {hashlib.sha256(p.read_bytes()).hexdigest()}" for p in data.rglob("*") if p.is_file()}
    for rank in (0, 1):
        seen = set(re.findall(rf"rank {rank} on \S+ data (\S+ \S+)", logs))
        assert seen == want, (rank, seen, want, logs)
        assert f"rank {rank} vocab vocab.txt 'hello world'" in logs, logs
    assert set(re.findall(r"rank \d on (\S+) data", logs)) == {"ray-head", "ray-worker"}, logs


def test_rank_failure_names_rank_node_and_traceback(ray_env, phx_home, tmp_path):
    workdir = _write(tmp_path, "boom.py", BOOM)
    job_id = _detached("-n", "2x1", "boom.py", cwd=workdir)
    status = _wait(job_id)
    assert status["state"] == "FAILED" and status["exit_code"] == 1, status
    cause = status["root_cause"]
    assert cause["rank"] == 1 and "boom on rank 1" in cause["traceback"], cause
    placed = {n["ip"]: n["node_id"] for n in _scheduler(status)["nodes"]}
    ip = cause["host"].split()[0]
    assert ip in placed and placed[ip][:12] in cause["host"], cause  # the Ray node, by IP and id
    # gang: the other node was stopped, not left waiting in its sleep
    assert status["ended_at"] - status["started_at"] < 60, status
    time.sleep(2)
    assert _job_processes(ray_env, job_id) == []


def test_logs_while_running_then_stop_leaves_nothing(ray_env, phx_home, tmp_path):
    workdir = _write(tmp_path, "sleepy.py", SLEEPY)
    job_id = _detached("-n", "2x1", "sleepy.py", cwd=workdir)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        logs = phalanx("logs", job_id).stdout
        if "rank 0 step 3" in logs and "rank 1 step 3" in logs:
            break
        time.sleep(1)
    else:
        pytest.fail(f"no output arrived while the job ran:\n{phalanx('logs', job_id).stdout}\n{_status(job_id)}")
    assert _job_processes(ray_env, job_id), "the job's processes should be running on the nodes"
    stopped = phalanx("stop", job_id, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    status = _status(job_id)
    assert status["state"] == "CANCELLED", status
    deadline = time.monotonic() + 20
    while _job_processes(ray_env, job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _job_processes(ray_env, job_id) == []
    assert ray_env.job_status(f"phalanx-{job_id}-0") == "STOPPED"


def test_lost_node_is_preempted_and_the_retry_resumes_from_the_checkpoint(ray_env, phx_home):
    from tests.cluster import ray_cluster

    job_id = _detached("-n", "2x1", "--max-retries", "1", TRAIN, "--epochs", "1", "--steps-per-epoch", "40",
                       "--checkpoint-every", "5", "--sleep", "0.3")
    state = phx_home / "state" / f"train_ddp-{job_id}" / "checkpoint.pt"  # the job's own (storage/statedir.py)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (state.exists() and "step=12" in phalanx("logs", job_id, "--rank", "0").stdout):
        time.sleep(0.5)
    assert state.exists(), phalanx("logs", job_id).stdout
    killed = time.monotonic()
    ray_cluster.kill_node(ray_env, "worker")  # the machine dies: raylet, actors, agents, ranks
    try:
        # The machine comes back (as a replaced spot instance would) once the loss was noticed.
        while _status(job_id)["attempt"] == 0 and time.monotonic() - killed < 120:
            time.sleep(0.5)
        noticed = time.monotonic() - killed
    finally:
        # The new worker counts only once the GCS has declared the old one dead: else wait_nodes(2)
        # could return on the dead node and the next test would find a one-node cluster.
        deadline = time.monotonic() + 90
        while len(ray_env.alive_nodes()) > 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        ray_cluster.start_node(ray_env, "worker")
        ray_cluster.wait_nodes(ray_env, 2)
    status = _wait(job_id, timeout=180)
    logs = phalanx("logs", job_id, "--rank", "0").stdout
    assert status["state"] == "SUCCEEDED", f"{status}\n{logs}"
    first, second = status["attempts"]
    assert first["outcome"] == "preempted" and first["retry"], (noticed, status["attempts"])
    assert "lost" in Path(status["job_dir"], "attempt_0", "batch.log").read_text()
    resumed = int(re.search(r"resumed from step=(\d+)", logs).group(1))
    assert resumed >= 10 and "step=40" in logs, logs


def test_bad_input_is_one_line_and_exit_2(ray_env, phx_home, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS")
    cases = [
        ((), "needs the cluster's address"),
        (("--address", f"http://{ray_env.head_addr}:1"), "does not answer"),
        (("--address", ray_env.address, "-n", "3x1"), "needs 3 Ray node(s)"),
    ]
    for args, said in cases:
        proc = phalanx("run", "--backend", "ray", *args, TRAIN, timeout=60)
        assert proc.returncode == 2 and said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
    proc = phalanx("run", "--backend", "ray", "--address", ray_env.address, TRAIN, env={"RAY_AUTH_TOKEN": "0" * 64}, timeout=60)
    assert proc.returncode == 2 and "refused the token" in proc.stderr, proc.stderr
    assert json.loads(phalanx("ps", "--all", "--json").stdout) == []  # nothing recorded, nothing submitted


def test_a_cluster_too_small_is_waited_for_at_most_pending_timeout(ray_env, phx_home):
    """With --pending-timeout the job may wait for nodes (an autoscaler); when none come, it fails
    naming what it asked for and what the cluster has, and leaves nothing on the cluster."""
    job_id = _detached("-n", "3x1", "--pending-timeout", "3", TRAIN)
    status = _wait(job_id, timeout=90)
    assert status["state"] == "FAILED", status
    batch = Path(status["job_dir"], "attempt_0", "batch.log").read_text()
    assert "could not be placed within 3s" in batch and ray_env.worker_addr in batch, batch
    assert "could not be placed" in status["root_cause"]["log_tail"], status["root_cause"]
    assert ray_env.job_status(f"phalanx-{job_id}-0") == "FAILED"
    assert _job_processes(ray_env, job_id) == []


def test_sweep_trials_run_as_ray_jobs(ray_env, phx_home):
    proc = phalanx("run", "--backend", "ray", "-n", "1x1", TRAIN, "--epochs", "1", "--steps-per-epoch", "2",
                   "--lr", "[0.1, 0.01]", timeout=300)
    assert proc.returncode == 0, proc.stderr
    sweeps = [row for row in json.loads(phalanx("ps", "--all", "--json").stdout) if row.get("kind") == "sweep"]
    assert len(sweeps) == 1 and sweeps[0]["progress"] == "2/2" and sweeps[0]["state"] == "SUCCEEDED", sweeps
    trials = json.loads(phalanx("sweep", "show", sweeps[0]["id"], "--json", check=True).stdout)["trials"]
    for trial in trials:
        status = _status(trial["id"])
        assert _scheduler(status)["job_id"] == f"phalanx-{trial['id']}-0"
        assert ray_env.job_status(f"phalanx-{trial['id']}-0") == "SUCCEEDED"
        assert "final loss=" in phalanx("logs", trial["id"]).stdout


def test_the_job_outlives_its_supervisor_and_resume_watches_it(ray_env, phx_home, tmp_path):
    """The driver runs on the cluster: a supervisor killed -9 leaves the Ray job running (LOST);
    `phalanx resume` watches that same Ray job to its end instead of submitting another."""
    import os
    import signal

    job_id = _detached("-n", "2x1", TRAIN, "--epochs", "1", "--steps-per-epoch", "150", "--sleep", "0.2")
    deadline = time.monotonic() + 90
    while "step=3 " not in phalanx("logs", job_id, "--rank", "0").stdout and time.monotonic() < deadline:
        time.sleep(0.5)
    os.kill(_status(job_id)["supervisor_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _status(job_id)["state"] != "LOST" and time.monotonic() < deadline:
        time.sleep(0.5)
    shown = phalanx("status", job_id).stdout
    assert f"RAY job phalanx-{job_id}-0" in shown and "still runs without a supervisor" in shown, shown
    resumed = phalanx("resume", job_id, timeout=180)
    status = _status(job_id)
    assert resumed.returncode == 0 and status["state"] == "SUCCEEDED", (resumed.stderr, status)
    assert status["attempt"] == 0 and not Path(status["job_dir"], "attempt_1").exists()  # watched, not resubmitted
    assert "final loss=" in phalanx("logs", job_id, "--rank", "0").stdout


SHOWS_SECRET = textwrap.dedent("""\
    import hashlib, os, sys
    v = os.environ["HF_TOKEN"]
    print("rank", os.environ["RANK"], "sha", hashlib.sha256(v.encode()).hexdigest(), flush=True)
    sys.stdout.write("token " + v[:6]); sys.stdout.flush(); sys.stdout.write(v[6:] + "\\n"); sys.stdout.flush()
""")


def test_a_secret_reaches_both_nodes_through_the_runtime_env(ray_env, phx_home, tmp_path, monkeypatch):
    """--secret on Ray: the value travels in the job's runtime_env (env_vars), reaches the ranks on
    both Ray nodes, is masked in what they print (on the nodes and in what came back), and no file
    of the job here or in the nodes' phalanx homes holds it (Ray's own records do: docs/secrets.md)."""
    canary = f"ray-canary-{time.monotonic_ns()}"
    monkeypatch.setenv("PHALANX_SECRETS_FILE", str(tmp_path / "cfg" / "secrets.json"))
    monkeypatch.setenv("PHALANX_SECRETS_STORE", "file")
    from phalanx.secrets.local import open_store

    open_store().set("HF_TOKEN", canary, owner="test")
    workdir = _write(tmp_path, "shows.py", SHOWS_SECRET)
    job_id = _detached("-n", "2x1", "--secret", "HF_TOKEN", "shows.py", cwd=workdir)
    status = _wait(job_id)
    logs = phalanx("logs", job_id).stdout
    assert status["state"] == "SUCCEEDED", f"{status}\n{logs}"
    digest = hashlib.sha256(canary.encode()).hexdigest()
    assert f"rank 0 sha {digest}" in logs and f"rank 1 sha {digest}" in logs and "token ********" in logs, logs
    places = [Path(os.environ["PHALANX_HOME"]), ray_env.home("head") / ".phalanx", ray_env.home("worker") / ".phalanx"]
    for place in places:
        for path in place.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert canary.encode() not in path.read_bytes(), path
