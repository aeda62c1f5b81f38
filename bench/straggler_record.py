"""Record the resource samples of real 4-rank runs (bench/straggler_train.py under phalanx), healthy
and with one slow rank, into tests/unit/recorded/stragglers/: the detector's unit tests replay them
(cheap, and the same data every time), so the "no warning on a healthy run" check covers many
real runs without running them in CI.

    python bench/straggler_record.py --healthy 20 --slow 6 --seconds 40
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "unit" / "recorded" / "stragglers"
TRAIN = ROOT / "bench" / "straggler_train.py"


def record(name: str, seconds: float, slow_rank: int, factor: float, nodes: str) -> None:
    home = Path(tempfile.mkdtemp(prefix="phx-rec-"))
    env = {**os.environ, "PHALANX_HOME": str(home), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "phalanx", "run", "-q", "--cold", "-n", nodes, str(TRAIN), "--seconds", str(seconds)]
    if slow_rank >= 0:
        argv += ["--slow-rank", str(slow_rank), "--factor", str(factor)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 300)
    if done.returncode != 0:
        print(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}", file=sys.stderr)
        shutil.rmtree(home, ignore_errors=True)
        return
    job = next((home / "jobs").iterdir())
    lines = []
    for node_dir in sorted((job / "attempt_0").glob("node_*")):
        lines += (node_dir / "resources.jsonl").read_text().splitlines()
    meta = {"slow_rank": slow_rank, "factor": factor, "topology": nodes, "seconds": seconds,
            "load": os.getloadavg()[0], "cores": os.cpu_count()}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.jsonl").write_text(json.dumps({"meta": meta}) + "\n" + "\n".join(lines) + "\n")
    print(f"{name}: {len(lines)} samples, load {meta['load']:.1f}", flush=True)
    shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", type=int, default=20)
    parser.add_argument("--slow", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--start", type=int, default=0, help="first file number")
    args = parser.parse_args()
    for i in range(args.start, args.start + args.healthy):
        record(f"healthy-{i:02d}", args.seconds, -1, 1.0, "4" if i % 4 else "2x2")
    for i in range(args.start, args.start + args.slow):
        factor = (3.0, 2.0, 2.5)[i % 3]
        record(f"slow-{i:02d}", args.seconds, (3, 1, 2)[i % 3], factor, "4" if i % 2 else "2x2")


if __name__ == "__main__":
    main()
