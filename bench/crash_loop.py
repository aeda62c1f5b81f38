"""Crash consistency, longer: ``python bench/crash_loop.py [ROUNDS]`` kills the CLI and the
supervisor at random instants (tests/faults/crashes.py) and prints the rounds, the states the
jobs were left in and every invariant violation (goal: 0)."""

from __future__ import annotations

import collections
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.faults.crashes import JOB, MODES, round_, rows, violations  # noqa: E402


def main() -> None:
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    with tempfile.TemporaryDirectory() as tmp:
        home, code = Path(tmp) / "home", Path(tmp) / "code"
        code.mkdir()
        (code / "job.py").write_text(JOB)
        rng = random.Random()
        found: list[str] = []
        for n in range(total):
            mode = round_(home, code, rng, MODES[n % len(MODES)])
            found += [f"round {n} ({mode}): {v}" for v in violations(home)]
        states = collections.Counter(state for _, state, _, _ in rows(home))
        print(f"rounds {total}, jobs recorded {sum(states.values())}, states {dict(states)}, violations {len(found)}")
        for line in found:
            print(" ", line)


if __name__ == "__main__":
    main()
