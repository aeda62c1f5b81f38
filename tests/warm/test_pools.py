"""The pools of one user as a person sees and stops them: each pool says which Python (which
environment) it serves, `phalanx pool stop` stops this environment's pools only (`--all` every one),
pools are capped per user with the least recently used idle one stopped first, and a job whose
imports a ready pool already holds uses that pool."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from phalanx.launch.warm import plan as warm

from ..conftest import ROOT, phalanx, stop_pools
from .conftest import HERE, PY, ensure_pool, pool_info, run, script, served, wait_for, wait_gone


@pytest.fixture
def pool_dir(tmp_path_factory):
    """A pool directory of the test's own (short: a socket's path has at most 107 bytes); every pool
    in it is stopped at the end."""
    directory = tmp_path_factory.mktemp("pools")
    os.chmod(directory, 0o700)
    yield str(directory)
    stop_pools(warm, str(directory))


def _other_python(tmp_path: Path) -> str:
    """A second environment: a virtual environment of its own whose packages are this one's."""
    env = tmp_path / "otherenv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    (site,) = (env / "lib").glob("python*/site-packages")
    (site / "same_packages.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n{ROOT / 'src'}\n")
    return str(env / "bin" / "python")


def _first_start(python: str, pool_dir: str, env: dict[str, str] | None = None, max_pools: int = 0) -> None:
    """A first run of an environment (cold), which starts its pool; then a second, served by it."""
    argv = [python, "-u", "-m", "phalanx.launch.warm.standin", "--dir", pool_dir, "--idle", "600",
            *(["--max-pools", str(max_pools)] if max_pools else []), "--",
            "phalanx.launch.bootstrap", "--script", str(HERE / "nothing.py")]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, start_new_session=True, timeout=300,
                          env=env if env is not None else dict(os.environ))
    assert done.returncode == 0, done.stderr


def test_pool_status_and_stop_tell_environments_apart(tmp_path, pool_dir):
    other = _other_python(tmp_path)
    ensure_pool(pool_dir)
    _first_start(other, pool_dir)
    pools = wait_for(lambda: len([p for p in pool_info(pool_dir) if not p.get("busy")]) == 2 and pool_info(pool_dir),
                     timeout=300, what="a pool of each environment")
    mine = next(p for p in pools if p["executable"] == PY)
    theirs = next(p for p in pools if p["executable"] == other)
    env = {"PHALANX_WARM_DIR": pool_dir}
    status = phalanx("pool", "status", env=env, check=True).stdout
    rows = {line.split()[0]: line for line in status.splitlines()[1:] if line.split()}
    assert "PYTHON" in status.splitlines()[0]
    assert PY.replace(os.path.expanduser("~"), "~") in rows[mine["key"]] and "(other)" not in rows[mine["key"]]
    assert f"{other} (other)" in rows[theirs["key"]]
    assert "1 pool(s) serve another Python" in status
    stopped = phalanx("pool", "stop", env=env, check=True).stdout
    assert f"stopping pool {mine['key']}" in stopped and theirs["key"] not in stopped
    assert wait_gone([mine["pid"]], timeout=60) == []
    assert [p["pid"] for p in pool_info(pool_dir)] == [theirs["pid"]], "another environment's pool was stopped"
    assert "no warm pool of" in phalanx("pool", "stop", env=env, check=True).stdout
    everything = phalanx("pool", "stop", "--all", env=env, check=True).stdout
    assert f"stopping pool {theirs['key']}" in everything
    assert wait_gone([theirs["pid"]], timeout=60) == [] and pool_info(pool_dir) == []


def test_pools_are_capped_least_recently_used_first(pool_dir):
    envs = {name: {**os.environ, "PHALANX_TEST_ENV_NAME": name, "OMP_NUM_THREADS": str(n)}
            for n, name in enumerate(("a", "b", "c"), 1)}  # three environments (a variable differs): three pools
    for name in ("a", "b"):
        _first_start(PY, pool_dir, envs[name], max_pools=2)
        wanted = 1 if name == "a" else 2
        wait_for(lambda: len(pool_info(pool_dir)) == wanted, timeout=300, what=f"pool {name}")  # noqa: B023 - called in this loop pass
    before = {p["key"]: p for p in pool_info(pool_dir)}
    assert served(pool_dir) == 0
    # a is used again: b is now the least recently used.
    assert run(script(HERE / "nothing.py"), pool_dir, env=envs["a"]).returncode == 0
    used = wait_for(lambda: next((p for p in pool_info(pool_dir) if p["served"]), None), what="a to serve")
    (unused,) = [p for p in before.values() if p["key"] != used["key"]]
    _first_start(PY, pool_dir, envs["c"], max_pools=2)  # a third pool starts: one must go
    assert wait_gone([unused["pid"]], timeout=120) == [], "the least recently used idle pool was not stopped"
    left = wait_for(lambda: len(pool_info(pool_dir)) == 2 and pool_info(pool_dir), timeout=300, what="pool c")
    assert used["key"] in {p["key"] for p in left}
    logs = "".join(log.read_text() for log in Path(pool_dir).glob("*.log"))
    assert f"asked the idle pool {unused['key']}.sock to stop: more than 2 pools (the warm_max_pools setting)" in logs
    phalanx("pool", "stop", "--all", env={"PHALANX_WARM_DIR": pool_dir}, check=True)
    assert wait_gone([p["pid"] for p in left], timeout=60) == []


def test_a_job_whose_imports_a_pool_holds_uses_that_pool(tmp_path, pool_dir):
    """One pool per environment, holding the union of what its jobs imported: a job importing a
    subset of it is served by it, and a new pool is never started for it."""
    ensure_pool(pool_dir, preload="numpy")
    (pool,) = pool_info(pool_dir)
    uses_numpy = tmp_path / "np_job.py"
    uses_numpy.write_text("import numpy\nprint(numpy.zeros(2).sum())\n")
    for preload, job in (("numpy", uses_numpy), ("", HERE / "nothing.py")):
        done = run(script(job), pool_dir, preload=preload)
        assert done.returncode == 0, done.stderr
    (after,) = pool_info(pool_dir)
    assert after["pid"] == pool["pid"] and after["served"] == pool["served"] + 2 and after["fallbacks"] == 0
