"""CPU the CLI spends while a job is quiet: this tree against main, in the same run.

    .venv/bin/python bench/bench_follow.py [--seconds 60] [--rounds 2] [--main-ref main | --main-src PATH] [--json OUT]

A job that prints one line and then sleeps (``sleep.py``), run four ways at once:

- ``phalanx run sleep.py`` in the foreground (supervisor, resource sampler, metrics collector
  and the console stream, all in that one process), from this tree and from main;
- ``phalanx logs -f JOB`` following a detached run of it, from this tree and from main.

After ``--settle`` seconds (start-up: imports, launching the rank), the CPU time (user +
system, the process itself, not its children) of each of the four processes is read with
psutil, and again ``--seconds`` later: CPU seconds per minute of a quiet job. main runs with
``PYTHONPATH`` at its own source, so its agents and ranks are main's code too.
Ratio = this tree / main.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
SLEEPER = "import sys, time\nprint('started', flush=True)\ntime.sleep(float(sys.argv[1]))\nprint('done', flush=True)\n"


def phalanx(src: str, home: Path, *args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PHALANX_HOME": str(home), "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "phalanx", *args], env=env, cwd=home.parent, **kw)


def cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def one_round(codes: dict[str, str], work: Path, seconds: float, settle: float) -> dict[str, float]:
    work.mkdir(parents=True)
    script = work / "sleep.py"
    script.write_text(SLEEPER)
    length = str(settle + seconds + 5)
    procs: dict[str, subprocess.Popen] = {}
    homes = {code: work / f"home-{code}" for code in codes}
    for code, src in codes.items():
        detached = phalanx(src, homes[code], "run", "-d", "--name", "quiet-d", str(script), length,
                           stdout=subprocess.PIPE, text=True)
        job_id = detached.communicate(timeout=120)[0].strip()
        procs[f"{code}: phalanx logs -f (quiet job)"] = phalanx(src, homes[code], "logs", "-f", job_id,
                                                                 stdout=subprocess.DEVNULL)
        procs[f"{code}: phalanx run (foreground, quiet job)"] = phalanx(src, homes[code], "run", "--name", "quiet",
                                                                         str(script), length, stdout=subprocess.DEVNULL)
    time.sleep(settle)
    handles = {label: psutil.Process(p.pid) for label, p in procs.items()}
    start = {label: cpu(h) for label, h in handles.items()}
    time.sleep(seconds)
    used = {label: cpu(h) - start[label] for label, h in handles.items()}
    for label, p in procs.items():
        if p.wait(timeout=120) != 0:
            sys.exit(f"{label} failed")
    return {label: 60 * u / seconds for label, u in used.items()}


def main_source(args: argparse.Namespace, work: Path) -> str:
    if args.main_src:
        return str(Path(args.main_src).resolve())
    dest = work / "main-src"
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.main_ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return str(dest / "src")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--main-ref", default="main")
    parser.add_argument("--main-src")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="phalanx-bench-follow-"))
    try:
        codes = {"this": str(ROOT / "src"), "main": main_source(args, work)}
        rounds = []
        for rnd in range(args.rounds):
            rounds.append(one_round(codes, work / f"round-{rnd}", args.seconds, args.settle))
            print(f"  round {rnd + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nphalanx follow benchmark, {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}")
    print(f"CPU seconds per minute of a quiet job ({args.seconds:g} s measured after {args.settle:g} s, "
          f"median of {args.rounds} rounds); ratio = this tree / main\n")
    rows = []
    for what in ("phalanx run (foreground, quiet job)", "phalanx logs -f (quiet job)"):
        this = statistics.median(r[f"this: {what}"] for r in rounds)
        main_cpu = statistics.median(r[f"main: {what}"] for r in rounds)
        rows.append({"what": what, "this_cpu_s_per_min": this, "main_cpu_s_per_min": main_cpu,
                     "ratio": this / main_cpu if main_cpu else None})
        print(f"{what:<40} this {this:7.3f} s/min   main {main_cpu:7.3f} s/min   ratio {this / main_cpu:.3f}")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "platform": platform.platform()}
        args.json.write_text(json.dumps({"meta": meta, "results": rows, "rounds": rounds}, indent=2) + "\n")


if __name__ == "__main__":
    main()
