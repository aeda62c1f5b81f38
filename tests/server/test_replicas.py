"""Two replicas of a team server (two ``phalanx server`` processes on two loopback ports) on one
real PostgreSQL and one home (the job directories: shared storage, here one machine's disk).
A job submitted to A is listed, logged and stopped through B; when A dies with one of its
jobs' supervisors (``kill -9``), the job whose supervisor still runs keeps its lease (the
supervisor renews it) and runs on, and B takes the other's expired lease over and resumes it from
its state directory as attempt 1."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

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


def _trials(person: Person, sweep: str, state: str) -> list[str] | None:
    """The ids of a sweep's trials, once there are two and all are in ``state``."""
    listed = person.run("ps", "--trials", sweep, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    return sorted(r["id"] for r in rows) if len(rows) == 2 and all(r["state"] == state for r in rows) else None


def _status(person: Person, job: str) -> dict:
    done = person.run("status", job, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _replicas(a: Server, b: Server, name: str) -> str:
    """Both replicas started, short leases, on one store and home; an admin's token."""
    b.root.mkdir()
    token = a.add_user(name, admin=True)
    a.start("--lease-ttl", TTL)
    b.start("--lease-ttl", TTL)
    return token


def _people(a: Server, b: Server, name: str, token: str, tmp_path) -> tuple[Person, Person, Path]:
    """The same person logged in to A and to B, and a project holding ``counter.py``."""
    via_a, via_b = Person(name, tmp_path / "via-a", token), Person(name, tmp_path / "via-b", token)
    project = tmp_path / "p"
    project.mkdir()
    (project / "counter.py").write_text(COUNTER)
    for person, srv in ((via_a, a), (via_b, b)):
        person.root.mkdir()
        assert person.login(srv.url).returncode == 0
    return via_a, via_b, project


def test_two_replicas_serve_the_same_jobs_and_one_adopts_the_jobs_of_the_other(server: Server, tmp_path):
    a = server
    b = Server(a.root.parent / "replica-b", a.home, a.env, a.store)
    token = _replicas(a, b, "mia")
    try:
        _run(a, b, token, tmp_path)
    finally:
        b.stop()


def _run(a: Server, b: Server, token: str, tmp_path) -> None:
    via_a, via_b, project = _people(a, b, "mia", token, tmp_path)

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
        """B adopted the job whose supervisor died (reads show it LOST until then)"""
        said = b.log.read_text() if b.log else ""
        return f"adopted job {dies} " in said

    _until(adopted, 120)

    def both_ended() -> list[dict] | None:
        """both of A's jobs ended, through B"""
        seen = [_status(via_b, job) for job in (lives, dies)]
        return seen if all(s["state"] not in ("PENDING", "RUNNING", "STOPPING") for s in seen) else None

    kept, resumed = _until(both_ended, 240)
    assert (kept["state"], kept["attempt"]) == ("SUCCEEDED", 0), "its supervisor ran on, keeping its lease itself"
    assert (resumed["state"], resumed["attempt"]) == ("SUCCEEDED", 1), "resumed from the state directory"
    log = via_b.run("logs", dies, "--attempt", "1").stdout
    first = log.splitlines()[0]
    assert first.startswith("attempt 1 from step ") and int(first.split()[-1]) >= 3, log
    assert log.splitlines()[-1] == "finished"
    said = (b.log.read_text() if b.log else "")
    assert f"adopted job {lives} " not in said, f"a job whose supervisor lives is nobody's to adopt: {said}"
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


# -- two machines ------------------------------------------------------------------------------
# Replica B on a machine of its own: a UTS and PID namespace (its own host name; a process table
# in which A's pids do not exist, nor B's in A's), on the same PostgreSQL and the same home (the
# shared storage a team mounts on both). A tiny init, pid 1 there, reaps orphans as a machine's
# does; killing it (through ``unshare --kill-child``) is the machine's death: everything on it dies.
INIT = """
import os, socket, subprocess, sys, time
socket.sethostname(sys.argv[1])
subprocess.Popen(sys.argv[2:])
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.2)
"""
MACHINE = "phalanx-test-machine-b"


class OtherMachine(Server):
    """``phalanx server`` on another machine (see above)."""

    def start(self, *args: str, expect_fail: bool = False, timeout: float = 60):
        import subprocess
        import sys

        real = subprocess.Popen

        def boxed(argv, **kw):  # Server.start's own Popen, put on the other machine
            return real(["unshare", "--uts", "--pid", "--mount-proc", "--kill-child", "--", sys.executable, "-c", INIT,
                         MACHINE, *argv], **kw)

        subprocess.Popen = boxed  # type: ignore[misc]
        try:
            return super().start(*args, expect_fail=expect_fail, timeout=timeout)
        finally:
            subprocess.Popen = real  # type: ignore[misc]

    def server_process(self) -> psutil.Process:
        """The ``phalanx server`` process on that machine (as this machine numbers it)."""
        assert self.proc is not None
        found = [p for p in psutil.Process(self.proc.pid).children(recursive=True)
                 if p.cmdline()[1:4] == ["-m", "phalanx", "server"]]
        assert len(found) == 1, found
        return found[0]


def _signal_all(procs: list[psutil.Process], how: str) -> None:
    """``suspend`` or ``resume`` each (one that ended meanwhile, a rank being stopped, is skipped)."""
    for proc in procs:
        try:
            getattr(proc, how)()
        except psutil.NoSuchProcess:
            pass


def _machines_can_be_made() -> str | None:
    import shutil

    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    if os.geteuid() != 0:
        return "needs root: a PID and UTS namespace stand for the second machine"
    return None


@pytest.mark.skipif(_machines_can_be_made() is not None, reason=str(_machines_can_be_made()))
def test_replicas_on_two_machines_judge_jobs_by_their_leases_and_relay_stops(server: Server, tmp_path):
    a = server
    b = OtherMachine(a.root.parent / "machine-b", a.home, a.env, a.store)
    token = _replicas(a, b, "ola")
    try:
        _two_machines(a, b, token, tmp_path)
    finally:
        if b.proc is not None:  # the machine's death: nothing of it outlives the test
            os.killpg(b.proc.pid, signal.SIGKILL)
            b.proc.wait()
            b.proc = None


def _two_machines(a: Server, b: OtherMachine, token: str, tmp_path) -> None:
    via_a, via_b, project = _people(a, b, "ola", token, tmp_path)

    # Three jobs and a sweep of two trials supervised on machine B; A sees them running there, not LOST.
    stopped, finishes, orphaned = (via_b.run("run", "-d", "--cold", "counter.py", steps, cwd=project).stdout.strip()
                                   for steps in ("400", "60", "400"))
    sweep = via_b.run("run", "-d", "--cold", "--parallel", "2", "counter.py", "[400, 401]", cwd=project).stdout.strip()
    for job in (stopped, finishes, orphaned):
        _until(lambda job=job: "step 2" in via_a.run("logs", job).stdout, 120)
        seen = _status(via_a, job)
        assert seen["state"] == "RUNNING", seen
        assert seen["supervisor"]["host"] == MACHINE, seen["supervisor"]
    assert {j["id"]: j["state"] for j in json.loads(via_a.run("ps", "--json").stdout) if j["id"] != sweep} == \
        {stopped: "RUNNING", finishes: "RUNNING", orphaned: "RUNNING"}
    trials = _until(lambda: _trials(via_a, sweep, "RUNNING"), 120)
    for trial in trials:
        _until(lambda trial=trial: "step 2" in via_a.run("logs", trial).stdout, 120)

    # B's server dies, its machine and its supervisors live on: they keep their leases themselves,
    # so A adopts nothing, and a stop through A reaches a supervisor on B through the job's files.
    server_b = b.server_process()
    server_b.kill()
    server_b.wait(30)
    lapsed = float(TTL) * 3
    _until(lambda: "step 12" in via_a.run("logs", stopped).stdout, 120)  # well past three TTLs
    done = via_a.run("stop", stopped)
    assert done.returncode == 0, done.stderr
    assert _status(via_a, stopped)["state"] == "CANCELLED"

    def finished() -> dict | None:
        """the job on B whose replica died ran to its end there"""
        seen = _status(via_a, finishes)
        return seen if seen["state"] not in ("PENDING", "RUNNING", "STOPPING") else None

    ended = _until(finished, 240)
    assert (ended["state"], ended["attempt"]) == ("SUCCEEDED", 0), ended
    assert _status(via_a, orphaned)["state"] == "RUNNING"
    assert _trials(via_a, sweep, "RUNNING") == trials, "the sweep's runner on B keeps its lease and its trials'"
    said = a.log.read_text() if a.log else ""
    assert "adopted job" not in said, f"nothing to adopt while B's supervisors renew their leases ({lapsed:g} s): {said}"

    # Now machine B freezes with everything on it (as a machine cut off from the network looks):
    # A takes the lapsed lease over and resumes the job. When B thaws, its supervisor finds the
    # job taken and ends its own copy of the attempt without writing anything.
    assert b.proc is not None
    on_b = psutil.Process(b.proc.pid).children(recursive=True)
    old_ranks = [p for p in on_b if "counter.py" in " ".join(p.cmdline())]
    assert old_ranks, "the orphaned job's rank runs on B"
    _signal_all(on_b, "suspend")
    _until(lambda: a.log is not None and f"adopted job {orphaned} " in a.log.read_text(), 120)
    _until(lambda: a.log is not None and f"adopted sweep {sweep} " in a.log.read_text(), 120)
    _until(lambda: via_a.run("logs", orphaned, "--attempt", "1").stdout.startswith("attempt 1 from step "), 120)
    for trial in trials:  # the sweep's trials continue on A, each as a new attempt from its checkpoint
        _until(lambda trial=trial: via_a.run("logs", trial, "--attempt", "1").stdout.startswith("attempt 1 from step "),
               120)
    _signal_all(on_b, "resume")

    def gone() -> bool:
        """B's copy of the attempt ended"""
        return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in old_ranks)

    _until(gone, 60)
    supervisor_log = (a.home / "jobs" / orphaned / "supervisor.log")
    _until(lambda: "was taken over by replica" in supervisor_log.read_text(), 30)
    runner_log = a.home / "sweeps" / sweep / "runner.log"
    _until(lambda: f"sweep {sweep} was taken over by replica" in runner_log.read_text(), 30)
    assert _trials(via_a, sweep, "RUNNING") == trials
    assert via_a.run("stop", sweep).returncode == 0
    assert _trials(via_a, sweep, "CANCELLED") == trials
    now = _status(via_a, orphaned)
    assert (now["state"], now["attempt"]) == ("RUNNING", 1) and now["supervisor"]["host"] != MACHINE, now
    assert via_a.run("stop", orphaned).returncode == 0

    def ended_on_a() -> dict | None:
        """the orphaned job, resumed on A, ended"""
        seen = _status(via_a, orphaned)
        return seen if seen["state"] not in ("PENDING", "RUNNING", "STOPPING") else None

    last = _until(ended_on_a, 60)
    assert (last["state"], last["attempt"]) == ("CANCELLED", 1), last
    first = via_a.run("logs", orphaned, "--attempt", "1").stdout.splitlines()[0]
    assert int(first.split()[-1]) >= 2, first
