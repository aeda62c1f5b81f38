"""``phalanx run`` warm against ``phalanx run --cold``: the same script sees the same, trains the
same and leaves the same, for one process, ``-n 2`` under torchrun and a sweep; and nothing of a
job outlives it (runs, Ctrl-C, a SIGKILL of the CLI), while the pool stays for the next run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ..conftest import EXAMPLES, ROOT, phalanx
from .conftest import PROBE, pool_info, wait_for, wait_gone
from .test_differential import differences

pytestmark = pytest.mark.slow


@pytest.fixture
def warm_env(phx_home, pool_dir):
    """phalanx with warm starts on, its pools in this module's directory."""
    return {"PHALANX_WARM": "1", "PHALANX_WARM_DIR": pool_dir}


def _job(phx_home: Path, job_id: str | None = None) -> dict:
    out = phalanx("ps", "--all", "--json", check=True, env={}).stdout
    jobs = json.loads(out)
    return next(j for j in jobs if job_id is None or j["id"] == job_id)


def _warmed(env: dict, *args: str, cwd: Path = ROOT) -> None:
    """Run once so that this environment's pool exists and holds what ``args`` needs (the first
    run of an environment starts its pool and runs cold); wait until it answers."""
    phalanx("run", "--no-snapshot", *args, env=env, check=True, cwd=cwd)
    wait_for(lambda: any(p.get("preloaded") and not p.get("busy") for p in pool_info(env["PHALANX_WARM_DIR"])),
             timeout=300, what="the pool")


def _served(env: dict) -> int:
    return sum(p.get("served", 0) for p in pool_info(env["PHALANX_WARM_DIR"]))


def _job_processes(home: Path) -> list[int]:
    """Every process of a job under ``home``: they carry PHALANX_HOME in their environment (a pool
    does not: it keeps no per-run variable)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get("PHALANX_HOME") == str(home):
                found.append(proc.pid)
        except (psutil.Error, OSError):
            pass
    return found


def _normal(snapshot: dict, job_id: str, port: str | None) -> dict:
    text = json.dumps(snapshot).replace(job_id, "JOB")
    if port:
        text = text.replace(port, "PORT")
    data = json.loads(text)
    start = data["start"]
    for fd in start["stdio"]:  # each job's own rank log
        if fd:
            fd.pop("ino")
    status = start["status"]
    status["SigCgt"] = format(int(status["SigCgt"], 16) & ~(1 << 32), "016x")  # glibc's signal 33, see docs/warm.md
    start["environ"].pop("TORCHELASTIC_ERROR_FILE", None)  # a temporary directory of torchrun's
    return data


def test_one_process_sees_the_same_warm_and_cold(phx_home, warm_env, tmp_path):
    _warmed(warm_env, str(EXAMPLES / "hello.py"))
    results = {}
    out = tmp_path / "probe.json"  # one path for both: the script's argv is the same
    for mode in ("cold", "warm"):
        before = _served(warm_env)
        proc = phalanx("run", "--no-snapshot", "--name", "probe", *(["--cold"] if mode == "cold" else []), str(PROBE),
                       str(out), "--print", env=warm_env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert _served(warm_env) == before + (mode == "warm")
        job = json.loads(phalanx("status", "probe", "--json", check=True).stdout)
        snap = json.loads(out.read_text())
        results[mode] = _normal(snap, job["id"], snap["start"]["environ"].get("MASTER_PORT"))
        assert "probe: hello" in proc.stdout
    diff = differences(results["cold"], results["warm"])
    assert not diff, "\n".join(diff)


def test_two_ranks_under_torchrun_see_what_torchrun_gives_them(phx_home, warm_env, tmp_path):
    """torchrun stays the engine: it sets every rank's environment itself, warm or cold."""
    script = tmp_path / "env.py"
    script.write_text("import json, os, sys, traceback\n"
                      "stack = [(f.filename, f.name) for f in traceback.extract_stack()]\n"
                      "print('ENV', json.dumps({'env': dict(os.environ), 'argv': sys.argv, 'stack': stack}))\n")
    _warmed(warm_env, "-n", "2", str(EXAMPLES / "hello.py"))
    seen = {}
    for mode in ("cold", "warm"):
        before = _served(warm_env)
        proc = phalanx("run", "--no-snapshot", "-n", "2", *(["--cold"] if mode == "cold" else []), str(script),
                       env=warm_env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert _served(warm_env) == before + (3 if mode == "warm" else 0)  # the agent and both workers
        job = _job(phx_home)
        ranks = {}
        for line in proc.stdout.splitlines():
            if "ENV " in line:
                rank = int(line[1:line.index("]")])
                data = json.loads(line.split("ENV ", 1)[1])
                port = data["env"]["MASTER_PORT"]
                data["env"].pop("TORCHELASTIC_ERROR_FILE")
                ranks[rank] = json.loads(json.dumps(data).replace(job["id"], "JOB").replace(port, "PORT"))
        seen[mode] = ranks
    assert sorted(seen["warm"]) == [0, 1]
    for rank in (0, 1):
        contract = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
                    "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE")
        assert all(k in seen["warm"][rank]["env"] for k in contract)
        diff = differences(seen["cold"][rank], seen["warm"][rank])
        assert not diff, "\n".join(diff)


def _losses(job_dir: str) -> dict[int, list[str]]:
    out = {}
    for log in sorted(Path(job_dir).glob("attempt_0/rank_*/output.log")):
        out[int(log.parent.name.split("_")[1])] = [line for line in log.read_text().splitlines() if "loss=" in line]
    return out


def test_ddp_training_with_gloo_gives_the_same_losses(phx_home, warm_env):
    _warmed(warm_env, "-n", "2", str(EXAMPLES / "hello.py"))
    losses = {}
    for mode in ("cold", "warm"):
        before = _served(warm_env)
        phalanx("run", "--no-snapshot", "--clean-state", "-n", "2", *(["--cold"] if mode == "cold" else []),
                str(EXAMPLES / "train_ddp.py"), "--epochs", "2", "--steps-per-epoch", "5", "--checkpoint-every", "0",
                env=warm_env, check=True)
        assert _served(warm_env) == before + (3 if mode == "warm" else 0)
        losses[mode] = _losses(_job(phx_home)["job_dir"])
    assert losses["warm"] == losses["cold"] and len(losses["warm"][0]) == 11  # 10 steps and the final loss


def test_sweep_trials_give_the_same_results(phx_home, warm_env, tmp_path):
    trial = tmp_path / "trial.py"
    trial.write_text("import argparse, random, torch\n"
                     "p = argparse.ArgumentParser(); p.add_argument('--lr', type=float); a = p.parse_args()\n"
                     "torch.manual_seed(0); random.seed(1)\n"
                     "w = torch.zeros(3, requires_grad=True); x = torch.randn(16, 3); y = x.sum(1)\n"
                     "for step in range(5):\n"
                     "    loss = ((x @ w - y) ** 2).mean(); loss.backward()\n"
                     "    with torch.no_grad(): w -= a.lr * w.grad; w.grad = None\n"
                     "    print(f'step={step} loss={loss.item():.6f} r={random.random():.6f}', flush=True)\n")
    _warmed(warm_env, str(trial), "--lr", "0.1", cwd=tmp_path)
    shown = {}
    for mode in ("cold", "warm"):
        before = _served(warm_env)
        proc = phalanx("run", "--no-snapshot", "--name", f"sweep-{mode}", "--parallel", "2", "--objective", "loss:min",
                       *(["--cold"] if mode == "cold" else []), str(trial), "--lr", "[0.01,0.05,0.1,0.2]",
                       env=warm_env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert _served(warm_env) == before + (4 if mode == "warm" else 0)
        rows = json.loads(phalanx("sweep", "show", f"sweep-{mode}", "--json", check=True).stdout)["trials"]
        shown[mode] = sorted((json.dumps(r["params"], sort_keys=True), r["objective"], r["state"]) for r in rows)
        shown[f"{mode}-logs"] = sorted((json.dumps(r["params"], sort_keys=True), Path(r["job_dir"], "attempt_0", "rank_0", "output.log").read_text())
                                       for r in rows)
    assert shown["warm"] == shown["cold"] and len(shown["warm"]) == 4
    assert shown["warm-logs"] == shown["cold-logs"]


def _train(env: dict, home: Path) -> subprocess.Popen:
    known = set(home.glob("jobs/*"))
    cli = subprocess.Popen([sys.executable, "-m", "phalanx", "run", "--no-snapshot", "--grace", "5", "-n", "2",
                            str(EXAMPLES / "train_ddp.py"), "--epochs", "50", "--sleep", "0.1"],
                           cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    job = wait_for(lambda: next((j for j in home.glob("jobs/*") if j not in known), None), what="the job")
    wait_for(lambda: all(job.joinpath("attempt_0", f"rank_{r}", "output.log").exists() for r in (0, 1))
             and "step=" in job.joinpath("attempt_0", "rank_0", "output.log").read_text(), timeout=120,
             what="training to start")
    return cli


def test_ctrl_c_and_sigkill_of_the_cli_leave_no_job_process(phx_home, warm_env):
    _warmed(warm_env, "-n", "2", str(EXAMPLES / "hello.py"))
    pools = [p["pid"] for p in pool_info(warm_env["PHALANX_WARM_DIR"])]
    before = _served(warm_env)
    cli = _train(warm_env, phx_home)
    assert _served(warm_env) == before + 3
    running = _job_processes(phx_home)
    assert len(running) >= 6  # the CLI, 3 stand-ins, the agent and 2 workers
    os.killpg(cli.pid, signal.SIGINT)  # Ctrl-C at the terminal
    _out, err = cli.communicate(timeout=90)
    assert cli.returncode == 130 and "cancelled" in err
    assert wait_gone(running) == []
    cli = _train(warm_env, phx_home)
    running = _job_processes(phx_home)
    cli.kill()  # SIGKILL: no chance to clean up; the stand-ins die with it, the pool kills what they stood for
    cli.wait()
    assert wait_gone(running) == []
    assert _job_processes(phx_home) == []
    assert all(psutil.pid_exists(pid) for pid in pools)  # the pool itself is not the job's: it stays


def test_pool_commands(phx_home, warm_env):
    _warmed(warm_env, str(EXAMPLES / "hello.py"))
    status = phalanx("pool", "status", env=warm_env, check=True).stdout
    assert "ready" in status and "RSS/PSS" in status
    listed = json.loads(phalanx("pool", "status", "--json", env=warm_env, check=True).stdout)
    pids = [p["pid"] for p in listed]
    bad = phalanx("pool", "stop", "nosuchpool", env=warm_env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no warm pool 'nosuchpool'" in bad.stderr
    stopped = phalanx("pool", "stop", env=warm_env, check=True).stdout
    assert all(f"pid {pid}" in stopped for pid in pids)
    assert wait_gone(pids) == []
    assert "no warm pools" in phalanx("pool", "status", env=warm_env, check=True).stdout
