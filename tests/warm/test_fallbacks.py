"""When forking would not give a faithful copy, the start is cold, the result is right, and the
pool's log says why. Each case uses modules of its own (on PYTHONPATH), so its pool is its own."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phalanx.launch.warm import checks as warm_checks, proto as warm_proto

from .conftest import PROBE, ensure_pool, pool_info, run, script, served, start, wait_for


def _site(tmp_path: Path, **modules: str) -> dict[str, str]:
    """An environment whose PYTHONPATH holds ``modules`` (name -> source)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)
    return {**os.environ, "PYTHONPATH": str(site)}


def _log(pool_dir: str) -> str:
    return "".join(p.read_text() for p in Path(pool_dir).glob("*.log"))


def _pool_with(pool_dir: str, env: dict[str, str], preload: str) -> dict:
    return ensure_pool(pool_dir, preload, env=env)


def test_a_changed_module_is_imported_afresh_and_retires_the_pool(tmp_path, pool_dir):
    env = _site(tmp_path, warmtest_stale="VALUE = 1\n")
    user = tmp_path / "user.py"
    user.write_text("import warmtest_stale\nprint(warmtest_stale.VALUE)\n")
    pool = _pool_with(pool_dir, env, "warmtest_stale")
    first = run(script(user), pool_dir, env=env, preload="warmtest_stale")
    assert first.stdout == "1\n" and served(pool_dir) == pool["served"] + 1
    (tmp_path / "site" / "warmtest_stale.py").write_text("VALUE = 22\n")  # what pip install does
    second = run(script(user), pool_dir, env=env, preload="warmtest_stale")
    assert second.stdout == "22\n"
    assert "warmtest_stale.py changed since the pool imported it" in _log(pool_dir)
    assert wait_for(lambda: all(p["pid"] != pool["pid"] for p in pool_info(pool_dir)), what="the stale pool to go")


def test_a_module_next_to_the_script_shadowing_a_held_one_starts_cold(tmp_path, pool_dir):
    env = _site(tmp_path, warmtest_shadow="WHERE = 'site'\n")
    _pool_with(pool_dir, env, "warmtest_shadow")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "warmtest_shadow.py").write_text("WHERE = 'next to the script'\n")
    user = mine / "user.py"
    user.write_text("import warmtest_shadow\nprint(warmtest_shadow.WHERE)\n")
    before = served(pool_dir)
    assert run(script(user), pool_dir, env=env, preload="warmtest_shadow").stdout == "next to the script\n"
    assert served(pool_dir) == before
    assert "would shadow the pool's warmtest_shadow" in _log(pool_dir)


@pytest.mark.parametrize("case", ["thread", "descriptor"])
def test_a_pool_whose_imports_left_a_thread_or_a_descriptor_never_forks(tmp_path, pool_dir, case):
    source = {
        "thread": "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n",
        "descriptor": f"KEPT = open({str(tmp_path / 'kept.txt')!r}, 'w')\n",
    }[case]
    name = f"warmtest_{case}"
    env = _site(tmp_path, **{name: source + "VALUE = 'imported'\n"})
    pool = _pool_with(pool_dir, env, name)
    assert pool["refusal"] and ("thread(s) running" in pool["refusal"] if case == "thread" else "left open" in pool["refusal"])
    user = tmp_path / "user.py"
    user.write_text(f"import {name}\nprint({name}.VALUE)\n")
    result = run(script(user), pool_dir, env=env, preload=name)
    assert result.returncode == 0 and result.stdout == "imported\n"
    assert served(pool_dir) == pool["served"]


def test_a_client_outside_its_own_session_starts_cold(tmp_path, pool_dir):
    ensure_pool(pool_dir)
    before = served(pool_dir)
    out = tmp_path / "probe.json"
    argv = [sys.executable, "-u", "-m", "phalanx.launch.warm.standin", "--dir", pool_dir, "--", *script(PROBE, str(out))]
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)  # no new session
    assert proc.returncode == 0 and not json.loads(out.read_text())["start"]["sid_is_pid"]
    assert served(pool_dir) == before
    assert "does not lead a session of its own" in _log(pool_dir)


def test_limits_umask_signals_and_mask_of_the_caller_carry_over(tmp_path, pool_dir):
    """What the parent gave: a lower descriptor limit, a umask, SIGHUP ignored, SIGUSR1 blocked."""
    ensure_pool(pool_dir)

    def odd_start() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        os.umask(0o027)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])

    seen = []
    for where in (None, pool_dir):
        out = tmp_path / "probe.json"
        argv = [sys.executable, "-u", "-m", *([] if where is None else ["phalanx.launch.warm.standin", "--dir", where, "--"]),
                *script(PROBE, str(out))]
        subprocess.run(argv, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=odd_start, check=True,
                       timeout=120, capture_output=True)
        seen.append(json.loads(out.read_text())["start"])
    cold, warm = seen
    assert warm["rlimits"]["RLIMIT_NOFILE"][0] == 512 and warm["umask"] == 0o027
    assert warm["signals"]["SIGHUP"] == "ign" and signal.SIGUSR1 in warm["mask"]
    for key in ("rlimits", "umask", "signals", "mask"):
        assert warm[key] == cold[key], key


def test_a_module_run_with_dash_m_is_warm_too(tmp_path, pool_dir):
    ensure_pool(pool_dir)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text("import sys\nprint(__name__, __spec__.name, sys.argv[1:], sys.path[0] == '')\n")
    cold = run(["phalanx.launch.bootstrap", "--module", "pkg.main", "a"], None, cwd=tmp_path)
    before = served(pool_dir)
    warm = run(["phalanx.launch.bootstrap", "--module", "pkg.main", "a"], pool_dir, cwd=tmp_path)
    assert served(pool_dir) == before + 1
    assert warm.stdout == cold.stdout == "__main__ pkg.main ['a'] False\n"


@pytest.fixture
def open_place():
    """A directory other users can reach (pytest's own are private to root), holding a private
    pool directory; removed, with its pools stopped, afterwards."""
    import shutil
    import tempfile

    from phalanx.launch.warm import plan as warm

    from ..conftest import stop_pools

    place = Path(tempfile.mkdtemp(prefix="phalanx-warm-test-", dir="/tmp"))
    os.chmod(place, 0o755)
    pools = place / "pools"
    pools.mkdir(mode=0o700)
    yield place, str(pools)
    stop_pools(warm, str(pools))
    shutil.rmtree(place)


def test_a_pool_directory_of_another_user_is_not_used(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    assert "belongs to uid 65534" in (warm_proto.private_dir(str(theirs)) or "")
    user = tmp_path / "user.py"
    user.write_text("print('ran')\n")
    result = run(script(user), str(theirs))
    assert result.returncode == 0 and result.stdout == "ran\n" and not list(theirs.iterdir())


def test_the_pool_refuses_a_caller_of_another_uid(open_place):
    """Even past its private directory (opened up for this test), the pool checks who calls."""
    _place, pool_dir = open_place
    ensure_pool(pool_dir)
    sock_path = next(Path(pool_dir).glob("*.sock"))
    os.chmod(pool_dir, 0o711)
    os.chmod(sock_path, 0o666)
    try:
        code = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.settimeout(10)\ns.connect(sys.argv[1])\n"
                "try:\n    s.sendall(b'\\x00\\x00\\x00\\x02{}')\n    print(repr(s.recv(100)))\n"
                "except (BrokenPipeError, ConnectionResetError):\n    print('closed')\n")
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", sys.executable,
                               "-c", code, str(sock_path)], capture_output=True, text=True, timeout=60)
    finally:
        os.chmod(pool_dir, 0o700)
        os.chmod(sock_path, 0o600)
    assert proc.stdout in ("b''\n", "closed\n"), proc.stderr  # closed without an answer
    assert "refused a client of uid 65534" in _log(pool_dir)


def test_a_pool_directory_open_to_others_is_not_used(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    assert "must be 0700" in (warm_proto.private_dir(str(shared)) or "")
    result = run(script(Path(__file__).with_name("nothing.py")), str(shared))
    assert result.returncode == 0 and not list(shared.glob("*.sock"))


def test_initialised_cuda_refuses_with_a_fake_torch_cuda(monkeypatch):
    """No GPU here: a stand-in ``torch.cuda`` module (a fake, named so) says CUDA is initialised."""
    fake = type(sys)("torch.cuda")
    fake.is_initialized = lambda: True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.cuda", fake)
    assert warm_checks.cuda() == "CUDA is initialised in the pool"
    fake.is_initialized = lambda: False  # type: ignore[attr-defined]
    assert warm_checks.cuda() is None


def test_a_pool_answers_status_and_stops(pool_dir):
    from phalanx.launch.warm import plan as warm

    pool = ensure_pool(pool_dir)
    assert pool["memory"]["rss"] > 0 and pool["memory"]["pss"] > 0
    stopped = warm.stop(pool_dir, key=pool["key"][:6])
    assert [p["key"] for p in stopped] == [pool["key"]]
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pool['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pool['pid']}").exists()
    assert not any(p["key"] == pool["key"] for p in warm.pools(pool_dir))
    with socket.socket(socket.AF_UNIX) as sock:  # and its socket is gone
        with pytest.raises(OSError):
            sock.connect(os.path.join(pool_dir, f"{pool['key']}.sock"))


def test_children_of_a_killed_stand_in_started_before_it_forked_are_killed(tmp_path, pool_dir):
    """A stand-in killed while waiting for its pid: the pool kills the child it forks for it."""
    ensure_pool(pool_dir)
    path = tmp_path / "sleeper.py"
    path.write_text("import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    proc = start(script(path, str(tmp_path / "pid")), pool_dir)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    pid_file = tmp_path / "pid"
    if pid_file.exists():  # it got as far as running: it must be gone by now
        from .conftest import wait_gone

        assert wait_gone([int(pid_file.read_text())]) == []


def test_the_pool_learns_what_a_script_imports_behind_the_readers_back(tmp_path, pool_dir):
    """The plan reads the script for torch; an import it cannot see is learnt by the pool from the
    run, and held for the next one."""
    from phalanx.launch.warm import proto as warm_proto

    ensure_pool(pool_dir)
    hidden = tmp_path / "hidden.py"
    hidden.write_text("import importlib\nprint(importlib.import_module('tor' + 'ch').__name__)\n")
    assert run(script(hidden), pool_dir).stdout == "torch\n"
    key = warm_proto.pool_key(os.environ)
    wait_for(lambda: any("torch" in p.get("preloaded", []) for p in pool_info(pool_dir) if p["key"] == key),
             timeout=300, what="the pool to hold torch")
    before = served(pool_dir)
    assert run(script(hidden), pool_dir).stdout == "torch\n"
    assert served(pool_dir) == before + 1
