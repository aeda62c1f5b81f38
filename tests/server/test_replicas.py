"""Two replicas of a team server (two ``phalanx server`` processes on two loopback ports) on one
real PostgreSQL and one home (the job directories: shared storage, here one machine's disk).
A job submitted to A is listed, logged and stopped through B; when A dies with one of its
jobs' supervisors (``kill -9``), B takes the expired leases over: the job whose supervisor
still runs is re-attached, the other resumed from its state directory as attempt 1."""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest

from tests.server.conftest import Person, Server
from tests.server.test_outages import _until

pytestmark = [pytest.mark.local, pytest.mark.slow]

TTL = "3"
# A script that checkpoints a step counter into its state directory and picks it up again.
COUNTER = """
import os, sys, time
state = os.path.join(os.environ["PHALANX_STATE_DIR"], "step")
start = int(open(state).read()) if os.path.exists(state) else 0
print(f"attempt {os.environ['PHALANX_ATTEMPT']} from step {start}", flush=True)
for step in range(start, int(sys.argv[1])):
    time.sleep(0.25)
    with open(state + ".tmp", "w") as out:
        out.write(str(step + 1))
    os.replace(state + ".tmp", state)
    print(f"step {step + 1}", flush=True)
print("finished", flush=True)
"""


def _status(person: Person, job: str) -> dict:
    done = person.run("status", job, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_two_replicas_serve_the_same_jobs_and_one_adopts_the_jobs_of_the_other(server: Server, tmp_path):
    a = server
    b = Server(a.root.parent / "replica-b", a.home, a.env, a.store)
    b.root.mkdir()
    token = a.add_user("mia", admin=True)
    a.start("--lease-ttl", TTL)
    b.start("--lease-ttl", TTL)
    try:
        _run(a, b, token, tmp_path)
    finally:
        b.stop()


def _run(a: Server, b: Server, token: str, tmp_path) -> None:
    via_a, via_b = Person("mia", tmp_path / "via-a", token), Person("mia", tmp_path / "via-b", token)
    project = tmp_path / "p"
    project.mkdir()
    (project / "counter.py").write_text(COUNTER)
    for person, srv in ((via_a, a), (via_b, b)):
        person.root.mkdir()
        assert person.login(srv.url).returncode == 0

    # A job submitted to A: seen, logged and stopped through B.
    stopped = via_a.run("run", "-d", "counter.py", "400", cwd=project).stdout.strip()
    assert stopped in {j["id"] for j in json.loads(via_b.run("ps", "--json").stdout)}
    _until(lambda: "step 2" in via_b.run("logs", stopped).stdout, 120)
    done = via_b.run("stop", stopped)
    assert done.returncode == 0, done.stderr
    assert _status(via_b, stopped)["state"] == "CANCELLED"

    # Two more on A; A then dies, and so does one job's supervisor with its ranks.
    lives = via_a.run("run", "-d", "--cold", "counter.py", "40", cwd=project).stdout.strip()
    dies = via_a.run("run", "-d", "--cold", "counter.py", "40", cwd=project).stdout.strip()
    for job in (lives, dies):
        _until(lambda job=job: "step 3" in via_b.run("logs", job).stdout, 120)
    supervisor = psutil.Process(_status(via_b, dies)["supervisor"]["pid"])
    ranks = supervisor.children(recursive=True)
    assert a.proc is not None
    os.killpg(a.proc.pid, signal.SIGKILL)
    a.proc.wait()
    a.proc = None
    for proc in (supervisor, *ranks):
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    down = via_a.run("ps")
    assert down.returncode == 2 and "cannot reach the phalanx server" in down.stderr

    def adopted() -> bool:
        """B adopted both (reads show the one whose supervisor died LOST until then)"""
        said = b.log.read_text() if b.log else ""
        return f"adopted job {lives} " in said and f"adopted job {dies} " in said

    _until(adopted, 120)

    def both_ended() -> list[dict] | None:
        """both of A's jobs ended, through B"""
        seen = [_status(via_b, job) for job in (lives, dies)]
        return seen if all(s["state"] not in ("PENDING", "RUNNING", "STOPPING") for s in seen) else None

    kept, resumed = _until(both_ended, 240)
    assert (kept["state"], kept["attempt"]) == ("SUCCEEDED", 0), "re-attached: its supervisor ran on"
    assert (resumed["state"], resumed["attempt"]) == ("SUCCEEDED", 1), "resumed from the state directory"
    log = via_b.run("logs", dies, "--attempt", "1").stdout
    first = log.splitlines()[0]
    assert first.startswith("attempt 1 from step ") and int(first.split()[-1]) >= 3, log
    assert log.splitlines()[-1] == "finished"
    said = (b.log.read_text() if b.log else "")
    assert f"adopted job {lives} from replica " in said and "re-attached" in said, said
    assert f"adopted job {dies} from replica " in said and "resumed as attempt 1" in said, said
    assert stopped not in said, "an ended job is nobody's to adopt"


def test_a_supervisor_that_dies_under_its_server_is_replaced_once(server: Server, tmp_path):
    token = server.add_user("ned")
    server.start("--lease-ttl", TTL)
    ned = Person("ned", tmp_path / "ned", token)
    ned.root.mkdir()
    (ned.root / "counter.py").write_text(COUNTER)
    assert ned.login(server.url).returncode == 0
    job = ned.run("run", "-d", "--cold", "counter.py", "30").stdout.strip()
    _until(lambda: "step 3" in ned.run("logs", job).stdout, 120)
    supervisor = psutil.Process(_status(ned, job)["supervisor"]["pid"])
    for proc in (supervisor, *supervisor.children(recursive=True)):
        proc.send_signal(signal.SIGKILL)

    # reads show it LOST at once; the server replaces the supervisor at its next round
    _until(lambda: server.log is not None and f"the supervisor of job {job}" in server.log.read_text(), 60)

    def ended() -> dict | None:
        """the job ended"""
        seen = _status(ned, job)
        return seen if seen["state"] not in ("PENDING", "RUNNING", "STOPPING") else None

    done = _until(ended, 180)
    assert (done["state"], done["attempt"]) == ("SUCCEEDED", 1), done
    assert ned.run("logs", job, "--attempt", "1").stdout.startswith("attempt 1 from step ")
    said = server.log.read_text() if server.log else ""
    assert f"the supervisor of job {job} (pid {supervisor.pid}) died: resumed as attempt 1" in said, said
