"""A process forked from the warm pool sees what a cold ``python -u -m phalanx.launch.bootstrap``
would: the same script, run both ways, compared (tests/warm/probe.py records what a script can see).

Known and accepted differences, excluded here and documented in docs/warm.md: the glibc-internal
handler for signal 33 that a pool whose imports started a thread carries (/proc/self/status
SigCgt), and str hashes (one hash seed per pool)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from .conftest import ensure_pool, pool_info, probe, run, script, served, start, wait_for, wait_gone

SIGSETXID_BIT = 1 << 32  # signal 33, bit 32 of the SigCgt mask


def differences(cold, warm, path: str = "") -> list[str]:
    """Where two JSON values differ, as readable lines (empty when equal)."""
    if isinstance(cold, dict) and isinstance(warm, dict):
        return [line for key in sorted(set(cold) | set(warm))
                for line in (differences(cold.get(key), warm.get(key), f"{path}/{key}") if key in cold and key in warm
                             else [f"{path}/{key}: only {'cold' if key in cold else 'warm'}"])]
    if cold == warm:
        return []
    if isinstance(cold, list) and isinstance(warm, list) and all(isinstance(i, str) for i in cold + warm):
        return [f"{path}: only cold {[i for i in cold if i not in warm]}, only warm {[i for i in warm if i not in cold]}"
                + (" (same items, another order)" if sorted(cold) == sorted(warm) else "")]
    return [f"{path}: cold {cold!r:.300} | warm {warm!r:.300}"]


def _normal(snapshot: dict) -> dict:
    status = snapshot["start"]["status"]
    status["SigCgt"] = format(int(status["SigCgt"], 16) & ~SIGSETXID_BIT, "016x")
    snapshot.get("torch", {}).pop("seed", None)
    return snapshot


@pytest.mark.parametrize("torch", [False, True], ids=["plain", "torch"])
def test_a_warm_child_sees_what_a_cold_start_sees(tmp_path, pool_dir, torch):
    extra = ("--torch", "--print") if torch else ("--print",)
    log = open(tmp_path / "out.log", "ab")  # one file for every run: the same stdout as far as fstat goes
    kwargs = dict(cwd=tmp_path, stdout=log, stderr=log)
    cold = probe(tmp_path, None, *extra, **kwargs)
    ensure_pool(pool_dir, "torch" if torch else "")
    before = served(pool_dir)
    warm_runs = [probe(tmp_path, pool_dir, *extra, preload="torch" if torch else "", **kwargs) for _ in range(2)]
    assert served(pool_dir) == before + 2, "the warm runs were not forked from the pool"
    for warm in warm_runs:
        diff = differences(_normal(json.loads(json.dumps(cold))), _normal(json.loads(json.dumps(warm))))
        assert not diff, "\n".join(diff)
    if torch:  # torch seeds its generator from entropy when it loads: so does each child
        seeds = {cold["torch"]["seed"], *(w["torch"]["seed"] for w in warm_runs)}
        assert len(seeds) == 3
    text = (tmp_path / "out.log").read_text()
    assert text.count("probe: hello") == 3 and text.count("probe: to stderr") == 3


def test_children_draw_their_own_random_numbers(tmp_path, pool_dir):
    draw = tmp_path / "draw.py"
    ensure_pool(pool_dir, "torch")
    draw.write_text("import random, numpy, torch, multiprocessing\n"
                    "print(random.random(), numpy.random.rand(), torch.rand(1).item(), "
                    "bytes(multiprocessing.current_process().authkey).hex())\n")
    lines = {run(script(draw), pool_dir, preload="torch").stdout for _ in range(3)}
    assert len(lines) == 3, lines
    for line in lines:
        assert len(set(line.split())) == 4  # nothing repeated between the generators either


BEHAVIOUR = {
    "exit_0": "print('done')",
    "exit_3": "import sys\nprint('three')\nsys.exit(3)",
    "exit_bye": "import sys\nsys.exit('bye')",
    "raises": "def f():\n    raise ValueError('boom')\nf()",
    "sigkill": "import os, signal\nprint('dying', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)",
    "abort": "import os\nos.abort()",
    "atexit_threads": textwrap.dedent("""\
        import atexit, threading, time
        atexit.register(lambda: print('atexit ran', flush=True))
        def late():
            time.sleep(0.2)
            print('thread finished', flush=True)
        threading.Thread(target=late).start()
        print('main done', flush=True)
        """),
    "forks": textwrap.dedent("""\
        import multiprocessing as mp, os
        def square(x):
            return x * x
        if __name__ == '__main__':
            pid = os.fork()
            if pid == 0:
                print('forked child', flush=True)
                os._exit(5)
            print('fork status', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
            for method in ('fork', 'spawn'):
                with mp.get_context(method).Pool(2) as pool:
                    print(method, pool.map(square, range(5)), flush=True)
        """),
}


@pytest.mark.parametrize("case", sorted(BEHAVIOUR))
def test_exit_codes_and_output_match(tmp_path, pool_dir, case):
    path = tmp_path / f"{case}.py"
    path.write_text(BEHAVIOUR[case] + "\n")
    cold = run(script(path), None, cwd=tmp_path)
    ensure_pool(pool_dir)
    before = served(pool_dir)
    warm = run(script(path), pool_dir, cwd=tmp_path)
    assert served(pool_dir) == before + 1
    assert (warm.returncode, sorted(warm.stdout.splitlines())) == (cold.returncode, sorted(cold.stdout.splitlines()))
    assert _addresses(warm.stderr) == _addresses(cold.stderr)


def _addresses(text: str) -> str:
    """Thread and object addresses (faulthandler's "Current thread 0x...") differ between any two processes."""
    return re.sub(r"0x[0-9a-f]+", "0x...", text)


# 'ready' is printed once the main thread sleeps, so the signal the test sends then lands in the
# sleep: landing in the code before it (under load, a SIGINT could reach the print's return) gives
# a traceback naming another place, under python and phalanx alike, and the two runs differ.
SIGNALLED = textwrap.dedent("""\
    import signal, sys, threading, time
    def on_term(signum, frame):
        print('SIGTERM handler ran', flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, on_term)
    main = threading.get_native_id()
    def announce():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # they go to the main thread
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(f'/proc/self/task/{main}/wchan') as fh:
                if fh.read().endswith('nanosleep'):
                    break
            time.sleep(0.001)
        print('ready', flush=True)
    threading.Thread(target=announce, daemon=True).start()
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        print('KeyboardInterrupt', flush=True)
        raise
    """)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: signal.Signals(s).name)
def test_signals_reach_the_script_as_they_would(tmp_path, pool_dir, signum):
    path = tmp_path / "signalled.py"
    path.write_text(SIGNALLED)
    results = []
    ensure_pool(pool_dir)
    for where in (None, pool_dir):
        proc = start(script(path), where, cwd=tmp_path)
        assert proc.stdout.readline() == b"ready\n"
        os.killpg(proc.pid, signum)  # as torchrun and the supervisor signal a worker
        out, err = proc.communicate(timeout=60)
        results.append((proc.returncode, out.decode(), err.decode()))
    assert results[0] == results[1]
    assert results[0][0] == {signal.SIGTERM: 7, signal.SIGINT: 128 + signal.SIGINT, signal.SIGKILL: -signal.SIGKILL}[signum]


def _pid_of(path):
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), what="the script's pid"))


PIDFILE = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(60)\n"


def test_killing_the_stand_in_kills_the_child(tmp_path, pool_dir):
    path = tmp_path / "sleeper.py"
    path.write_text(PIDFILE)
    ensure_pool(pool_dir)
    proc = start(script(path, str(tmp_path / "pid")), pool_dir)
    child = _pid_of(tmp_path / "pid")
    assert child != proc.pid  # forked from the pool, not the client itself
    proc.kill()
    proc.wait()
    assert wait_gone([child]) == []


def test_the_child_dies_with_the_stand_ins_parent(tmp_path, pool_dir):
    """PR_SET_PDEATHSIG: the cold worker dies when its agent dies; so does the warm one."""
    path = tmp_path / "sleeper.py"
    path.write_text(PIDFILE)
    ensure_pool(pool_dir)
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import subprocess, sys, time
        subprocess.Popen({json.dumps([sys.executable, "-u", "-m", "phalanx.launch.warm.standin", "--dir", pool_dir, "--",
                                      *script(path, str(tmp_path / "pid"))])}, start_new_session=True,
                         stdin=subprocess.DEVNULL)
        time.sleep(60)
        """)], start_new_session=True)
    child = _pid_of(tmp_path / "pid")
    client = [p.pid for p in __import__("psutil").Process(parent.pid).children()]
    parent.kill()
    parent.wait()
    assert wait_gone([child, *client]) == []


def test_a_stopped_pool_lets_running_children_finish_then_exits(tmp_path, pool_dir):
    from phalanx.launch.warm import plan as warm

    path = tmp_path / "short.py"
    path.write_text("import time\ntime.sleep(1.5)\nprint('finished')\n")
    ensure_pool(pool_dir)
    proc = start(script(path), pool_dir)
    wait_for(lambda: any(p.get("children") for p in pool_info(pool_dir)), what="the child to run")
    pids = [p["pid"] for p in warm.stop(pool_dir)]
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == b"finished\n"
    assert wait_gone(pids) == []
    assert pool_info(pool_dir) == []


def test_a_killed_pool_takes_its_children_and_the_stand_in_reports_it(tmp_path, pool_dir):
    path = tmp_path / "sleeper.py"
    path.write_text(PIDFILE)
    ensure_pool(pool_dir)
    proc = start(script(path, str(tmp_path / "pid")), pool_dir)
    child = _pid_of(tmp_path / "pid")
    pool = next(p["pid"] for p in pool_info(pool_dir) if child in p["children"])
    os.kill(pool, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert wait_gone([child, pool]) == []


def test_no_variable_of_one_run_reaches_the_next(tmp_path, pool_dir):
    path = tmp_path / "env.py"
    path.write_text("import os, json\nprint(json.dumps(dict(os.environ)))\n")
    ensure_pool(pool_dir)
    env = {**os.environ, "RANK": "3", "PHALANX_TRIAL_ID": "7", "MASTER_PORT": "1234"}
    first = json.loads(run(script(path), pool_dir, env=env).stdout)
    second = json.loads(run(script(path), pool_dir).stdout)
    assert first["RANK"] == "3" and first["PHALANX_TRIAL_ID"] == "7"
    assert "RANK" not in second and "PHALANX_TRIAL_ID" not in second and "MASTER_PORT" not in second
    assert second == dict(os.environ)
