"""No orphans, for every descendant (launch/strays.py): what a rank leaves running (a double-forked
daemon, a child in a session of its own) is ended with its attempt and named by ``status``, cold
and warm, with a cgroup per rank and with the environment alone (PHALANX_RANK_CGROUPS=0). Real
processes; the one thing a fake could not show is whether the helper really still runs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import phalanx
from tests.local.test_run import _alive, _wait_for

pytestmark = pytest.mark.local

# A script that double-forks and setsid's a helper (a daemon that would run for 10 minutes),
# waits until the helper has written its pid, and exits 0.
DAEMON = """
import os, sys, time
pid_file = sys.argv[1] + os.environ.get("RANK", "0")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp(sys.executable, [sys.executable, "-c",
                  f"import os, time; open({pid_file!r}, 'w').write(str(os.getpid())); time.sleep(600)"])
    os._exit(0)
os.wait()
while not (os.path.exists(pid_file) and open(pid_file).read()):
    time.sleep(0.05)
print("parent done", flush=True)
"""

# A plain child and a child in a session of its own; both would sleep for 10 minutes.
TWO_CHILDREN = """
import subprocess, sys, time
plain = subprocess.Popen(["sleep", "600"])
own = subprocess.Popen(["sleep", "601"], start_new_session=True)
open(sys.argv[1], "w").write(f"{plain.pid} {own.pid}")
time.sleep(600)
"""


def _pid(path: Path) -> int:
    _wait_for(lambda: path.exists() and path.read_text(), timeout=120, what=f"{path.name}")
    return int(path.read_text())


def _gone(pids: list[int]) -> bool:
    return _alive(pids) == []


def _kill(pids: list[int]) -> None:
    for pid in _alive(pids):
        os.kill(pid, signal.SIGKILL)


def _status(job: str) -> str:
    return phalanx("status", job, check=True).stdout


def _job_id(home: Path) -> str:
    rows = json.loads(phalanx("ps", "--all", "--json", check=True).stdout)
    assert len(rows) == 1, rows
    return rows[0]["id"]


@pytest.fixture
def warm_env(phx_home, tmp_path_factory):
    directory = tmp_path_factory.mktemp("pools")  # short: a socket's path has at most 107 bytes
    directory.chmod(0o700)
    yield {"PHALANX_WARM": "1", "PHALANX_WARM_DIR": str(directory)}
    from phalanx.launch.warm import plan as warm

    from tests.conftest import stop_pools

    stop_pools(warm, str(directory))


def _warmed(env: dict, tmp_path: Path) -> None:
    """The pool of this environment exists and answers (its first run starts it and runs cold)."""
    from phalanx.launch.warm import plan as warm

    nothing = tmp_path / "nothing.py"
    nothing.write_text("")
    phalanx("run", "--name", "warm-up", str(nothing), env=env, check=True)
    _wait_for(lambda: any(p.get("served") is not None and not p.get("busy") for p in warm.pools(env["PHALANX_WARM_DIR"])),
              timeout=300, what="the pool")


@pytest.mark.parametrize("cgroups", ["1", "0"], ids=["cgroup", "environment"])
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_daemon_ends_with_its_job_and_status_names_it(phx_home, tmp_path, request, cgroups, warm):
    script = tmp_path / "daemon.py"
    script.write_text(DAEMON)
    env = {"PHALANX_RANK_CGROUPS": cgroups}
    if warm:
        env.update(request.getfixturevalue("warm_env"))
        _warmed(env, tmp_path)
    from phalanx.launch.warm import plan as pools

    served = sum(p.get("served", 0) for p in pools.pools(env["PHALANX_WARM_DIR"])) if warm else 0
    pid_file = tmp_path / "helper"
    proc = phalanx("run", "--name", "daemon", *([] if warm else ["--cold"]), str(script), str(pid_file), env=env)
    helper = _pid(Path(f"{pid_file}0"))
    try:
        assert proc.returncode == 0, proc.stderr
        assert _gone([helper]), "the daemon outlived its job"
        if warm:  # the script really was forked from the pool
            assert sum(p.get("served", 0) for p in pools.pools(env["PHALANX_WARM_DIR"])) > served
        line = f"ended 1 leftover process of rank 0: pid {helper} `python"
        assert line in proc.stderr and "(setsid)" in proc.stderr, proc.stderr  # said at the end of the run
        job = [j for j in json.loads(phalanx("ps", "--all", "--json", check=True).stdout) if j["name"] == "daemon"][0]
        assert job["state"] == "SUCCEEDED"  # as under python: the script itself succeeded
        assert re.search(rf"leftover +{re.escape(line)}.*\(setsid\)", _status(job["id"]))
    finally:
        _kill([helper])


def test_daemons_of_every_rank_end_with_a_torchrun_job(phx_home, tmp_path):
    script = tmp_path / "daemon.py"
    script.write_text(DAEMON)
    pid_file = tmp_path / "helper"
    proc = phalanx("run", "--cold", "-n", "2", str(script), str(pid_file))
    helpers = [_pid(Path(f"{pid_file}{rank}")) for rank in (0, 1)]
    try:
        assert proc.returncode == 0, proc.stderr
        assert _gone(helpers), "a daemon outlived its job"
        status = _status(_job_id(phx_home))
        for rank, pid in enumerate(helpers):
            assert f"ended 1 leftover process of rank {rank}: pid {pid} `python" in status, status
    finally:
        _kill(helpers)


@pytest.mark.parametrize("cgroups", ["1", "0"], ids=["cgroup", "environment"])
def test_stop_ends_a_child_in_a_session_of_its_own(phx_home, tmp_path, cgroups):
    script = tmp_path / "children.py"
    script.write_text(TWO_CHILDREN)
    pid_file = tmp_path / "children"
    env = {"PHALANX_RANK_CGROUPS": cgroups}
    job = phalanx("run", "-d", "--cold", "--grace", "5", str(script), str(pid_file), env=env, check=True).stdout.strip()
    _wait_for(lambda: pid_file.exists() and len(pid_file.read_text().split()) == 2, timeout=120, what="the children")
    plain, own = map(int, pid_file.read_text().split())
    try:
        stopped = phalanx("stop", job, env=env)
        assert stopped.returncode == 0, stopped.stderr
        assert "CANCELLED" in stopped.stdout
        assert _gone([plain]), "the plain child outlived the stop"
        assert _gone([own]), "the child in a session of its own outlived the stop"
        assert f"ended 1 leftover process of rank 0: pid {own} `sleep 601` (setsid)" in _status(job)
    finally:
        _kill([plain, own])


def test_a_stray_that_ignores_sigterm_is_killed_after_the_grace_period(phx_home, tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "    time.sleep(600)\n"
        "    os._exit(0)\n"
        "while not (os.path.exists(sys.argv[1]) and open(sys.argv[1]).read()):\n"
        "    time.sleep(0.05)\n")
    pid_file = tmp_path / "stubborn"
    proc = phalanx("run", "--cold", "--grace", "1", str(script), str(pid_file))
    pid = _pid(pid_file)
    try:
        assert proc.returncode == 0, proc.stderr
        assert _gone([pid])
        assert "(setsid; SIGKILL after the grace period)" in _status(_job_id(phx_home))
    finally:
        _kill([pid])


def test_a_job_run_from_a_rank_is_ended_with_that_rank(phx_home, tmp_path):
    """A job started inside a rank (a script running phalanx) is that rank's descendant too."""
    inner = tmp_path / "inner.py"
    inner.write_text("import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    outer = tmp_path / "outer.py"
    pid_file = tmp_path / "inner.pid"
    outer.write_text(
        "import subprocess, sys, time, os\n"
        f"subprocess.Popen([sys.executable, '-m', 'phalanx', 'run', '-d', '--cold', {str(inner)!r}, {str(pid_file)!r}],"
        " stdout=subprocess.DEVNULL)\n"
        f"while not (os.path.exists({str(pid_file)!r}) and open({str(pid_file)!r}).read()):\n"
        "    time.sleep(0.05)\n")
    proc = phalanx("run", "--cold", str(outer), env={"PHALANX_HOME": str(tmp_path / "outer-home")})
    pid = _pid(pid_file)
    try:
        assert proc.returncode == 0, proc.stderr
        assert _gone([pid])
    finally:
        _kill([pid])


def test_rank_cgroups_left_by_a_killed_job_are_removed_by_the_next(phx_home, tmp_path):
    """A job whose supervisor and agents were all SIGKILLed leaves its ranks' (empty) cgroups;
    the next attempt's end removes them, and never one that still holds a process."""
    from phalanx.launch import strays

    directory = strays.cgroup_dir()
    if directory is None:
        pytest.skip("no writable cgroup v2 here: ranks are marked by their environment")
    empty, busy = Path(directory, strays.leaf_name("deadbeef", 0, 0)), Path(directory, strays.leaf_name("deadbeef", 0, 1))
    empty.mkdir()
    busy.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", f"open({str(busy / 'cgroup.procs')!r}, 'w').write('0');"
                               "import time; time.sleep(600)"])
    try:
        _wait_for(lambda: (busy / "cgroup.procs").read_text().split() == [str(holder.pid)], what="the holder")
        script = tmp_path / "nothing.py"
        script.write_text("")
        phalanx("run", "--cold", str(script), check=True)
        assert not empty.exists() and busy.exists()
    finally:
        holder.kill()
        holder.wait()
        _wait_for(lambda: not (busy / "cgroup.procs").read_text().split(), what="the holder to go")
        busy.rmdir()
