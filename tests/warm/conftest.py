"""Shared by the warm-start tests: a pool directory per test module, starting processes cold and
warm exactly as torchrun and the supervisor do (new session, stdin closed), and reading what
processes are left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from phalanx.launch.warm import plan as warm

from ..conftest import stop_pools

HERE = Path(__file__).resolve().parent
PROBE = HERE / "probe.py"
PY = sys.executable


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pools")
    os.chmod(directory, 0o700)
    yield str(directory)
    stop_pools(warm, str(directory))


def argv(module_args: list[str], pool_dir: str | None, preload: str = "") -> list[str]:
    """``python -u -m MODULE ARGS`` cold (``pool_dir`` None) or through ``warm_exec``."""
    if pool_dir is None:
        return [PY, "-u", "-m", *module_args]
    options = ["--dir", pool_dir, *(["--preload", preload] if preload else [])]
    return [PY, "-u", "-m", "phalanx.launch.warm.standin", *options, "--", *module_args]


def start(module_args: list[str], pool_dir: str | None, env: dict | None = None, cwd: Path | str | None = None,
          preload: str = "", stdout: object = subprocess.PIPE, stderr: object = subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen(argv(module_args, pool_dir, preload), env=env if env is not None else dict(os.environ),
                            cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True)


def run(module_args: list[str], pool_dir: str | None, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    proc = start(module_args, pool_dir, **kwargs)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode() if out else "", err.decode() if err else "")


def script(path: Path, *args: str) -> list[str]:
    return ["phalanx.launch.bootstrap", "--script", str(path), *args]


def ensure_pool(pool_dir: str, preload: str = "", env: dict | None = None) -> dict:
    """The pool of ``env`` (default: this process's), started if needed and holding ``preload``:
    the first start of an environment runs cold while its pool imports in the background."""
    from phalanx.launch.warm import proto as warm_proto

    wanted = [m for m in preload.split(",") if m]
    key = warm_proto.pool_key(env if env is not None else os.environ)

    def mine(p: dict) -> bool:
        return p["key"] == key and not p.get("busy") and not p["stopping"]

    def ready() -> dict | None:
        return next((p for p in pool_info(pool_dir) if mine(p) and all(m in p["preloaded"] for m in wanted)), None)

    if ready() is None:
        nothing = HERE / "nothing.py"
        assert run(script(nothing), pool_dir, preload=preload, env=env).returncode == 0
        pool = wait_for(lambda: next((p for p in pool_info(pool_dir) if mine(p)), None), timeout=300,
                        what="the pool to start")
        if not all(m in pool["preloaded"] for m in wanted):  # it imports them on this request
            assert run(script(nothing), pool_dir, preload=preload, env=env, timeout=300).returncode == 0
    return wait_for(ready, what=f"a pool holding {wanted}")


def pool_info(pool_dir: str) -> list[dict]:
    return [p for p in warm.pools(pool_dir) if not p.get("dead")]


def served(pool_dir: str) -> int:
    return sum(p.get("served", 0) for p in pool_info(pool_dir))


def probe(tmp_path: Path, pool_dir: str | None, *extra: str, name: str = "probe.json", **kwargs) -> dict:
    out = tmp_path / name
    out.unlink(missing_ok=True)
    proc = run(script(PROBE, str(out), *extra), pool_dir, **kwargs)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (zombies count as gone)."""
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


def wait_gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
