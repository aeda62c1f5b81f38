"""A pool lives only while it may be needed: it exits by itself once idle for its ``--idle``
seconds, and when its socket is gone (its directory removed: the user's ``XDG_RUNTIME_DIR`` goes
when their last session ends). Either way it leaves no socket and no process behind."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..conftest import EXAMPLES, phalanx, wait_left
from .conftest import HERE, PY, pool_info, wait_for, wait_gone


def _first_run(pool_dir: str, idle: str) -> None:
    """A first run of this environment: cold, and it starts the environment's pool."""
    argv = [PY, "-u", "-m", "phalanx.launch.warm.standin", "--dir", pool_dir, "--idle", idle, "--",
            "phalanx.launch.bootstrap", "--script", str(HERE / "nothing.py")]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, start_new_session=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _private(tmp_path_factory, name: str) -> str:
    directory = tmp_path_factory.mktemp(name)  # short: a socket's path has at most 107 bytes
    os.chmod(directory, 0o700)
    return str(directory)


def _pool_pid(pool_dir: str) -> int:
    """The pool's pid, from its log (an idle pool may be gone before anyone asks it)."""
    def holding() -> int | None:
        for log in Path(pool_dir).glob("*.log"):
            for line in log.read_text().splitlines():
                if " holding " in line:
                    return int(line.split("[", 1)[1].split("]", 1)[0])
        return None

    return int(wait_for(holding, timeout=120, what="the pool to start"))


def test_an_idle_pool_exits_by_itself(tmp_path_factory):
    pool_dir = _private(tmp_path_factory, "idle")
    _first_run(pool_dir, idle="2")
    pid = _pool_pid(pool_dir)
    assert wait_gone([pid], timeout=60) == [], "an idle pool did not exit"
    assert "idle for 2s: exiting" in "".join(log.read_text() for log in Path(pool_dir).glob("*.log"))
    assert not list(Path(pool_dir).glob("*.sock"))


def test_a_pool_whose_directory_is_removed_exits(tmp_path_factory):
    pool_dir = _private(tmp_path_factory, "runtime")
    _first_run(pool_dir, idle="600")
    (pool,) = wait_for(lambda: pool_info(pool_dir), timeout=120, what="the pool to start")
    shutil.rmtree(pool_dir)  # what logind does to XDG_RUNTIME_DIR when the user's last session ends
    assert wait_gone([pool["pid"]], timeout=60) == [], "a pool nobody can reach any more went on waiting"


def test_nothing_is_left_running_after_warm_runs_and_pool_stop(tmp_path_factory, phx_home):
    """Warm runs (one process, and -n 2: agent and workers under torchrun) end with their job;
    ``phalanx pool stop`` ends the pools; then no process of theirs runs (the suite's own end
    checks the same for every run of the suite: tests/conftest.py, ``left_running``)."""
    pool_dir = _private(tmp_path_factory, "after")
    env = {"PHALANX_WARM": "1", "PHALANX_WARM_DIR": pool_dir}
    for args in ((), ("-n", "2"), ("-n", "2")):  # the first run of each environment starts its pool
        phalanx("run", "--no-snapshot", *args, str(EXAMPLES / "hello.py"), env=env, check=True)
    assert pool_info(pool_dir), "no pool was started"
    assert sum(p.get("served", 0) for p in pool_info(pool_dir)) >= 1
    assert wait_left(str(phx_home)) == [], "a job process outlived its run"
    phalanx("pool", "stop", env=env, check=True)
    assert wait_left(pool_dir) == []
    assert wait_left(str(phx_home)) == []
