"""A warm start never escapes its caller's resource limits: a job run under a memory limit (a
cgroup: SLURM's, ``systemd-run``'s, a container's) is not forked from a pool started outside it;
it runs cold, or from a pool started under the same limit, and is OOM-killed as ``--cold`` and
python are. The memory limit is real: a cgroup made for the test (systemd-run where systemd runs,
else the cgroup v1 memory controller), skipped with the reason where neither can be had."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from phalanx.launch.warm import checks as warm_checks

from ..conftest import ROOT
from .conftest import pool_info, wait_for

pytestmark = pytest.mark.slow

LIMIT = 300 << 20
HOG = "data = b'x' * (600 << 20)\nprint('allocated', len(data) >> 20, 'MiB', flush=True)\n"
LAUNCH = "import os, sys\nopen(sys.argv[1], 'w').write(str(os.getpid()))\nos.execvp(sys.argv[2], sys.argv[2:])\n"


def _v1_memory_dir() -> Path | None:
    """This process's cgroup in the v1 memory hierarchy, where a child with a limit can be made."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    own = next((line.split(":", 2)[2] for line in lines if line.split(":", 2)[1] == "memory"), None)
    for mount in mounts:
        before, _, after = mount.partition(" - ")
        fields, rest = before.split(), after.split()
        if own is not None and rest[:1] == ["cgroup"] and "memory" in rest[-1].split(","):
            directory = Path(fields[4] + own)
            if os.access(directory, os.W_OK):
                return directory
    return None


@pytest.fixture
def limited(tmp_path):
    """A command prefix that runs its command under a 300 MiB memory limit (no swap)."""
    if Path("/run/systemd/system").is_dir() and shutil.which("systemd-run"):
        yield ["systemd-run", "--scope", "--quiet", "-p", f"MemoryMax={LIMIT}", "-p", "MemorySwapMax=0", "--"]
        return
    parent = _v1_memory_dir()
    if parent is None:
        pytest.skip("no memory cgroup can be made here: no systemd, and no writable cgroup v1 memory hierarchy")
    group = parent / f"phalanx-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(LIMIT))
        if (group / "memory.memsw.limit_in_bytes").exists():
            (group / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
        launch = tmp_path / "launch.py"
        launch.write_text(LAUNCH)
        yield [sys.executable, str(launch), str(group / "cgroup.procs")]
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            os.kill(int(pid), 9)
        wait_for(lambda: not (group / "cgroup.procs").read_text().split(), what="the test's cgroup to empty")
        group.rmdir()


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


def test_a_job_under_a_memory_limit_is_not_forked_from_a_pool_outside_it(phx_home, pool_dir, tmp_path, limited):
    env = {"PHALANX_WARM": "1", "PHALANX_WARM_DIR": pool_dir}
    phalanx = [sys.executable, "-m", "phalanx", "run"]
    nothing, hog = tmp_path / "nothing.py", tmp_path / "hog.py"
    nothing.write_text("")
    hog.write_text(HOG)
    # A pool started earlier, outside the limit, serving runs outside it.
    assert _run([*phalanx, str(nothing)], env).returncode == 0
    outside = wait_for(lambda: next((p for p in pool_info(pool_dir) if not p.get("busy")), None), what="the pool")
    assert _run([*phalanx, str(nothing)], env).returncode == 0
    assert sum(p.get("served", 0) for p in pool_info(pool_dir)) >= 1, "the pool outside serves runs outside"

    python = _run([*limited, sys.executable, str(hog)], env)
    assert python.returncode == -9 and "allocated" not in python.stdout, "the limit holds for python itself"
    cold = _run([*limited, *phalanx, "--cold", str(hog)], env)
    assert cold.returncode == 137 and "allocated" not in cold.stdout, cold.stderr
    for _ in range(2):  # the first run in the limit starts a pool there; the second may be forked from it
        warm = _run([*limited, *phalanx, str(hog)], env)
        assert warm.returncode == 137 and "allocated" not in warm.stdout, (warm.stdout, warm.stderr)
    inside = [p for p in pool_info(pool_dir) if p.get("pid") and p["pid"] != outside["pid"]]
    for pool in inside:  # a pool started under the limit lives under it
        assert Path(f"/proc/{pool['pid']}/cgroup").read_text() != Path(f"/proc/{outside['pid']}/cgroup").read_text()


def test_the_pool_forks_only_for_clients_placed_as_it_is(limited, tmp_path):
    """``warm_checks.placement`` against real processes: one in another cgroup, one at another
    priority, and this process itself."""
    procs = []
    try:
        for argv in ([*limited, "sleep", "60"], ["nice", "-n", "7", "sleep", "60"]):
            procs.append(subprocess.Popen(argv))
        wait_for(lambda: all(Path(f"/proc/{p.pid}/comm").read_text().strip() == "sleep" for p in procs),
                 what="the sleepers")
        assert "another cgroup" in (warm_checks.placement(procs[0].pid) or "")
        assert "another priority" in (warm_checks.placement(procs[1].pid) or "")
        assert warm_checks.placement(os.getpid()) is None
        assert "not visible" in (warm_checks.placement(0) or "")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
