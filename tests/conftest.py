from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


# -- parallel runs: tests/parallel.py says how and why --------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        from tests import parallel

        parallel.default_workers(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        from tests import parallel

        parallel.check_groups(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.parallel import FileScheduling

    return FileScheduling(config, log)


@pytest.fixture
def phx_home(tmp_path, monkeypatch):
    home = tmp_path / "phx"
    monkeypatch.setenv("PHALANX_HOME", str(home))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return home


def phalanx(*args: str, timeout: float = 180, check: bool = False, cwd: Path = ROOT, env: dict | None = None):
    """Run the real CLI in a subprocess; returns CompletedProcess (text)."""
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"phalanx {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session", autouse=True)
def _warm_pools(tmp_path_factory):
    """Warm pools (launch/warm/plan.py) live in a directory of the suite's own, and are stopped, and
    waited for, at the end. The suite runs cold (its process-tree checks expect a cold tree) unless
    PHALANX_TEST_WARM=1; tests/warm and tests/differential turn warm starts on where they test
    them. At the end, nothing the suite started may still run (``left_running``)."""
    directory = tmp_path_factory.mktemp("warm")
    os.chmod(directory, 0o700)
    saved = {k: os.environ.get(k) for k in ("PHALANX_WARM_DIR", "PHALANX_WARM", "PHALANX_WARM_MAX_POOLS")}
    os.environ["PHALANX_WARM_DIR"] = str(directory)
    # No cap on pools: the suite's tests run with variables of their own (one pool each), and a cap would
    # stop pools tests are using between two runs. tests/warm/test_pools.py tests the cap.
    os.environ["PHALANX_WARM_MAX_POOLS"] = "0"
    os.environ["PHALANX_WARM"] = "1" if os.environ.get("PHALANX_TEST_WARM") == "1" else "0"
    yield directory
    from phalanx.launch.warm import plan as warm

    stop_pools(warm, str(directory))
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    # After every run of the suite, nothing it started runs on: no pool, no stand-in, no job process.
    left = wait_left(str(tmp_path_factory.getbasetemp()))
    assert not left, "left running after the suite's runs:\n" + "\n".join(left)


def left_running(root: str) -> list[str]:
    """Processes (``pid: command line``) that belong to runs under ``root``: a warm pool or
    stand-in whose command line names a directory there, or any process whose phalanx home or pool
    directory is there (every job process carries PHALANX_HOME). This process and its ancestors
    are not counted."""
    import psutil

    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    # ``root`` itself or a path under it; not a sibling whose name starts alike (popen-gw1, popen-gw10).
    inside = re.compile(re.escape(root.rstrip(os.sep)) + r"(?:/|$)")
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid in mine:
            continue
        try:
            cmdline = proc.info["cmdline"] or []
            env = proc.environ()
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.Error, OSError):
            continue
        places = [env.get("PHALANX_HOME", ""), env.get("PHALANX_WARM_DIR", "")]
        warm_words = any(w in cmdline for w in ("phalanx.launch.warm.standin", "--warm-pool"))
        if any(inside.match(p) for p in places if p) or (warm_words and any(inside.search(word) for word in cmdline)):
            found.append(f"{proc.pid}: {' '.join(cmdline)}")
    return found


def wait_left(root: str, timeout: float = 30.0) -> list[str]:
    """``left_running(root)`` once it is empty, or after ``timeout`` (processes that are ending)."""
    import time

    deadline = time.monotonic() + timeout
    while (left := left_running(root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def stop_pools(warm, directory: str, timeout: float = 30.0) -> None:
    """Stop every pool in ``directory`` and wait until each has exited."""
    import time

    pids = [p["pid"] for p in warm.stop(directory, everywhere=True)]
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if os.path.exists(f"/proc/{pid}") and _state(pid) != "Z"]
        time.sleep(0.05)
    assert not pids, f"warm pools {pids} did not exit"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


# -- the store's second engine: a private PostgreSQL (tests/pgserver.py) --------------------------


@pytest.fixture(scope="session")
def pg_server():
    """One private PostgreSQL for the session (None where it cannot run: the tests that need
    it skip, saying why; CI sets PHALANX_REQUIRE_PG=1 to fail instead). Stopped at the end."""
    from tests import pgserver

    why = pgserver.unavailable()
    if why is not None:
        yield why
        return
    server = pgserver.PgServer()
    server.db = server.create_database("phalanx_tests")
    try:
        yield server
    finally:
        from phalanx.store import postgres

        postgres.dispose_all()
        server.stop()


@pytest.fixture
def pg(pg_server):
    from tests.pgserver import need_pg

    return need_pg(pg_server)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_at(request, tmp_path, pg_server):
    """Where a new, empty store is, once per engine: a SQLite file, or a fresh schema of the
    private PostgreSQL (a URL). ``Store(store_at)`` opens it, as often as a test likes."""
    if request.param == "sqlite":
        yield tmp_path / "p.db"
        return
    from tests.pgserver import need_pg

    url = need_pg(pg_server).create_schema(pg_server.db)
    yield url
    from phalanx.store import postgres

    postgres.dispose_all(url)
