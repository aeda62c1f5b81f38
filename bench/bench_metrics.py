"""What metric extraction and resource sampling cost, against the tools a user would pick instead.

    .venv/bin/python bench/bench_metrics.py [--lines N] [--repeats R] [--mode collector,run,sampler,format] [--json OUT]

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
format     The metrics file of N printed lines of a training log (noisy loss and accuracy with
           4 decimals, step, epoch), by this tree's collector and by main's (``--main-ref``, a
           ``git archive`` of it, or ``--main-src``), each in its own process: the file's size
           against the log's, the collector's CPU, and reading it back for a chart: one
           metric's N points as the dashboard reads them (``web.series.metric_series``, a cold
           cache), and the ``phalanx metrics`` summary (``report.metrics_report``).

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
PY, PHALANX = str(BIN / "python"), str(BIN / "phalanx")
# torchrun itself, or the same module through this interpreter where torch comes from elsewhere
TORCHRUN = [str(BIN / "torchrun")] if (BIN / "torchrun").exists() else [PY, "-m", "torch.distributed.run"]
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
    subprocess.run([*TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), "--tee", "3", "--log-dir", str(logs),
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


TRAINING_LOG = """import math, random, sys
rnd = random.Random(0)
out = sys.stdout
for i in range(int(sys.argv[1])):
    out.write(f"epoch {i // 10000 + 1} step {i} loss={2.5 * math.exp(-i / 2e5) + 0.1 * rnd.random():.4f} "
              f"acc={min(1.0, i / 5e5 + 0.05 * rnd.random()):.4f}\\n")
"""

FORMAT_WORKER = """import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from phalanx.core.paths import JobPaths
from phalanx.core.spec import parse_metric
from phalanx.monitor.metrics import MetricsCollector
paths = JobPaths(Path(sys.argv[2]))
for f in paths.rank_dir(0, 0).glob("metrics.*"):
    f.unlink()
c = MetricsCollector(paths, 0, [parse_metric("loss=loss=([0-9.eE+-]+)"), parse_metric("acc=acc=([0-9.]+)")])
began = time.process_time()
c.poll(final=True)
collect = time.process_time() - began
(metrics,) = paths.rank_dir(0, 0).glob("metrics.*")

class Record:
    id, job_dir, nnodes, nproc_per_node, attempt, name = "bench", str(paths.root), 1, 1, 0, "bench"

from phalanx.web import data
from phalanx.monitor.report import metrics_report
reads = {"chart": [], "summary": []}
for _ in range(3):
    data._cache.clear()
    began = time.perf_counter()
    chart = data.metric_series(Record(), None, [0])
    reads["chart"].append(time.perf_counter() - began)
    began = time.perf_counter()
    report = metrics_report(Record())
    reads["summary"].append(time.perf_counter() - began)
assert chart["metrics"]["loss"][0]["count"] == c.records // 2 and report["metrics"]["loss"]["count"] == c.records // 2
print(json.dumps({"file": metrics.name, "bytes": metrics.stat().st_size, "records": c.records, "collect_cpu_s": collect,
                  "chart_s": min(reads["chart"]), "summary_s": min(reads["summary"])}))
"""


def main_source(ref: str, src: str | None, work: Path) -> str:
    if src:
        return str(Path(src).resolve())
    dest = work / "main-src"
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return str(dest / "src")


def metrics_format(work: Path, lines: int, main_src: str) -> list[dict]:
    """Size of the metrics file against the log, and reading it back, for this tree and main."""
    paths = JobPaths(work / "format-job")
    log = paths.rank_log(0, 0)
    log.parent.mkdir(parents=True)
    printer = work / "training_log.py"
    printer.write_text(TRAINING_LOG)
    with open(log, "wb") as out:
        subprocess.run([PY, str(printer), str(lines)], stdout=out, check=True)
    rows = []
    for code, src in (("this tree", str(ROOT / "src")), ("main", main_src)):
        done = subprocess.run([PY, "-c", FORMAT_WORKER, src, str(paths.root)], capture_output=True, text=True, env=_env())
        if done.returncode != 0:
            sys.exit(f"format worker ({code}) failed:\n{done.stderr}")
        rows.append({"code": code, "log_bytes": log.stat().st_size, **json.loads(done.stdout.strip().splitlines()[-1])})
        print(f"  format: {code} done", file=sys.stderr)
    return rows


def format_table(rows: list[dict], lines: int) -> str:
    this, main_row = rows
    out = [f"{lines:,} printed lines, log {this['log_bytes'] / 1e6:.1f} MB; ratio = this tree / main\n",
           f"{'':<44} {'this tree':>12} {'main':>12} {'ratio':>7}"]
    for label, key, scale, unit in (("metrics file", "bytes", 1e-6, "MB"), ("collector CPU (final poll)", "collect_cpu_s", 1, "s"),
                                    ("chart: rank 0's 2 metrics (dashboard)", "chart_s", 1, "s"),
                                    ("phalanx metrics summary", "summary_s", 1, "s")):
        out.append(f"{label:<44} {this[key] * scale:>9.3f} {unit:<2} {main_row[key] * scale:>9.3f} {unit:<2} "
                   f"{this[key] / main_row[key]:>7.3f}")
    out.append(f"{'metrics file / log':<44} {this['bytes'] / this['log_bytes']:>12.3f} "
               f"{main_row['bytes'] / main_row['log_bytes']:>12.3f}")
    return "\n".join(out)


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
    parser.add_argument("--main-ref", default="main", help="git ref of main's code (format mode)")
    parser.add_argument("--main-src", help="main's src directory instead of a git archive (format mode)")
    args = parser.parse_args()
    modes = set(args.mode.split(","))
    rows: list[dict] = []
    overhead: list[dict] = []
    formats: list[dict] = []
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
        if "format" in modes:
            formats = metrics_format(work, n, main_source(args.main_ref, args.main_src, work))
        if "sampler" in modes:
            for interval in (DEFAULT_INTERVAL, 1.0):
                overhead.append(sampler_overhead(args.sampler_seconds, interval))
                print(f"  sampler: interval {interval} s done", file=sys.stderr)
    print(f"\nphalanx metrics benchmark, {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}")
    if rows:
        print(f"{n:,} lines; ratio = median / median of the group's last command\n")
        print(table(rows))
    if formats:
        print("\n" + format_table(formats, n))
    for o in overhead:
        print(f"\nsampler every {o['interval_s']:g} s on a busy 2-process job ({o['seconds']:g} s, {o['samples']} samples): "
              f"{o['sampler_cpu_s']:.3f} CPU s against the job's {o['job_cpu_s']:.1f} CPU s = "
              f"{100 * (o['sampler_share_of_job'] or 0):.3f}% of the job, {o['core_percent']:.3f}% of one core, "
              f"{o['ms_per_sample']:.1f} ms per sample")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "platform": platform.platform(), "lines": n}
        args.json.write_text(json.dumps({"meta": meta, "results": rows, "sampler": overhead, "format": formats},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
