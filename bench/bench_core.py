"""Wall-clock cost of phalanx against the plain alternatives, measured in one run.

    .venv/bin/python bench/bench_core.py [--repeats N] [--ps-repeats N] [--json OUT]

Each group's commands run once as warm-up, then round-robin (A, B, A, B, ...) so that
machine noise hits every alternative alike. Each group's last command is its baseline;
the ratio is median(command) / median(baseline). See bench/README.md.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the venv's bin: phalanx, torchrun and python side by side
PY, PHALANX, TORCHRUN = str(BIN / "python"), str(BIN / "phalanx"), str(BIN / "torchrun")
HELLO = "examples/hello.py"
N_FINISHED, N_RUNNING = 1000, 3


def run_once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(argv)}\n{proc.stdout.decode()}{proc.stderr.decode()}")
    return elapsed


def measure(
    group: str, commands: dict[str, list[str]], env: dict[str, str], repeats: int,
    before: Callable[[], None] | None = None,
) -> list[dict]:
    """Warm up every command, then time them round-robin. ``before`` runs untimed before each call."""
    samples: dict[str, list[float]] = {label: [] for label in commands}
    for rnd in range(repeats + 1):  # round 0 is the warm-up
        for label, argv in commands.items():
            if before:
                before()
            elapsed = run_once(argv, env)
            if rnd:
                samples[label].append(elapsed)
        print(f"  {group}: round {rnd}/{repeats}" + (" (warm-up)" if rnd == 0 else ""), file=sys.stderr)
    base = statistics.median(samples[list(commands)[-1]])
    return [
        {"group": group, "command": label, "median_s": statistics.median(s), "min_s": min(s),
         "ratio": statistics.median(s) / base, "extra_s": statistics.median(s) - base, "samples_s": s}
        for label, s in samples.items()
    ]


def populate(home: Path) -> Callable[[], None]:
    """1,000 finished jobs plus a few RUNNING ones whose supervisor is dead; returns a reset
    function that puts those back to RUNNING (every ps checks their supervisor and shows them LOST;
    since the liveness change ps no longer writes that, so the reset keeps the older phalanx honest)."""
    sys.path.insert(0, str(ROOT / "src"))
    from phalanx.store import Store

    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is now free: a supervisor that vanished
    store = Store(home / "phalanx.db")
    now = time.time()
    for i in range(N_FINISHED + N_RUNNING):
        job_id = f"{i:08x}"
        running = i >= N_FINISHED  # the newest, so they also show in ps --all
        created = now - 3600 + i
        store.insert_job(
            id=job_id, name=f"train-{i % 20}", backend="local", nnodes=1, nproc_per_node=1 + i % 4,
            command="train.py", job_dir=str(home / "jobs" / job_id), spec_json="{}",
            state="RUNNING" if running else "SUCCEEDED", created_at=created, started_at=created + 1,
            ended_at=None if running else created + 30, exit_code=None if running else 0,
            supervisor_pid=dead.pid if running else None, supervisor_started=created if running else None,
        )
    store.close()
    running_ids = [f"{i:08x}" for i in range(N_FINISHED, N_FINISHED + N_RUNNING)]

    def reset() -> None:
        with sqlite3.connect(home / "phalanx.db") as conn:
            conn.execute(
                f"UPDATE jobs SET state='RUNNING', ended_at=NULL, root_cause=NULL WHERE id IN ({','.join('?' * len(running_ids))})",
                running_ids,
            )
    return reset


def table(results: list[dict]) -> str:
    lines = [f"{'group':<9} {'command':<52} {'median s':>9} {'min s':>7} {'ratio':>6} {'+median s':>10}"]
    for r in results:
        lines.append(
            f"{r['group']:<9} {r['command']:<52} {r['median_s']:>9.3f} {r['min_s']:>7.3f} {r['ratio']:>6.2f} {r['extra_s']:>+10.3f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds of the run comparisons (default 5)")
    parser.add_argument("--ps-repeats", type=int, default=10, help="timed rounds of the ps group (default 10)")
    parser.add_argument("--json", type=Path, help="also write the results (with every sample) here")
    args = parser.parse_args()

    # A normal install writes bytecode on first import; with PYTHONDONTWRITEBYTECODE set (as on
    # this project's machines) every run would compile phalanx from source instead, which is
    # not what users pay. Torch, in site-packages, was byte-compiled by pip either way.
    compileall.compile_dir(str(ROOT / "src" / "phalanx"), quiet=1)
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-") as tmp:
        run_home, ps_home = Path(tmp, "run"), Path(tmp, "ps")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PHALANX_HOME": str(run_home)}
        results = measure("run -n 2", {
            "phalanx run -n 2 hello.py": [PHALANX, "run", "-n", "2", HELLO],
            "torchrun --standalone --nproc-per-node 2 hello.py": [TORCHRUN, "--standalone", "--nproc-per-node", "2", HELLO],
        }, env, args.repeats)
        results += measure("run -n 1", {
            "phalanx run hello.py": [PHALANX, "run", HELLO],
            "python hello.py": [PY, HELLO],
        }, env, args.repeats)
        reset = populate(ps_home)
        results += measure("cli", {
            f"phalanx ps  ({N_FINISHED}+{N_RUNNING} jobs)": [PHALANX, "ps"],
            "phalanx ps --all": [PHALANX, "ps", "--all"],
            "phalanx ps --all --json": [PHALANX, "ps", "--all", "--json"],
            "phalanx ps --all --json --limit 10000": [PHALANX, "ps", "--all", "--json", "--limit", "10000"],
            "phalanx --help": [PHALANX, "--help"],
            "python -c pass": [PY, "-c", "pass"],
        }, {**env, "PHALANX_HOME": str(ps_home)}, args.ps_repeats, before=reset)

    print(f"\nphalanx core benchmark, {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}")
    print("ratio = median / median of the group's last (baseline) command; +median s = the difference\n")
    print(table(results))
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "platform": platform.platform(),
                "repeats": args.repeats, "ps_repeats": args.ps_repeats}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
