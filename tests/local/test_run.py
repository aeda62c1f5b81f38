"""Real processes: real torchrun, real gloo DDP on CPU, real signals. No fakes here."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import EXAMPLES, ROOT, phalanx

pytestmark = pytest.mark.local


def _status(job: str) -> dict:
    return json.loads(phalanx("status", job, "--json", check=True).stdout)


def _only_job() -> dict:
    jobs = json.loads(phalanx("ps", "--all", "--json", check=True).stdout)
    assert len(jobs) == 1, jobs
    return jobs[0]


def _wait_for(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _rank_pids(job_dir: str) -> list[int]:
    return [json.loads(p.read_text())["pid"] for p in Path(job_dir).glob("attempt_*/rank_*/proc.json")]


def test_ddp_two_processes_synchronise_gradients(phx_home):
    proc = phalanx("run", "-n", "2", str(EXAMPLES / "train_ddp.py"), "--epochs", "1", "--steps-per-epoch", "3",
                   "--print-grad-checksum", check=True)
    grads = dict(re.findall(r"grad_checksum rank=(\d) value=(\S+)", proc.stdout))
    batches = dict(re.findall(r"local_batch_checksum rank=(\d) value=(\S+)", proc.stdout))
    assert set(grads) == {"0", "1"}
    assert grads["0"] == grads["1"], "DDP must all-reduce gradients across ranks"
    assert batches["0"] != batches["1"], "each rank must see different data"
    assert "[0] done" in proc.stdout
    job = _only_job()
    assert job["state"] == "SUCCEEDED" and job["exit_code"] == 0 and job["topology"] == "1x2"
    ranks = _status(job["id"])["ranks"]
    assert [(r["rank"], r["exitcode"], r["state"]) for r in ranks] == [(0, 0, "succeeded"), (1, 0, "succeeded")]
    # each rank's own log, without prefixes from a tee
    log1 = Path(job["job_dir"], "attempt_0", "rank_1", "output.log").read_text()
    assert "grad_checksum rank=1" in log1 and "[1]" not in log1


def test_two_nodes_rendezvous_over_loopback(phx_home):
    proc = phalanx("run", "-n", "2x2", str(EXAMPLES / "hello.py"), check=True)
    hellos = sorted(re.findall(r"hello from rank (\d) of (\d)", proc.stdout))
    assert hellos == [("0", "4"), ("1", "4"), ("2", "4"), ("3", "4")]
    job = _only_job()
    results = [json.loads(Path(job["job_dir"], "attempt_0", f"node_{n}", "result.json").read_text()) for n in (0, 1)]
    assert [r["exitcode"] for r in results] == [0, 0]
    nodes = {r["node_rank"] for r in _status(job["id"])["ranks"]}
    assert nodes == {0, 1}, "ranks must be spread over the two node agents"


def test_environment_contract(phx_home, tmp_path):
    script = tmp_path / "envdump.py"
    script.write_text(
        "import json, os\n"
        "keys = [k for k in os.environ if k.startswith(('PHALANX_', 'SM_')) or k in "
        "('RANK','LOCAL_RANK','WORLD_SIZE','LOCAL_WORLD_SIZE','GROUP_RANK','MASTER_ADDR','MASTER_PORT','TORCHELASTIC_RESTART_COUNT')]\n"
        "print('ENV ' + json.dumps({k: os.environ[k] for k in keys}))\n"
    )
    proc = phalanx("run", "--name", "envjob", "-n", "2x1", str(script), check=True)
    envs = [json.loads(line.split("ENV ", 1)[1]) for line in proc.stdout.splitlines() if "ENV " in line]
    assert len(envs) == 2
    job = _only_job()
    for env in envs:
        assert env["PHALANX_JOB_ID"] == job["id"]
        assert env["PHALANX_ATTEMPT"] == "0"
        assert env["PHALANX_NUM_NODES"] == "2" and env["PHALANX_NPROC_PER_NODE"] == "1"
        assert env["PHALANX_NODE_ADDRS"] == "127.0.0.1,127.0.0.1"
        assert env["PHALANX_STATE_DIR"] == str(phx_home / "state" / "envjob")
        assert Path(env["PHALANX_OUTPUT_DIR"]).is_dir()
        assert env["WORLD_SIZE"] == "2" and env["MASTER_ADDR"] == "127.0.0.1"
        assert json.loads(env["SM_HOSTS"]) == ["node-0", "node-1"]
        assert env["SM_MODEL_DIR"] == env["PHALANX_OUTPUT_DIR"]
    assert sorted(e["RANK"] for e in envs) == ["0", "1"]
    assert sorted(e["PHALANX_NODE_RANK"] for e in envs) == ["0", "1"]
    # -n 1 runs without torchrun but sees the same variables
    single = phalanx("run", "--name", "envjob", "-n", "1", str(script), check=True)
    env = json.loads(single.stdout.split("ENV ", 1)[1])
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("0", "1", "0")
    assert int(env["MASTER_PORT"]) > 0
    # no topology: as python, no launcher variables (tests/differential compares with python)
    plain = json.loads(phalanx("run", "--name", "envjob", str(script), check=True).stdout.split("ENV ", 1)[1])
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"} & set(plain) and plain["PHALANX_NUM_NODES"] == "1"


def test_spawn_self_with_templated_args(phx_home):
    proc = phalanx(
        "run", "--spawn", "self", "-n", "2x2", str(EXAMPLES / "spawn_self.py"),
        "--node-rank", "{node_rank}", "--num-nodes", "{num_nodes}", "--nproc-per-node", "{nproc_per_node}",
        "--master-addr", "{master_addr}", "--master-port", "{master_port}", check=True,
    )
    found = sorted(re.findall(r"spawned rank=(\d) world=(\d) sum=(\d)", proc.stdout))
    assert found == [(str(r), "4", "4") for r in range(4)]


def test_failure_shows_first_failing_rank_with_traceback(phx_home):
    proc = phalanx("run", "-n", "2", str(EXAMPLES / "train_ddp.py"), "--epochs", "1", "--steps-per-epoch", "10",
                   "--fail-at-step", "2", "--fail-rank", "1", "--checkpoint-every", "0")
    assert proc.returncode == 1
    assert "rank 1 on node 0 (exit code 1): RuntimeError: injected failure at step 2" in proc.stderr
    job = _only_job()
    status = _status(job["id"])
    assert status["state"] == "FAILED"
    cause = status["root_cause"]
    assert cause["rank"] == 1 and cause["exitcode"] == 1 and cause["type"] == "RuntimeError"
    assert 'raise RuntimeError(f"injected failure' in cause["traceback"]
    assert "phalanx/launch/bootstrap.py" not in cause["traceback"]
    states = {r["rank"]: r["state"] for r in status["ranks"]}
    # Rank 0 is stopped, or failed on its own ("Connection closed by peer") if that came first.
    assert states[1] == "failed" and states[0] in ("stopped", "failed"), states
    text = phalanx("status", job["id"], check=True).stdout
    assert "root cause: rank 1 on node 0: RuntimeError: injected failure at step 2" in text, text
    # `logs` starts at the cause: rank 1's log first, said in one line; rank 0, which only lost
    # its peer (gloo's "Connection closed by peer" after rank 1 raised), folded under one line.
    logs = phalanx("logs", job["id"], check=True)
    assert f"job {job['id']}: rank 1 failed first (RuntimeError: injected failure at step 2): its log comes first" \
        in logs.stderr, logs.stderr
    lines = logs.stdout.splitlines()
    first_of = {rank: next(i for i, line in enumerate(lines) if line.startswith(f"[{rank}] ")) for rank in (0, 1)}
    assert first_of[1] < first_of[0] and "[1] RuntimeError: injected failure at step 2" in lines, logs.stdout
    # Rank 0 is blocked in the all-reduce rank 1 never joined, and train_ddp.py's SIGTERM handler
    # lets it run on when torch stops it: it raises gloo's error once rank 1's process is gone.
    whole = phalanx("logs", job["id"], "--rank", "0", check=True).stdout
    assert "Connection closed by peer" in whole, whole
    assert [p["rank"] for p in status["peer_lost"]] == [0] and status["ranks"][0]["peer_lost"], status["peer_lost"]
    assert status["root_cause_rank"] == 1
    assert logs.stdout.count("Connection closed by peer") == 1, logs.stdout
    folded = [line for line in lines if "lost its peer" in line]
    assert len(folded) == 1 and folded[0].startswith("[0] rank 0: lost its peer after rank 1 failed (RuntimeError: "
                                                      "Connection closed by peer"), logs.stdout
    assert not any(line.startswith("[0] Traceback") for line in lines), "the collateral trace is folded"
    assert "; rank 0 lost its peer after it (folded)" in logs.stderr
    assert "rank 0: lost its peer after rank 1 failed" in text


def test_a_short_failed_job_without_metrics_says_so(phx_home, tmp_path):
    # Two seconds, no name=value output, a KeyError: status keeps the exception's type, says no
    # metrics were reported (and how to report some), and sums up its few resource samples.
    script = tmp_path / "short.py"
    script.write_text("import time\nprint('loading the config', flush=True)\ntime.sleep(2)\n"
                      "config = {'lr': 0.1}\nbs = config['batch_size']\n")
    assert phalanx("run", "--name", "short", str(script)).returncode == 1
    job = _only_job()["id"]
    text = phalanx("status", job, check=True).stdout
    assert "root cause: rank 0 on node 0: KeyError: 'batch_size'" in text, text
    assert "metrics   no metrics were reported: print name=value pairs (loss=0.42) or declare one with " \
           "--metric NAME=REGEX" in text, text
    view = _status(job)
    assert view["root_cause_error"] == "KeyError: 'batch_size'" and view["metrics_note"].startswith("no metrics were reported")
    summary = view["resources_summary"]
    assert summary is not None and 1 <= summary["samples"] < 4 and summary["nodes"][0]["mem_total"] > 0, summary
    assert re.search(r"^resources node 0 \(.+\): \d samples?, CPU peak \d+% of \d+ cores, memory peak", text, re.M), text
    said = phalanx("metrics", job, check=True).stdout
    assert said.startswith(f"no metrics were reported by job {job}") and "--metric NAME=REGEX" in said, said


def test_root_cause_is_the_rank_that_raised_not_the_peer_that_died_first(phx_home, tmp_path):
    # Rank 1 raises but is slow to exit (as a torch worker tearing down is); rank 0, cut off
    # by it, aborts at once. torch notices only rank 0 and SIGTERMs rank 1.
    script = tmp_path / "casualty.py"
    script.write_text(
        "import atexit, os, pathlib, time\n"
        "rank_dir = lambda r: pathlib.Path(os.environ['PHALANX_RANK_DIR'].replace('{rank}', str(r)))\n"
        "if os.environ['RANK'] == '1':\n"
        "    atexit.register(time.sleep, 60)\n"
        "    raise RuntimeError('the real problem')\n"
        "while not (rank_dir(1) / 'error.json').exists():\n"
        "    time.sleep(0.01)\n"
        "os.abort()\n"
    )
    proc = phalanx("run", "--grace", "3", "-n", "2", str(script))
    assert proc.returncode == 1, proc.stderr
    assert "rank 1 on node 0 (exit code 1): RuntimeError: the real problem" in proc.stderr
    cause = _status(_only_job()["id"])["root_cause"]
    assert (cause["rank"], cause["type"], cause["message"]) == (1, "RuntimeError", "the real problem")
    states = {r["rank"]: r["state"] for r in _status(_only_job()["id"])["ranks"]}
    assert states == {0: "failed", 1: "failed"}


@pytest.mark.parametrize("exit_arg, code", [("3", 3), ("'bye'", 1), ("None", 0)])
def test_a_worker_ends_as_python_would_nothing_unflushed_is_lost(phx_home, tmp_path, exit_arg, code):
    # The bootstrap skips the interpreter's teardown (torch aborts in it now and then); what a
    # script can see of Python's exit must still happen.
    script = tmp_path / "ending.py"
    script.write_text(
        "import atexit, ctypes, sys, threading, time\n"
        f"text = open({str(tmp_path / 'text.txt')!r}, 'w')\n"
        "text.write('never closed, never flushed')\n"
        f"data = open({str(tmp_path / 'data.bin')!r}, 'wb')\n"
        "data.write(b'binary too')\n"
        "def late():\n"
        "    time.sleep(0.5)\n"
        "    print('the thread finished', flush=True)\n"
        "threading.Thread(target=late).start()\n"
        "atexit.register(print, 'atexit ran')\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.fopen.restype = ctypes.c_void_p\n"
        "libc.fputs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]\n"
        f"libc.fputs(b'from C stdio', libc.fopen({str(tmp_path / 'c.txt').encode()!r}, b'w'))\n"
        f"sys.exit({exit_arg})\n"
    )
    proc = phalanx("run", str(script))
    assert proc.returncode == code, proc.stderr
    assert (tmp_path / "text.txt").read_text() == "never closed, never flushed"
    assert (tmp_path / "data.bin").read_bytes() == b"binary too"
    log = phalanx("logs", _only_job()["id"], "--rank", "0", check=True).stdout
    assert log.index("the thread finished") < log.index("atexit ran"), log
    assert (tmp_path / "c.txt").read_text() == "from C stdio"
    assert ("bye" in log) is (exit_arg == "'bye'")


def test_the_exit_adds_nothing_to_a_torch_workers_log(phx_home, tmp_path):
    # Looking for open files among torch's objects must not touch them: some warn when read.
    script = tmp_path / "quiet.py"
    script.write_text("import torch.distributed\nprint('done')\n")
    phalanx("run", str(script), check=True)
    assert phalanx("logs", _only_job()["id"], "--rank", "0", check=True).stdout == "done\n"


def test_killed_rank_reports_signal(phx_home, tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import os, signal, time\nif os.environ['RANK'] == '1':\n    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(60)\n")
    proc = phalanx("run", "--grace", "3", "-n", "2", str(script))
    assert proc.returncode == 128 + signal.SIGKILL
    assert "rank 1 on node 0 (killed by SIGKILL)" in proc.stderr
    assert _only_job()["state"] == "FAILED"


def test_native_crash_leaves_the_python_stack_in_the_rank_log(phx_home, tmp_path):
    script = tmp_path / "native.py"
    script.write_text("import os\n\ndef save_checkpoint():\n    os.abort()  # as a C++ std::terminate would\n\nsave_checkpoint()\n")
    proc = phalanx("run", str(script))
    assert proc.returncode == 128 + signal.SIGABRT
    assert "killed by SIGABRT" in proc.stderr
    log = phalanx("logs", _only_job()["id"], "--rank", "0", check=True).stdout
    assert "Fatal Python error: Aborted" in log and "in save_checkpoint" in log, log


def test_ctrl_c_cancels_and_leaves_no_process(phx_home):
    cli = subprocess.Popen(
        [sys.executable, "-m", "phalanx", "run", "--grace", "5", "-n", "2", str(EXAMPLES / "train_ddp.py"),
         "--epochs", "50", "--sleep", "0.1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        _wait_for(lambda: (phx_home / "jobs").exists() and list((phx_home / "jobs").glob("*/attempt_0/rank_1/output.log"))
                  and "step=" in "".join(p.read_text() for p in (phx_home / "jobs").glob("*/attempt_0/rank_0/output.log")),
                  what="training to start")
        tree = [p.pid for p in psutil.Process(cli.pid).children(recursive=True)]
        assert len(tree) >= 3  # agent + 2 workers
        os.killpg(cli.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
    assert cli.returncode == 130, err
    assert "cancelled" in err
    assert _only_job()["state"] == "CANCELLED"
    assert _alive(tree) == []


def test_detached_run_logs_follow_and_stop(phx_home):
    proc = phalanx("run", "-d", "--json", "--grace", "5", "-n", "2", str(EXAMPLES / "train_ddp.py"),
                   "--epochs", "50", "--sleep", "0.1", check=True)
    job_id = json.loads(proc.stdout)["id"]
    follower = subprocess.Popen([sys.executable, "-m", "phalanx", "logs", "-f", job_id], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _status(job_id)["state"] == "RUNNING" and "step=" in phalanx("logs", job_id, "--rank", "0").stdout,
                  what="detached job to train")
        job = _status(job_id)
        supervisor = psutil.Process(job["supervisor_pid"])
        tree = [supervisor.pid] + [p.pid for p in supervisor.children(recursive=True)]
        assert phalanx("ps", check=True).stdout.count(job_id) == 1
        stopped = phalanx("stop", job_id, check=True)
        assert "CANCELLED" in stopped.stdout
        out, _ = follower.communicate(timeout=30)  # logs -f ends when the job does
    finally:
        if follower.poll() is None:
            follower.kill()
    assert "[0] epoch=1 step=1 " in out
    assert _alive(tree) == [] and _alive(_rank_pids(job["job_dir"])) == []
    assert phalanx("stop", job_id, check=True).returncode == 0  # idempotent
    rank1 = phalanx("logs", job_id, "--rank", "1", "--attempt", "0", check=True).stdout
    assert "[1]" not in rank1


def test_supervisor_killed_marks_job_lost_and_leaves_no_orphans(phx_home):
    job_id = phalanx("run", "-d", "-n", "2x1", str(EXAMPLES / "train_ddp.py"), "--epochs", "50", "--sleep", "0.1",
                     check=True).stdout.strip()
    _wait_for(lambda: "step=" in phalanx("logs", job_id, "--rank", "0").stdout, what="training")
    job = _status(job_id)
    supervisor = psutil.Process(job["supervisor_pid"])
    tree = [p.pid for p in supervisor.children(recursive=True)] + _rank_pids(job["job_dir"])
    supervisor.kill()
    _wait_for(lambda: _alive(tree) == [], timeout=30, what="agents and workers to die with the supervisor")
    assert _status(job_id)["state"] == "LOST"


def test_wait_returns_job_exit_code(phx_home, tmp_path):
    script = tmp_path / "exit3.py"
    script.write_text("import time, sys\ntime.sleep(0.5)\nsys.exit(3)\n")
    job_id = phalanx("run", "-d", str(script), check=True).stdout.strip()
    assert phalanx("wait", job_id).returncode == 3
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ntime.sleep(30)\n")
    job2 = phalanx("run", "-d", str(slow), check=True).stdout.strip()
    timed_out = phalanx("wait", job2, "--timeout", "0.5")
    assert timed_out.returncode == 124 and "still RUNNING" in timed_out.stderr
    phalanx("stop", job2, check=True)


def test_module_command_and_job_file(phx_home, tmp_path):
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import sys\nprint('module args', sys.argv[1:])\n")
    out = phalanx("run", "-m", "my_pkg.train", "--epochs", "3", cwd=tmp_path, check=True).stdout
    assert "module args ['--epochs', '3']" in out
    out = phalanx("run", "-n", "2", "--", "bash", "-c", "echo rank=$RANK of $WORLD_SIZE", check=True).stdout
    assert sorted(re.findall(r"rank=(\d) of (\d)", out)) == [("0", "2"), ("1", "2")]
    (tmp_path / "job.yaml").write_text("name: fromfile\nmodule: my_pkg.train\nargs: [--lr, '0.01', --bs, '8']\n")
    out = phalanx("run", "-f", "job.yaml", "--lr", "0.1", cwd=tmp_path, check=True).stdout
    assert "module args ['--lr', '0.1', '--bs', '8']" in out
    assert json.loads(phalanx("status", "fromfile", "--json", check=True).stdout)["name"] == "fromfile"


def test_tf_and_jax_environments(phx_home):
    out = phalanx("run", "--framework", "tf", "-n", "2x1", str(EXAMPLES / "tf_config_check.py"), check=True).stdout
    assert sorted(re.findall(r"tf_config workers=(\d) index=(\d)", out)) == [("2", "0"), ("2", "1")]
    pytest.importorskip("jax")
    out = phalanx("run", "--framework", "jax", "-n", "2x1", str(EXAMPLES / "jax_hello.py"), check=True).stdout
    assert out.count("allgather=[0, 1]") == 2
    assert "process_count=2" in out


def test_dry_run_prints_plan_and_starts_nothing(phx_home):
    out = phalanx("run", "--dry-run", "-n", "2x2", str(EXAMPLES / "hello.py"), "--x", "1", check=True).stdout
    assert "[node 0 @ localhost-0]" in out and "[node 1 @ localhost-1]" in out
    assert "--rdzv-backend=c10d" in out and "/code " in out and "--script " in out  # frozen in the code snapshot
    assert f"cwd:      {ROOT}" in out  # ... but run where the command was typed
    assert json.loads(phalanx("ps", "--all", "--json", check=True).stdout) == []


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "missing.py"], "script 'missing.py' not found"),
        (["run", "-n", "2y3", "examples/hello.py"], "invalid -n '2y3'"),
        (["run", "--bogus", "examples/hello.py"], "no such option: --bogus"),
        (["run", "-f", "nope.yaml"], "job file 'nope.yaml' not found"),
        (["status", "deadbeef"], "no job with id or name 'deadbeef'"),
        (["logs"], "missing argument"),
        (["frobnicate"], "no such command"),
    ],
)
def test_bad_input_is_one_line_exit_2(phx_home, args, message):
    proc = phalanx(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_debug_shows_traceback(phx_home):
    proc = phalanx("--debug", "run", "missing.py")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.parametrize("argv", [["--help"], ["ps"], ["ps", "--all"], ["status", "x"]])
def test_cli_does_not_import_torch(phx_home, argv):
    probe = (
        "import sys\nfrom phalanx.cli.main import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60).stdout
    assert out.strip().endswith("NO-TORCH")
