"""The same CLI from every laptop: alice (admin), bob and carol on one real server, each with real
CLI processes of their own. Every verb prints what it prints locally; who may act on which job is
checked by the face (403 with one line); logs follow over one long HTTP answer; Ctrl-C of a
remote foreground run is the job's Ctrl-C."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.server.conftest import Person, cli

pytestmark = [pytest.mark.local]

TICKS = """
import sys, time
n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
for i in range(n):
    print(f"tick {i} loss={1.0 / (i + 1):.4f}", flush=True)
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0.2)
"""
INTERRUPTIBLE = """
import sys, time
print("started", flush=True)
try:
    for i in range(600):
        time.sleep(0.1)
except KeyboardInterrupt:
    print("got ctrl-c, saving", flush=True)
    sys.exit(7)
"""
FAILS = """
import sys
print("about to fail", flush=True)
sys.exit(int(sys.argv[1]))
"""


def project(person: Person) -> Path:
    where = person.root / "project"
    where.mkdir(exist_ok=True)
    (where / "ticks.py").write_text(TICKS)
    (where / "interruptible.py").write_text(INTERRUPTIBLE)
    (where / "fails.py").write_text(FAILS)
    return where


def job_of(stderr: str) -> str:
    return re.search(r"phalanx: job ([0-9a-f]{8}) ", stderr).group(1)  # type: ignore[union-attr]


def normal(text: str, *ids: str) -> str:
    """Output with what differs between two runs replaced: ids, times, durations, paths."""
    for n, job in enumerate(ids):
        text = text.replace(job, f"JOB{n}")
    text = re.sub(r"[0-9.,e+-]+ (GPU|CPU)-(h|s)\b", r"N \1-time", text)  # device time in the unit that fits it
    text = re.sub(r"resources .*", "resources R", text)  # the machine's load and memory when sampled
    text = re.sub(r"\b\d+(\.\d+)?s\b|\b\d+m\d+s\b", "T", text)
    text = re.sub(r"\d+s ago|\d+m ago", "AGO", text)
    text = re.sub(r"/\S+", "PATH", text)
    # pids, of any length: the machine's pids wrap at pid_max (32768 here), so a run may get pid 415
    text = re.sub(r"\bpid \d+", "pid PID", text)
    text = re.sub(r"^(\d+ +\d+ +\S+ +)\d+", r"\1PID", text, flags=re.M)  # a rank row's PID column
    text = re.sub(r"\b\d{4,}\b", "PID", text)
    return re.sub(r"[0-9.]+e-\d+|\b0\.\d{3,}\b", "N", text)


def test_every_verb_prints_what_it_prints_locally(team):
    srv, alice, bob = team
    where = project(bob)
    results = {}
    for mode in ("remote", "local"):
        lead = ["--local"] if mode == "local" else []

        def run(*args: str, ok: tuple[int, ...] = (0,), lead: list[str] = lead, mode: str = mode) -> subprocess.CompletedProcess[str]:
            done = bob.run(*lead, *args, cwd=where)
            assert done.returncode in ok, f"{mode} {args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
            return done

        ran = run("run", "ticks.py", "4", "0.05")
        failed = run("run", "fails.py", "3", ok=(3,))
        job, bad = job_of(ran.stderr), job_of(failed.stderr)
        detached = run("run", "-d", "-n", "2", "ticks.py", "3", "0.05")
        other = detached.stdout.strip()
        waited = run("wait", other)
        out = {
            "run": (ran.stdout, normal(ran.stderr, job)),
            "failed": (failed.stdout, normal(failed.stderr, bad), failed.returncode),
            "wait": normal(waited.stderr, other),
            "logs": run("logs", job).stdout,
            "logs2": run("logs", other, "--tail", "2").stdout,
            "rank": run("logs", other, "--rank", "1").stdout,
            "metrics": normal(run("metrics", job).stdout, job),
            "jsonl": [{k: v for k, v in json.loads(line).items() if k != "time"}
                      for line in run("metrics", job, "--jsonl").stdout.splitlines()],
            "status": normal(run("status", bad).stdout, bad),
            "status_json": sorted(json.loads(run("status", job, "--json").stdout)),
            "ps": normal(run("ps", "--all").stdout, job, bad, other),
            "top": normal(run("top", other, "--once").stdout, other),
            "artifacts": normal(run("artifacts", job).stdout, job),
            "usage": [r["jobs"] for r in json.loads(run("usage", "--json").stdout)],
            "rm_dry": normal(run("rm", "--dry-run", bad).stdout, bad),
            "rm": normal(run("rm", bad).stdout, bad),
            "gone": normal(run("status", bad, ok=(2,)).stderr, bad),
        }
        results[mode] = out
    remote, local = results["remote"], results["local"]
    for key in local:
        if key in ("ps", "top", "rm_dry", "rm", "artifacts"):
            continue  # sizes differ, and a job that ran detached (all do on a server) has a supervisor's log
        assert remote[key] == local[key], f"{key}: remote {remote[key]!r} != local {local[key]!r}"
    assert remote["ps"].splitlines()[0] == local["ps"].splitlines()[0] and len(remote["ps"].splitlines()) == 4
    assert remote["artifacts"].splitlines()[0] == local["artifacts"].splitlines()[0]
    assert remote["top"].splitlines()[0][:-8] == local["top"].splitlines()[0][:-8]  # but the clock
    assert remote["rm"].startswith("removed 1 job(s)") and local["rm"].startswith("removed 1 job(s)")
    assert not (bob.root / "home" / "jobs").exists() or len(list((bob.root / "home" / "jobs").iterdir())) == 2


def test_only_the_submitter_or_an_admin_may_stop_resume_or_remove(team, tmp_path):
    srv, alice, bob = team
    carol = Person("carol", tmp_path / "carol", srv.add_user("carol"))
    carol.root.mkdir()
    assert carol.login(srv.url).returncode == 0
    where = project(bob)
    job = bob.run("run", "-d", "ticks.py", "600", "0.1", cwd=where).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", job)

    refused = carol.run("stop", job)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == f"phalanx: error: job {job} belongs to bob; only bob or an admin may stop it\n"
    assert carol.run("status", job).returncode == 0, "one team: everyone sees every job"
    assert "RUNNING" in bob.run("status", job).stdout
    stopped = bob.run("stop", job)
    assert stopped.returncode == 0 and stopped.stdout.strip() == f"{job} CANCELLED", stopped.stderr
    assert carol.run("resume", "-d", job).stderr == \
        f"phalanx: error: job {job} belongs to bob; only bob or an admin may resume it\n"
    assert bob.run("resume", "-d", job).stdout.strip() == job
    _until_running(bob, job)  # a supervisor stopped while it starts up ends LOST, with or without a server
    assert alice.run("stop", job).stdout.strip() == f"{job} CANCELLED", "an admin may stop anyone's"
    assert carol.run("rm", job).stderr == f"phalanx: error: job {job} belongs to bob; only bob or an admin may remove it\n"
    pruned = carol.run("prune", "--older-than", "0s", "--dry-run")
    assert pruned.returncode == 2 and "only an admin may prune" in pruned.stderr
    assert alice.run("prune", "--older-than", "0s", "--dry-run").returncode == 0
    assert bob.run("rm", job).stdout.startswith("removed 1 job(s)")
    listed = json.loads(alice.run("usage", "--by", "user", "--json").stdout)
    assert "bob" in {row["group"] for row in listed}


def _until_running(person: Person, job: str) -> None:
    for _ in range(600):
        status = json.loads(person.run("status", job, "--json").stdout)
        if status["state"] == "RUNNING" and status["ranks"]:
            return
    raise AssertionError(f"job {job} did not start again")


def test_logs_follow_is_one_long_answer_and_ends_with_the_job(team):
    srv, alice, bob = team
    where = project(bob)
    before = _count(srv, "GET", "/api/v1/jobs/{ref}/logs")
    job = bob.run("run", "-d", "ticks.py", "12", "0.25", cwd=where).stdout.strip()
    followed = alice.run("logs", "-f", job)
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.splitlines() == [f"tick {i} loss={1.0 / (i + 1):.4f}" for i in range(12)]
    assert _count(srv, "GET", "/api/v1/jobs/{ref}/logs") == before + 1, "followed over one request, not by polling"


def _count(srv, method: str, route: str) -> int:
    text = urllib.request.urlopen(f"{srv.url}/metrics", timeout=30).read().decode()
    found = re.search(rf'phalanx_http_request_duration_seconds_count{{method="{method}",route="{re.escape(route)}"}} (\d+)', text)
    return int(found.group(1)) if found else 0


def test_ctrl_c_of_a_remote_run_is_the_jobs_ctrl_c(team):
    srv, alice, bob = team
    where = project(bob)
    proc = subprocess.Popen([sys.executable, "-m", "phalanx", "run", "interruptible.py"], cwd=where, env=bob.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "started\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert out == "got ctrl-c, saving\n"
    assert proc.returncode == 7, err
    job = job_of(err)
    assert "SIGINT sent to every rank" in err and f"phalanx: job {job} (interruptible) cancelled after " in err
    assert json.loads(bob.run("status", job, "--json").stdout)["state"] == "CANCELLED"


def test_a_sweep_runs_remote_and_shows_as_locally(team):
    srv, alice, bob = team
    where = project(bob)
    swept = bob.run("run", "--objective", "loss:min", "ticks.py", "[2, 3]", "0.05", cwd=where)
    assert swept.returncode == 0, swept.stderr
    line = swept.stderr.strip().splitlines()[-1]
    sweep = re.search(r"phalanx: sweep ([0-9a-f]{8}) succeeded: 2/2 trials", line)
    assert sweep, swept.stderr
    shown = alice.run("sweep", "show", sweep.group(1))
    assert shown.returncode == 0 and "loss" in shown.stdout
    rows = json.loads(alice.run("ps", "--all", "--json", "--user", "bob").stdout)
    assert any(r["id"] == sweep.group(1) and r.get("kind") == "sweep" and r["user_name"] == "bob" for r in rows)


def test_the_python_api_and_the_cli_of_another_process_see_one_server(team):
    srv, alice, bob = team
    where = project(alice)
    code = ("import json, phalanx; from phalanx.api.ps import PsRequest\n"
            "face = phalanx.face()\n"
            "job = face.submit(phalanx.build_spec(phalanx.RunOptions(words=['ticks.py', '2', '0.01'])))\n"
            "done = face.wait(job['id'])\n"
            "print(json.dumps({'users': [r['user_name'] for r in face.ps(PsRequest(all=True)).rows],\n"
            "                  'state': done['state'], 'mine': job['user_name']}))")
    done = subprocess.run([sys.executable, "-c", code], env=alice.env, cwd=where, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["mine"] == "alice" and answer["state"] == "SUCCEEDED" and "alice" in answer["users"]
    assert not (alice.root / "home" / "phalanx.db").exists(), "through the server, not this machine's store"
    who = cli(["whoami"], alice.env)
    assert who.stdout.strip() == f"alice on {srv.url} (admin)"
    assert cli(["--local", "whoami"], alice.env).stdout.strip().endswith("(this machine's store)")


def test_job_files_nodes_downloads_and_a_foreground_resume(team, tmp_path):
    srv, alice, bob = team
    where = project(bob)
    (where / "job.yaml").write_text("script: ticks.py\nargs: ['3', '0.05']\nn: 2x1\nname: filed\n")
    (where / "writes.py").write_text("import os, sys\nopen(os.path.join(os.environ['PHALANX_OUTPUT_DIR'], 'r.txt'), 'w')"
                                     ".write('result')\nsys.exit(int(sys.argv[1]))\n")
    filed = bob.run("run", "-f", "job.yaml", cwd=where)
    assert filed.returncode == 0, filed.stderr
    assert "started: 2x1 on local" in filed.stderr and filed.stdout.count("tick 2") == 2, "two nodes, one rank each"
    failed = bob.run("run", "--name", "writer", "writes.py", "5", cwd=where)
    assert failed.returncode == 5
    job = job_of(failed.stderr)
    fetched = bob.run("download", job, "-o", str(tmp_path / "got"), "--logs", cwd=where)
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "got" / "output" / "r.txt").read_text() == "result"
    assert fetched.stdout.startswith(f"{tmp_path / 'got'}: output/ 1 file(s)")
    resumed = bob.run("resume", job, cwd=where)
    assert resumed.returncode == 5 and f"phalanx: job {job} failed after " in resumed.stderr
    assert json.loads(bob.run("status", job, "--json").stdout)["attempt"] == 1
