"""The warm pools of a test's own directory, seen from outside: whether they have settled after a
run (every pool that holds its lock answers), what they served, and how many starts went cold."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from phalanx.launch.warm import plan as warm


def settled(pool_dir: str) -> bool:
    """No pool of ``pool_dir`` is still starting: each lock that is held belongs to a pool that
    answers on its socket."""
    answering = {p["key"] for p in warm.pools(pool_dir) if not p.get("dead") and not p.get("busy")}
    for lock in Path(pool_dir).glob("*.lock"):
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: no pool lives or starts there
        except BlockingIOError:
            if lock.stem not in answering:
                return False
        finally:
            os.close(fd)
    return True


def settle(pool_dir: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not settled(pool_dir):
        if time.monotonic() > deadline:
            raise AssertionError(f"the warm pools in {pool_dir} did not settle in {timeout:g}s")
        time.sleep(0.1)


def served(pool_dir: str) -> int:
    return sum(p.get("served", 0) for p in warm.pools(pool_dir) if not p.get("dead"))


def cold_starts(pool_dir: str) -> list[str]:
    """Every start that went cold (each is noted in its pool's log, with the reason)."""
    return [line for log in sorted(Path(pool_dir).glob("*.log")) for line in log.read_text().splitlines()
            if "cold start" in line]
