"""How long the command line takes to answer: `phalanx --help`, `phalanx run --help` and a
`phalanx run --dry-run`, against what a user would type instead (`torchrun --help`, and
`python -c pass` as the interpreter's floor), round-robin so load on the machine hits every
command alike. Reports the median wall time and CPU time (user + system of the child; less
sensitive to other work on the machine) and the ratio of each to the floor.

With ``--before SRC`` (a ``src`` directory of another phalanx, e.g. from ``git archive``) the
phalanx commands also run from there, for a before/after comparison in the same run::

    git archive main src | tar -x -C /tmp/before
    .venv/bin/python bench/bench_cli_startup.py --before /tmp/before/src --repeats 11
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _sample(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed:\n{proc.stderr.decode()[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--before", help="a src directory of another phalanx to compare with")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="phx-bench-cli-")
    Path(work, "t.py").write_text("print('hi')\n")
    env = {**os.environ, "PHALANX_HOME": str(Path(work, "home")), "OMP_NUM_THREADS": "1"}
    py = sys.executable
    sources = {"": str(ROOT / "src")} | ({"before ": args.before} if args.before else {})
    commands: dict[str, tuple[list[str], dict[str, str]]] = {"python -c pass": ([py, "-c", "pass"], env)}
    for label, src in sources.items():
        src_env = {**env, "PYTHONPATH": src}
        commands[f"{label}phalanx --help"] = ([py, "-m", "phalanx", "--help"], src_env)
        commands[f"{label}phalanx run --help"] = ([py, "-m", "phalanx", "run", "--help"], src_env)
        commands[f"{label}phalanx run --dry-run t.py"] = ([py, "-m", "phalanx", "run", "--dry-run", "t.py"], src_env)
    commands["torchrun --help"] = ([py, "-m", "torch.distributed.run", "--help"], env)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for name, (argv, cmd_env) in commands.items():  # warm up (bytecode caches)
        _sample(argv, cmd_env, work)
    for round_ in range(args.repeats):
        order = list(commands.items())
        for name, (argv, cmd_env) in order if round_ % 2 == 0 else reversed(order):
            samples[name].append(_sample(argv, cmd_env, work))
    floor_wall = statistics.median(w for w, _ in samples["python -c pass"])
    floor_cpu = statistics.median(c for _, c in samples["python -c pass"])
    print(f"{'command':34s} {'wall s':>8s} {'cpu s':>8s} {'wall/floor':>11s} {'cpu/floor':>10s}")
    for name, values in samples.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        print(f"{name:34s} {wall:8.3f} {cpu:8.3f} {wall / floor_wall:11.2f} {cpu / floor_cpu:10.2f}")


if __name__ == "__main__":
    main()
