"""Shared by the terminal tests: a fresh copy of the scripts per test, and the command lines of
python, torchrun and phalanx that run them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The scripts, copied into a directory of their own (the command's cwd)."""
    work = tmp_path / "proj"
    shutil.copytree(SCRIPTS, work)
    return work


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """This module's warm pools, stopped (and checked gone) at its end."""
    from phalanx.launch.warm import plan as warm

    from ..conftest import stop_pools

    directory = tmp_path_factory.mktemp("pools")
    os.chmod(directory, 0o700)
    yield str(directory)
    stop_pools(warm, str(directory))


@pytest.fixture(params=["warm", "cold"])
def env(request: pytest.FixtureRequest, tmp_path: Path, pool_dir: str) -> Iterator[dict[str, str]]:
    """The environment of the commands a test types. Every terminal test runs twice: with
    phalanx's default, warm starts (the lone process, the node agent and torchrun's workers
    forked from a pool: they must keep the lent terminal, get one SIGINT and leave exit.json as a
    cold process does), and with warm starts off. Warm: the pools are started first by an
    unobserved run, and afterwards the test's phalanx runs must have been served by them with no
    start gone cold (every cold start is noted in its pool's log)."""
    base = {**os.environ, "PHALANX_HOME": str(tmp_path / "phx"), "OMP_NUM_THREADS": "1", "TERM": "xterm"}
    if request.param == "cold":
        yield {**base, "PHALANX_WARM": "0"}
        return
    params = getattr(request.node, "callspec", None)
    if params is not None and params.params.get("how") in ("python", "torchrun"):
        pytest.skip("a reference run alone: warm starts are phalanx's (its cold variant runs it)")
    from ..differential import pools

    base.pop("PHALANX_WARM", None)  # the suite's conftest turns warm starts off elsewhere
    base["PHALANX_WARM_DIR"] = pool_dir
    _start_pools(base, tmp_path / "prime")
    pools.settle(pool_dir)
    served, cold = pools.served(pool_dir), pools.cold_starts(pool_dir)
    yield base
    assert pools.cold_starts(pool_dir) == cold, "a process of a warm run started cold"
    assert pools.served(pool_dir) > served, "no process of the test was forked from a warm pool"


def _start_pools(env: dict[str, str], where: Path) -> None:
    """Runs a script once as one process and once as ``-n 2``, so that the pools of this
    environment exist (the first warm run of an environment starts them and runs cold)."""
    where.mkdir(exist_ok=True)
    (where / "prime.py").write_text("print('primed')\n")
    for how in ("phalanx", "phalanx-n2"):
        done = subprocess.run(command(how, "prime.py"), cwd=where, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr


def command(how: str, script: str, *args: str) -> list[str]:
    """``python``, ``torchrun`` (2 processes), ``phalanx`` (one process) or ``phalanx-n2``."""
    py = sys.executable
    return {
        "python": [py, script],
        "torchrun": [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script],
        "phalanx": [py, "-m", "phalanx", "run", script],
        "phalanx-n2": [py, "-m", "phalanx", "run", "-n", "2", script],
    }[how] + list(args)


def last_job(env: dict[str, str]):
    """The newest job of the test's ``$PHALANX_HOME``."""
    from phalanx.core.paths import HomePaths
    from phalanx.store import Store

    (record,) = Store(HomePaths(Path(env["PHALANX_HOME"])).db).list(limit=1)
    return record


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
