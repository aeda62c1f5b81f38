"""phalanx's Ray backend against the same placement-group driver submitted by hand.

Starts the test suite's Ray cluster (tests/cluster/ray_cluster.py: head + worker in network
namespaces, token auth), then times, round-robin, a 2-node job running examples/hello.py:

- ``phalanx run --backend ray -n 2x1 hello.py`` (foreground: it streams every rank's lines);
- ``ray job submit --working-dir DIR -- PYTHON ray_hand_driver.py 2 hello.py`` (blocking: it
  streams the driver's log, where Ray forwards the actors' output).

Reported per command: seconds from the start of the command until every rank's first line
appeared on its output, and until it exited (total wall); medians and the ratio phalanx/by hand.

    sudo .venv/bin/python bench/bench_ray.py [--repeats 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cluster import ray_cluster  # noqa: E402

HELLO = re.compile(r"hello from rank (\d) of 2")


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, int]:
    """(seconds to every rank's first line, seconds to exit, exit code)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[str] = set()
    first = float("nan")
    assert proc.stdout is not None
    for line in proc.stdout:
        match = HELLO.search(line)
        if match:
            seen.add(match.group(1))
            if len(seen) == 2 and first != first:
                first = time.monotonic() - start
    code = proc.wait()
    return first, time.monotonic() - start, code


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    cluster = ray_cluster.start(work / "cluster")
    try:
        project = work / "project"
        project.mkdir()
        shutil.copy(ROOT / "examples" / "hello.py", project / "hello.py")
        shutil.copy(ROOT / "bench" / "ray_hand_driver.py", project / "ray_hand_driver.py")
        env = {**os.environ, **cluster.client_env, "PHALANX_HOME": str(work / "phx"), "OMP_NUM_THREADS": "1",
               "RAY_AUTH_MODE": "token"}
        venv = Path(sys.executable).parent
        commands = {
            "phalanx": [str(venv / "phalanx"), "run", "--backend", "ray", "-n", "2x1", "hello.py"],
            "by hand": [str(venv / "ray"), "job", "submit", "--address", cluster.address, "--working-dir", ".",
                        "--runtime-env-json", json.dumps({"env_vars": {"OMP_NUM_THREADS": "1"}}),
                        "--", sys.executable, "ray_hand_driver.py", "2", "hello.py"],
        }
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for name, argv in commands.items():  # warm-up: the working_dir upload, workers started once
            timed(argv, env, project)
        for _ in range(args.repeats):
            for name, argv in commands.items():
                first, total, code = timed(argv, env, project)
                if code != 0:
                    raise SystemExit(f"{name} exited {code}")
                samples[name].append((first, total))
        rows = {name: (statistics.median(s[0] for s in vals), statistics.median(s[1] for s in vals))
                for name, vals in samples.items()}
        base = rows["by hand"]
        print(f"{'command':<10} {'first line (s)':>15} {'total (s)':>10} {'ratio first':>12} {'ratio total':>12}")
        for name, (first, total) in rows.items():
            print(f"{name:<10} {first:>15.2f} {total:>10.2f} {first / base[0]:>12.2f} {total / base[1]:>12.2f}")
        if args.json:
            Path(args.json).write_text(json.dumps({"samples": samples, "medians": rows}, indent=2))
    finally:
        ray_cluster.stop(cluster)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
