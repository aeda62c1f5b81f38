"""Crash consistency (issue 17): SIGKILL the CLI and the supervisor at random instants of submit,
start, retry, stop and finish, 24 times, and check after each: no job left RUNNING (shown LOST),
no orphan process, no job directory without its row nor the reverse, no half-written JSON.
A longer loop: ``bench/crash_loop.py``."""

from __future__ import annotations

import random
from pathlib import Path

from .crashes import JOB, MODES, round_, violations

ROUNDS = 24


def test_sigkill_at_random_instants_keeps_the_invariants(tmp_path: Path) -> None:
    home, code = tmp_path / "home", tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(JOB)
    rng = random.Random(17)
    found: list[str] = []
    for n in range(ROUNDS):
        round_(home, code, rng, MODES[n % len(MODES)])
        found += [f"round {n} ({MODES[n % len(MODES)]}): {v}" for v in violations(home)]
    assert not found, "\n".join(found)
