"""Workers prepared ahead (launch/standby.py, launch/workers.py): a rank that takes a standby sees
what the same rank started cold sees. Differential: the same probe started both ways, compared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.launch.workers import BOOTSTRAP_ARGV, Standbys

pytestmark = pytest.mark.local

PROBE = r'''
import json, os, signal, sys
out = sys.argv[1]
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
seen = {
    "argv": sys.argv, "orig_argv": sys.orig_argv, "path0": sys.path[0], "path": sys.path, "cwd": os.getcwd(),
    "env": dict(os.environ), "flags": list(sys.flags), "executable": sys.executable, "name": __name__,
    "file": __file__, "main_file": getattr(sys.modules["__main__"], "__file__", None),
    "signals": {s.name: str(signal.getsignal(s)) for s in signal.valid_signals() if isinstance(s, signal.Signals)},
    "fds": {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in fds if fd in (0, 1, 2)}, "nfds": len(fds),
    "leader": os.getsid(0) == os.getpid() == os.getpgid(0), "ppid": os.getppid(),
    "umask": os.umask(0o22), "modules": sorted(sys.modules), "unbuffered": not sys.stdout.line_buffering,
}
print("hello from the probe")
sys.stdout.flush()
with open(out, "w") as fh:
    json.dump(seen, fh)
raise SystemExit(7)
'''


def _start(tmp: Path, how: str, pool: Standbys) -> dict:
    probe = tmp / "probe.py"
    rank_dir = tmp / how / "rank_{rank}"
    env = {**os.environ, "PHALANX_RANK_DIR": str(rank_dir), "RANK": "3", "PHALANX_ATTEMPT": "1"}
    env.pop("PYTHONPATH", None)
    argv = [sys.executable, *BOOTSTRAP_ARGV, "--script", str(probe), str(tmp / f"{how}.json"), "--flag"]
    log = tmp / f"{how}.agent.log"
    log.touch()
    if how == "cold":
        with open(log, "ab") as agent_log:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=agent_log, stderr=agent_log,
                                    start_new_session=True)
    else:
        taken = pool.take(argv, env, str(log))
        assert taken is not None
        proc = taken
    assert proc.wait(timeout=60) == 7
    seen = json.loads((tmp / f"{how}.json").read_text())
    seen["output"] = (tmp / how / "rank_3" / "output.log").read_text()
    seen["fds"] = {fd: target.replace(str(tmp / how), "<rank dirs>") for fd, target in seen["fds"].items()}
    return seen


def test_a_rank_from_a_standby_sees_what_a_cold_one_sees(tmp_path, monkeypatch):
    (tmp_path / "probe.py").write_text(PROBE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    pool = Standbys()
    with open(os.devnull, "rb") as null:
        # A kept agent's stdin is /dev/null (commands.spawn); the standby inherits it from there.
        saved = os.dup(0)
        os.dup2(null.fileno(), 0)
        try:
            pool.prepare(1)
        finally:
            os.dup2(saved, 0)
            os.close(saved)
    try:
        cold = _start(tmp_path, "cold", pool)
        warm = _start(tmp_path, "warm", pool)
    finally:
        pool.close()
    assert warm["output"] == cold["output"] == "hello from the probe\n"
    for seen in (cold, warm):
        seen["orig_argv"][-2] = seen["argv"][1] = "<out>"
        seen["env"].pop("PHALANX_RANK_DIR")
        seen["env"].pop("PHALANX_METRICS_FILE")
    assert warm == cold
    assert cold["argv"] == [str(tmp_path / "probe.py"), "<out>", "--flag"] and cold["leader"]
    assert cold["fds"] == {"0": "/dev/null", "1": "<rank dirs>/rank_3/output.log", "2": "<rank dirs>/rank_3/output.log"}


def test_a_standby_is_not_taken_for_another_program_or_start_up_environment(tmp_path):
    pool = Standbys()
    pool.prepare(1)
    try:
        assert pool.take(["/bin/true"], dict(os.environ), None) is None
        other = {**os.environ, "PYTHONHASHSEED": "7"}
        argv = [sys.executable, *BOOTSTRAP_ARGV, "--exec", "true"]
        assert pool.take(argv, other, None) is None  # started with another start-up environment: dropped
        assert pool.take(argv, dict(os.environ), None) is None  # none left
    finally:
        pool.close()
