"""``phalanx ps`` with 100,000 jobs in the store: this tree's filters, columns and sweep rows
against main's ``ps`` in the same run (the command as a user types it, start-up included).

    .venv/bin/python bench/bench_ps.py [--size 100000] [--repeats 7] [--dir /tmp/phalanx-bench-ui]
        [--main-ref main | --main-src PATH]

The homes are ``bench_ui.py``'s (filled here when missing): the same jobs for both codes
(``bench_store.rows``), this tree's with metric summaries and tags. Reported: median wall time
and CPU time (user + system of the child) of ``--repeats`` runs after a warm-up, round-robin
between the commands; ratio = this tree / main's ``ps --all`` (the nearest command main has).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

COMMANDS = {
    "ps": ["ps"],
    "ps --all": ["ps", "--all"],
    "ps --state failed": ["ps", "--state", "failed"],
    "ps --name train-42": ["ps", "--name", "train-42"],
    "ps --tag team=vision": ["ps", "--tag", "team=vision"],
    "ps -c loss --sort loss": ["ps", "-c", "loss", "--sort", "loss"],
    "ps --all --wide": ["ps", "--all", "--wide"],
    "ps --search train-4242": ["ps", "--search", "train-4242"],
}


def timed(src: str, home: Path, args: list[str]) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": src, "PHALANX_HOME": str(home)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "phalanx", *args], env=env, check=True, capture_output=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    from bench_ui import fill

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "phalanx-bench-ui"))
    parser.add_argument("--main-ref", default="main")
    parser.add_argument("--main-src", default=None)
    args = parser.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    main_src = args.main_src
    if main_src is None:
        dest = work / f"main-src-{args.main_ref}"
        if not (dest / "src").is_dir():
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.main_ref], capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        main_src = str(dest / "src")
    codes = {"this tree": (str(ROOT / "src"), work / f"tree-{args.size}"), "main": (main_src, work / f"main-{args.size}")}
    for label, (src, home) in codes.items():
        filled = home / "filled.json"
        if not filled.exists() or json.loads(filled.read_text())["jobs"] != args.size:
            shutil.rmtree(home, ignore_errors=True)
            fill(src, home, args.size, extras=label == "this tree")
    runs = [("main", "ps --all", COMMANDS["ps --all"]), ("main", "ps", COMMANDS["ps"])]
    runs += [("this tree", name, cmd) for name, cmd in COMMANDS.items()]
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for round_ in range(args.repeats + 1):
        for label, name, cmd in runs:
            src, home = codes[label]
            result = timed(src, home, cmd)
            if round_:
                samples.setdefault((label, name), []).append(result)
    base = statistics.median(w for w, _ in samples[("main", "ps --all")])
    print(f"\n{args.size:,} jobs; ratio = wall time / main's `ps --all`\n")
    print("| code | command | wall (ms) | CPU (ms) | ratio |\n|---|---|---:|---:|---:|")
    for (label, name), values in samples.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        print(f"| {label} | `{name}` | {wall * 1000:.0f} | {cpu * 1000:.0f} | {wall / base:.2f} |")


if __name__ == "__main__":
    main()
