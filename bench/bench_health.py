"""Gang health, measured on real jobs in one run:

- **NaN detection**: a 2-rank job whose rank 1 prints ``loss=nan`` after ``--nan-at`` seconds of a
  ``--train``-second run (the script writes the time it printed the line). With ``--on-nan stop``:
  seconds from the line to the SIGTERM reaching the ranks and to the job recorded ended (goal: the
  job stopped within 5 s of the line). Against what a user has without it, the same job run to its
  end (phalanx without ``--on-nan``): CPU-seconds of the ranks spent (user + system, from
  ``/proc``, for the whole process trees), and the ratio: CPU-seconds saved per NaN.
- **Straggler**: 4-rank gloo DDP jobs (bench/straggler_train.py, only rank 0 prints), one rank with
  ``--factor`` times the work: seconds from the job's start (and from its first step line) until
  ``health.json`` names the rank; healthy runs: any warning at all is a false positive. The 20
  recorded healthy runs of tests/unit/recorded/stragglers are replayed too.
- **Sampling overhead**: the node's samplers' CPU seconds (``sampling_cpu`` of every resource
  sample: the 5 Hz thread-state probe plus the resource sampler) over wall time, as a share of one
  core; and the probe alone, timed in this process over the ranks of a live job.

    .venv/bin/python bench/bench_health.py [--repeats 3] [--slow 3] [--healthy 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRAIN = HERE / "straggler_train.py"

NAN_SCRIPT = """
import atexit, os, signal, sys, time
rank, out = int(os.environ["RANK"]), os.environ["BENCH_OUT"]
def cpu():  # the rank's own CPU seconds, however it ends
    t = os.times()
    with open(os.path.join(out, f"cpu-{rank}"), "w") as fh:
        fh.write(repr(t.user + t.system))
atexit.register(cpu)
def bye(*_):
    with open(os.path.join(out, f"sigterm-{rank}"), "w") as fh:
        fh.write(repr(time.time()))
    cpu()
    os._exit(143)
signal.signal(signal.SIGTERM, bye)
began, step, printed = time.time(), 0, False
x = 0.0
while time.time() - began < float(sys.argv[1]):
    for i in range(200000):  # a step's work (CPU)
        x += i * 1e-9
    step += 1
    if rank == 1 and not printed and time.time() - began >= float(sys.argv[2]):
        with open(os.path.join(out, "nan-at"), "w") as fh:
            fh.write(repr(time.time()))
        print(f"step {step} loss=nan", flush=True)
        printed = True
    elif step % 20 == 0:
        print(f"step {step} loss={1 / step}", flush=True)
"""


def phalanx(home: Path, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full = {**os.environ, "PHALANX_HOME": str(home), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "phalanx", *args], env=full, capture_output=True, text=True, timeout=timeout)


def status(home: Path, job: str) -> dict:
    return json.loads(phalanx(home, "status", job, "--json").stdout)


def nan_round(home: Path, train: float, nan_at: float, guard: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix="nan-", dir=home))
    script = work / "nan_job.py"
    script.write_text(NAN_SCRIPT)
    began = time.time()
    done = phalanx(home, "run", "-q", "--cold", "-n", "2", *(["--on-nan", "stop"] if guard else []), str(script),
                   str(train), str(nan_at), env={"BENCH_OUT": str(work)})
    ended = time.time()
    line = float((work / "nan-at").read_text()) if (work / "nan-at").exists() else None
    terms = [float(p.read_text()) for p in work.glob("sigterm-*")]
    cpu = sum(float(p.read_text()) for p in work.glob("cpu-*"))
    jobs = sorted((home / "jobs").iterdir(), key=lambda p: p.stat().st_mtime)
    record = status(home, jobs[-1].name)
    return {"guard": guard, "exit": done.returncode, "state": record["state"], "line": line,
            "sigterm_after": (min(terms) - line) if terms and line else None,
            "ended_after": (record["ended_at"] - line) if line and record.get("ended_at") else None,
            "run_wall": ended - began, "cpu": cpu, "cause": str((record.get("root_cause") or {}).get("message", ""))[:80]}


def straggler_round(home: Path, seconds: float, slow_rank: int, factor: float) -> dict:
    args = ["run", "-d", "--cold", "-n", "4", str(TRAIN), "--seconds", str(seconds)]
    if slow_rank >= 0:
        args += ["--slow-rank", str(slow_rank), "--factor", str(factor)]
    job = phalanx(home, *args).stdout.strip()
    started = time.time()
    first_step = named = None
    found = None
    while True:
        record = status(home, job)
        health = record.get("health") or {}
        if first_step is None:
            log = Path(record["job_dir"]) / "attempt_0" / "rank_0" / "output.log"
            if log.exists() and "step " in log.read_text():
                first_step = time.time()
        if health.get("straggler") and named is None:
            named, found = time.time(), health["straggler"]
            if slow_rank >= 0:
                phalanx(home, "stop", job)
        if record["state"] not in ("PENDING", "RUNNING", "STOPPING"):
            break
        time.sleep(0.5)
    log = (Path(record["job_dir"]) / "supervisor.log").read_text()
    samples = []
    for node in sorted((Path(record["job_dir"]) / "attempt_0").glob("node_*")):
        samples += [json.loads(line) for line in (node / "resources.jsonl").read_text().splitlines() if line.strip()]
    return {"slow_rank": slow_rank, "factor": factor, "named": found["ranks"] if found else None,
            "named_factor": found["factor"] if found else None,
            "after_start": (named - started) if named else None,
            "after_first_step": (named - first_step) if named and first_step else None,
            "warned": "slower per step" in log, "overhead": overhead(samples)}


def overhead(samples: list[dict]) -> float | None:
    """Share of one core the node's samplers used: their CPU seconds over the wall time."""
    with_cpu = [s for s in samples if "sampling_cpu" in s]
    if len(with_cpu) < 2:
        return None
    with_cpu.sort(key=lambda s: s["time"])
    first, last = with_cpu[0], with_cpu[-1]
    return (last["sampling_cpu"] - first["sampling_cpu"]) / max(last["time"] - first["time"], 1e-9)


def probe_cost(rounds: int = 2000) -> float:
    """Seconds one probe of four live processes costs in this process."""
    sys.path.insert(0, str(ROOT / "src"))
    from phalanx.health.straggler_probe import StateProbe

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(4)]
    try:
        time.sleep(0.5)
        probe = StateProbe(lambda: {})
        ranks = {i: p.pid for i, p in enumerate(procs)}
        began = time.thread_time()
        for _ in range(rounds):
            probe.probe(ranks)
        return (time.thread_time() - began) / rounds
    finally:
        for p in procs:
            p.kill()
            p.wait()


def replay_recorded() -> tuple[int, int]:
    """(healthy recorded runs, those that drew a warning at any moment)."""
    sys.path.insert(0, str(ROOT / "src"))
    from phalanx.health.straggler import from_probes

    runs = warned = 0
    for path in sorted((ROOT / "tests" / "unit" / "recorded" / "stragglers").glob("healthy-*.jsonl")):
        samples = [json.loads(line) for line in path.read_text().splitlines()[1:] if line.strip()]
        runs += 1
        times = sorted({s["time"] for s in samples})
        warned += any(from_probes([s for s in samples if s["time"] <= t]) for t in times)
    return runs, warned


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3, help="NaN rounds (each: with and without --on-nan)")
    parser.add_argument("--train", type=float, default=40.0, help="seconds the NaN job trains")
    parser.add_argument("--nan-at", type=float, default=8.0)
    parser.add_argument("--slow", type=int, default=3, help="straggler runs with a slow rank")
    parser.add_argument("--healthy", type=int, default=2, help="healthy straggler runs")
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-health-"))
    out: dict = {"load": os.getloadavg(), "cores": os.cpu_count()}

    nan = []
    for _ in range(args.repeats):  # interleaved: the machine's load weighs on both alike
        for guard in (True, False):
            nan.append(nan_round(home, args.train, args.nan_at, guard))
            print(json.dumps(nan[-1]), flush=True)
    out["nan"] = nan
    stopped = [r for r in nan if r["guard"]]
    ran = [r for r in nan if not r["guard"]]
    med = statistics.median
    print(f"\nNaN: job stopped {med(r['ended_after'] for r in stopped):.2f}s after the line (median; max "
          f"{max(r['ended_after'] for r in stopped):.2f}s), SIGTERM after {med(r['sigterm_after'] for r in stopped):.2f}s")
    saved = med(r["cpu"] for r in ran) - med(r["cpu"] for r in stopped)
    print(f"NaN: ranks' CPU-seconds {med(r['cpu'] for r in stopped):.1f} with --on-nan stop against "
          f"{med(r['cpu'] for r in ran):.1f} run to the end: {saved:.1f} CPU-s saved per NaN "
          f"(ratio {med(r['cpu'] for r in ran) / max(med(r['cpu'] for r in stopped), 1e-9):.1f}x)")

    strag = []
    for i in range(max(args.slow, args.healthy)):
        if i < args.slow:
            strag.append(straggler_round(home, 150.0, 3 - i % 2 * 2, args.factor))
            print(json.dumps(strag[-1]), flush=True)
        if i < args.healthy:
            strag.append(straggler_round(home, 45.0, -1, 1.0))
            print(json.dumps(strag[-1]), flush=True)
    out["straggler"] = strag
    slow = [r for r in strag if r["slow_rank"] >= 0]
    healthy = [r for r in strag if r["slow_rank"] < 0]
    right = [r for r in slow if r["named"] == [r["slow_rank"]]]
    if right:
        print(f"\nstraggler: named {len(right)}/{len(slow)} slow ranks, {med(r['after_start'] for r in right):.0f}s after the "
              f"job started (max {max(r['after_start'] for r in right):.0f}s), "
              f"{med(r['after_first_step'] for r in right if r['after_first_step']):.0f}s after its first step line")
    runs, warned = replay_recorded()
    print(f"straggler: false positives {sum(r['warned'] for r in healthy)}/{len(healthy)} healthy runs here, "
          f"{warned}/{runs} recorded healthy runs replayed")
    loads = [r["overhead"] for r in strag if r["overhead"] is not None]
    cost = probe_cost()
    out["probe_seconds"] = cost
    print(f"sampling overhead: {100 * med(loads):.2f}% of a core per node (median, max {100 * max(loads):.2f}%) "
          f"for 4 ranks; the probe alone: {cost * 1e6:.0f} us per probe of 4 ranks = "
          f"{100 * cost * 5:.3f}% of a core at 5 Hz")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
