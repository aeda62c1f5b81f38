"""What metric extraction and resource sampling cost, against the tools a user would pick instead.

    .venv/bin/python bench/bench_metrics.py [--lines N] [--repeats R] [--mode collector,run,sampler] [--json OUT]

collector  A script printing N lines like ``epoch 1 step 123 loss=0.1234 acc=0.5`` into its rank
           log (as phalanx's bootstrap makes every worker do), read while it runs by a
           MetricsCollector thread polling every second with two metric definitions (plus the
           automatic pick-up), then a final poll: the way the supervisor runs it. Compared with
           the same script under ``torchrun --tee 3 --log-dir`` and with the script alone.
run        End to end: ``phalanx run --metric loss=... --metric acc=... script`` against
           ``torchrun --tee 3 --log-dir`` (needs the collector wired into the supervisor; the
           row says so when the job directory has no metrics file).
sampler    A busy 2-process job (both processes spin) sampled by a ResourceSampler at its
           default interval (5 s) and at 1 s: CPU seconds of the sampling thread against the
           job's CPU seconds, and as a share of one core.

Commands run round-robin after a warm-up, so machine noise hits every alternative alike.
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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from phalanx.core.paths import JobPaths  # noqa: E402
from phalanx.core.spec import parse_metric  # noqa: E402
from phalanx.monitor.metrics import MetricsCollector  # noqa: E402
from phalanx.monitor.resources import DEFAULT_INTERVAL, ResourceSampler  # noqa: E402

BIN = Path(sys.executable).parent
PY, PHALANX, TORCHRUN = str(BIN / "python"), str(BIN / "phalanx"), str(BIN / "torchrun")
DEFS = ["loss=loss=([0-9.eE+-]+)", "acc=acc=([0-9.]+)"]
PRINTER = """import sys
n = int(sys.argv[1])
for i in range(n):
    print(f"epoch {i // 10000 + 1} step {i} loss={1.0 / (i + 1):.4f} acc=0.5")
"""
BUSY = "import time\nend = time.time() + float(__import__('sys').argv[1])\nwhile time.time() < end: pass\n"


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def script_with_collector(work: Path, script: Path, lines: int, collect: bool, stream: bool) -> dict:
    """The script writes its own rank log; this process polls it as the supervisor would."""
    paths = JobPaths(Path(tempfile.mkdtemp(dir=work)))
    log = paths.rank_log(0, 0)
    log.parent.mkdir(parents=True)
    start = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen([PY, "-u", str(script), str(lines)], stdout=out, stderr=subprocess.STDOUT, env=_env())
    collector = MetricsCollector(paths, 0, [parse_metric(d) for d in DEFS]).start(1.0) if collect else None
    done = threading.Event()
    streamer = None
    if stream:  # what a foreground `phalanx run` also does: print every rank's lines
        from phalanx.monitor.tail import follow_attempts

        devnull = open(os.devnull, "w")
        streamer = threading.Thread(target=follow_attempts, args=(paths, 0, None, False, devnull, done), daemon=True)
        streamer.start()
    proc.wait()
    records = collector.stop() if collector else 0
    done.set()
    if streamer:
        streamer.join()
    wall = time.perf_counter() - start
    shutil.rmtree(paths.root)
    return {"wall": wall, "records": records, "collector_cpu": collector.cpu_seconds if collector else 0.0}


def torchrun_tee(work: Path, script: Path, lines: int, nproc: int) -> dict:
    logs = Path(tempfile.mkdtemp(dir=work))
    start = time.perf_counter()
    subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), "--tee", "3", "--log-dir", str(logs),
                    str(script), str(lines)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(), check=True)
    wall = time.perf_counter() - start
    shutil.rmtree(logs)
    return {"wall": wall}


def phalanx_run(work: Path, script: Path, lines: int, nproc: int) -> dict:
    home = Path(tempfile.mkdtemp(dir=work))
    argv = [PHALANX, "run", "-n", str(nproc), *[a for d in DEFS for a in ("--metric", d)], str(script), str(lines)]
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**_env(), "PHALANX_HOME": str(home)}, check=True)
    wall = time.perf_counter() - start
    wired = any(home.glob("jobs/*/attempt_0/rank_*/metrics.*"))
    shutil.rmtree(home)
    return {"wall": wall, "wired": wired}


def round_robin(name: str, cases: dict, repeats: int) -> list[dict]:
    samples: dict[str, list[dict]] = {label: [] for label in cases}
    for rnd in range(repeats + 1):
        for label, fn in cases.items():
            result = fn()
            if rnd:
                samples[label].append(result)
        print(f"  {name}: round {rnd}/{repeats}" + (" (warm-up)" if rnd == 0 else ""), file=sys.stderr)
    base = statistics.median(r["wall"] for r in samples[list(cases)[-1]])
    rows = []
    for label, results in samples.items():
        walls = [r["wall"] for r in results]
        row = {"group": name, "command": label, "median_s": statistics.median(walls), "min_s": min(walls),
               "ratio": statistics.median(walls) / base, "samples_s": walls}
        if results and "collector_cpu" in results[0] and results[0]["records"]:
            row["collector_cpu_s"] = statistics.median(r["collector_cpu"] for r in results)
            row["records"] = results[0]["records"]
        if results and "wired" in results[0]:
            row["wired"] = all(r["wired"] for r in results)
        rows.append(row)
    return rows


def sampler_overhead(seconds: float, interval: float) -> dict:
    """CPU seconds of the sampling thread against the CPU seconds of a busy 2-process job."""
    import psutil

    procs = [subprocess.Popen([PY, "-c", BUSY, str(seconds)]) for _ in range(2)]
    out = Path(tempfile.mkdtemp()) / "resources.jsonl"
    sampler = ResourceSampler(out, 0, lambda: {i: p.pid for i, p in enumerate(procs)}, interval).start()
    handles = [psutil.Process(p.pid) for p in procs]
    job_cpu = 0.0
    for p, h in zip(procs, handles):
        times = None
        while p.poll() is None:
            try:
                times = h.cpu_times()
            except psutil.NoSuchProcess:
                break
            time.sleep(0.2)
        job_cpu += (times.user + times.system) if times else 0.0
    sampler.stop()
    shutil.rmtree(out.parent)
    return {"interval_s": interval, "seconds": seconds, "samples": sampler.samples, "sampler_cpu_s": sampler.cpu_seconds,
            "job_cpu_s": job_cpu, "sampler_share_of_job": sampler.cpu_seconds / job_cpu if job_cpu else None,
            "core_percent": 100 * sampler.cpu_seconds / seconds,
            "ms_per_sample": 1000 * sampler.cpu_seconds / max(1, sampler.samples)}


def table(rows: list[dict]) -> str:
    lines = [f"{'group':<10} {'command':<58} {'median s':>9} {'min s':>7} {'ratio':>6}  notes"]
    for r in rows:
        note = ""
        if "collector_cpu_s" in r:
            note = f"collector CPU {r['collector_cpu_s']:.2f} s for {r['records']:,} records"
        if r.get("wired") is False:
            note = "collector not wired yet: no metrics file"
        lines.append(f"{r['group']:<10} {r['command']:<58} {r['median_s']:>9.3f} {r['min_s']:>7.3f} {r['ratio']:>6.2f}  {note}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--nproc", type=int, default=1, help="processes for the torchrun / phalanx run rows")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", default="collector,run,sampler")
    parser.add_argument("--sampler-seconds", type=float, default=30.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    modes = set(args.mode.split(","))
    rows: list[dict] = []
    overhead: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-metrics-") as tmp:
        work = Path(tmp)
        script = work / "printer.py"
        script.write_text(PRINTER)
        n = args.lines
        if "collector" in modes:
            rows += round_robin("collector", {
                "script + collector (1 s polls, 2 defs + auto)": lambda: script_with_collector(work, script, n, True, False),
                "script + collector + console stream (phalanx run -n 1)": lambda: script_with_collector(work, script, n, True, True),
                "script alone, writing its log": lambda: script_with_collector(work, script, n, False, False),
                "torchrun --tee 3 --log-dir (nproc 1)": lambda: torchrun_tee(work, script, n, 1),
            }, args.repeats)
        if "run" in modes:
            rows += round_robin("run", {
                f"phalanx run -n {args.nproc} --metric loss --metric acc": lambda: phalanx_run(work, script, n // args.nproc, args.nproc),
                f"torchrun --tee 3 --log-dir (nproc {args.nproc})": lambda: torchrun_tee(work, script, n // args.nproc, args.nproc),
            }, args.repeats)
        if "sampler" in modes:
            for interval in (DEFAULT_INTERVAL, 1.0):
                overhead.append(sampler_overhead(args.sampler_seconds, interval))
                print(f"  sampler: interval {interval} s done", file=sys.stderr)
    print(f"\nphalanx metrics benchmark, {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}")
    if rows:
        print(f"{n:,} lines; ratio = median / median of the group's last command\n")
        print(table(rows))
    for o in overhead:
        print(f"\nsampler every {o['interval_s']:g} s on a busy 2-process job ({o['seconds']:g} s, {o['samples']} samples): "
              f"{o['sampler_cpu_s']:.3f} CPU s against the job's {o['job_cpu_s']:.1f} CPU s = "
              f"{100 * (o['sampler_share_of_job'] or 0):.3f}% of the job, {o['core_percent']:.3f}% of one core, "
              f"{o['ms_per_sample']:.1f} ms per sample")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "platform": platform.platform(), "lines": n}
        args.json.write_text(json.dumps({"meta": meta, "results": rows, "sampler": overhead}, indent=2) + "\n")


if __name__ == "__main__":
    main()
