"""Sweep throughput: phalanx against `xargs -P` and Ray Tune, measured in one run.

    .venv/bin/python bench/bench_sweep.py [--trials 64] [--parallel 2] [--repeats 2]
                                          [--ray-python /path/to/ray-venv/bin/python] [--json OUT]

Every contender runs the same ``bench/sweep_trial.py --lr X`` (sleeps 0.2 s, prints
``loss=...``) once per value, ``--parallel`` at a time:

- phalanx: ``phalanx run --parallel 2 --objective loss:min bench/sweep_trial.py --lr "[...]"``
  (a grid over the values), each round with a fresh ``PHALANX_HOME``;
- xargs:   ``xargs -P 2 -n 1 python bench/sweep_trial.py --lr`` fed the values;
- Ray Tune (only with ``--ray-python``): bench/sweep_ray.py under that interpreter, a function
  trainable per trial that runs the script as a subprocess, ``max_concurrent_trials=2``.

Each trial appends its own start and end time to a file, so every contender is judged by the
same clock: slot utilisation = sum of trial durations / (parallel x wall time), and the idle
time of a slot between one trial's end and the next one's start. For phalanx the job records
and files of every trial give where that idle time goes. See bench/README.md.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the venv's bin: phalanx and python side by side
PY, PHALANX = str(BIN / "python"), str(BIN / "phalanx")
TRIAL = "bench/sweep_trial.py"
RAY_HELPER = str(ROOT / "bench" / "sweep_ray.py")
TRIAL_SLEEP_S = 0.2
# Ray must stay on the loopback interface: the node IP is 127.0.0.1 (the env var makes Ray
# resolve "127.0.0.1" to the loopback address instead of the machine's), no usage stats, and
# HTTP(S) through a dead proxy on 127.0.0.1 so its cloud-metadata probes (169.254.169.254,
# metadata.google.internal) never leave the machine. Ray turns gRPC's proxy support off.
DEAD_PROXY = "http://127.0.0.1:9"
LOCAL = "127.0.0.1,localhost,::1"
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "http_proxy": DEAD_PROXY, "https_proxy": DEAD_PROXY, "HTTP_PROXY": DEAD_PROXY, "HTTPS_PROXY": DEAD_PROXY,
    "no_proxy": LOCAL, "NO_PROXY": LOCAL,
}


def lr_values(n: int) -> list[str]:
    """``n`` distinct learning rates, log-spaced over [1e-4, 1e-1], as the command line has them."""
    values = [f"{10 ** (-4 + 3 * i / max(1, n - 1)):.6g}" for i in range(n)]
    assert len(set(values)) == n
    return values


# --- the contenders -------------------------------------------------------------------------


def _timed(argv: list[str], env: dict[str, str], stdin: str | None = None) -> tuple[float, float, str]:
    """Run to completion; returns (epoch start, epoch end, stdout). Exits on failure."""
    start = time.time()
    proc = subprocess.run(argv, cwd=ROOT, env=env, input=(stdin or "").encode(), capture_output=True)
    end = time.time()
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(argv[:6])} ...\n{proc.stdout.decode()[-3000:]}"
                 f"{proc.stderr.decode()[-3000:]}")
    return start, end, proc.stdout.decode()


def run_phalanx(lrs: list[str], parallel: int, env: dict[str, str], scratch: Path, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    home = scratch / "phalanx-home"
    times = scratch / "times-phalanx"
    argv = [PHALANX, "run", "--parallel", str(parallel), *extra, "--objective", "loss:min", TRIAL, "--lr",
            f"[{','.join(lrs)}]"]
    start, end, _ = _timed(argv, {**env, "PHALANX_HOME": str(home), "SWEEP_BENCH_TIMES": str(times)})
    return {"t0": start, "t1": end, "trials": read_times(times), "phases": phalanx_phases(home, times)}


def run_xargs(lrs: list[str], parallel: int, env: dict[str, str], scratch: Path) -> dict[str, Any]:
    times = scratch / "times-xargs"
    argv = ["xargs", "-P", str(parallel), "-n", "1", "--", PY, TRIAL, "--lr"]
    start, end, _ = _timed(argv, {**env, "SWEEP_BENCH_TIMES": str(times)}, stdin="\n".join(lrs) + "\n")
    return {"t0": start, "t1": end, "trials": read_times(times)}


def run_ray(lrs: list[str], parallel: int, env: dict[str, str], scratch: Path, ray_python: str,
            reuse: bool = True) -> dict[str, Any]:
    times = scratch / f"times-ray-{reuse}"
    argv = [ray_python, RAY_HELPER, "--trial-python", PY, "--lrs", json.dumps([float(v) for v in lrs]),
            "--parallel", str(parallel), "--storage", str(scratch / f"ray-{reuse}")]
    if not reuse:
        argv.append("--no-reuse-actors")
    start, end, out = _timed(argv, {**env, **RAY_ENV, "SWEEP_BENCH_TIMES": str(times)})
    info = json.loads(out.strip().splitlines()[-1])
    return {"t0": start, "t1": end, "trials": read_times(times), "ray": info}


def ray_usable(ray_python: str | None) -> str | None:
    """Why Ray Tune cannot run, or None when it can."""
    if not ray_python:
        return "no --ray-python given"
    if not Path(ray_python).exists():
        return f"{ray_python} does not exist"
    probe = subprocess.run([ray_python, "-c", "import ray, ray.tune; print(ray.__version__)"],
                           capture_output=True, env={**os.environ, **RAY_ENV})
    if probe.returncode != 0:
        return f"{ray_python} cannot import ray.tune (install it with: {ray_python} -m pip install 'ray[tune]')"
    return None


# --- what the trials' own clocks say ----------------------------------------------------------


def read_times(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text().splitlines():
        start, end, pid, lr = line.split()
        rows.append({"start": float(start), "end": float(end), "pid": int(pid), "lr": float(lr)})
    return sorted(rows, key=lambda r: r["start"])


def assign_slots(trials: list[dict[str, Any]], parallel: int) -> list[float | None]:
    """Give each trial (by start time) the slot that has been free longest; returns, per trial,
    the idle time of its slot before it started (None for a slot's first trial)."""
    slots: list[tuple[float, int]] = [(float("-inf"), i) for i in range(parallel)]
    gaps: list[float | None] = []
    for t in trials:
        free_at, slot = heapq.heappop(slots)
        gaps.append(None if free_at == float("-inf") else t["start"] - free_at)
        t["slot"], t["prev_end"] = slot, None if free_at == float("-inf") else free_at
        heapq.heappush(slots, (t["end"], slot))
    return gaps


def concurrency(trials: list[dict[str, Any]], t0: float, t1: float) -> dict[int, float]:
    """Seconds of the wall time during which exactly k trials were running."""
    events = sorted([(t["start"], 1) for t in trials] + [(t["end"], -1) for t in trials])
    share: dict[int, float] = {}
    level, last = 0, t0
    for when, delta in events:
        share[level] = share.get(level, 0.0) + (when - last)
        level, last = level + delta, when
    share[level] = share.get(level, 0.0) + (t1 - last)
    return share


def summarise(name: str, res: dict[str, Any], parallel: int, n: int, wall_from: float | None = None,
              wall_to: float | None = None) -> dict[str, Any]:
    trials = res["trials"]
    if len(trials) != n:
        sys.exit(f"{name}: {len(trials)} trials recorded, expected {n}")
    t0, t1 = wall_from or res["t0"], wall_to or res["t1"]
    wall = t1 - t0
    busy = sum(t["end"] - t["start"] for t in trials)
    gaps = [g for g in assign_slots(trials, parallel) if g is not None]
    conc = concurrency(trials, t0, t1)
    return {
        "name": name, "wall_s": wall, "busy_s": busy, "util": busy / (parallel * wall),
        "trial_median_s": statistics.median(t["end"] - t["start"] for t in trials),
        "gap_median_s": statistics.median(gaps), "gap_mean_s": statistics.fmean(gaps),
        "lead_s": min(t["start"] for t in trials) - t0, "tail_s": t1 - max(t["end"] for t in trials),
        "concurrency_s": {str(k): v for k, v in sorted(conc.items())},
    }


# --- where phalanx spends a trial's idle time -------------------------------------------------

PHASES = (
    ("slot free -> next trial's job record", "the previous trial in the slot was recorded SUCCEEDED (ended_at) -> this "
     "trial's job row inserted (created_at): the sweep loop's wait before it launches, plus plan + job dir + insert"),
    ("record -> RUNNING", "created_at -> started_at: sweep counter, JobRun set-up, state transition"),
    ("RUNNING -> spawn", "started_at -> attempt 'started' (attempts.jsonl): launch files written"),
    ("spawn (Popen)", "attempt started -> SingleProcessNode created (result.json 'started')"),
    ("interpreter + bootstrap", "Popen returned -> proc.json 'started' (python -u -m phalanx.launch.bootstrap up, "
     "output redirected)"),
    ("bootstrap -> script", "proc.json 'started' -> the script's first line (runpy)"),
    ("script", "the script's own start -> end (0.2 s sleep)"),
    ("script end -> exit noticed", "script end -> result.json 'finished' (interpreter exit, SIGCHLD, tick, poll)"),
    ("noticed -> attempt logged", "result.json 'finished' -> attempts.jsonl 'ended' (final metrics read, sampler stop)"),
    ("attempt logged -> SUCCEEDED", "attempts.jsonl 'ended' -> ended_at"),
)


def phalanx_phases(home: Path, times: Path) -> dict[str, Any]:
    """Per-trial timeline of a phalanx sweep from its store and job files (epoch seconds)."""
    by_pid = {t["pid"]: t for t in read_times(times)}
    with sqlite3.connect(home / "phalanx.db") as conn:
        rows = conn.execute("SELECT id, trial, created_at, started_at, ended_at, job_dir FROM jobs "
                            "WHERE trial IS NOT NULL ORDER BY trial").fetchall()
        sweep = conn.execute("SELECT created_at, started_at, ended_at FROM sweeps").fetchone()
    timeline = []
    for job_id, trial, created, started, ended, job_dir in rows:
        d = Path(job_dir)
        attempt = json.loads((d / "attempts.jsonl").read_text().splitlines()[-1])
        result = json.loads((d / "attempt_0" / "node_0" / "result.json").read_text())
        proc = json.loads((d / "attempt_0" / "rank_0" / "proc.json").read_text())
        script = by_pid[proc["pid"]]
        timeline.append({
            "trial": trial, "created": created, "running": started, "spawn": attempt["started"],
            "popen": result["started"], "bootstrap": proc["started"], "script_start": script["start"],
            "script_end": script["end"], "noticed": result["finished"], "logged": attempt["ended"], "ended": ended,
        })
    # the trial that ran before each one in the same slot (by the trials' own clocks)
    order = sorted(timeline, key=lambda t: t["script_start"])
    slots: list[tuple[float, int, dict[str, Any] | None]] = [(float("-inf"), i, None) for i in range(_parallel(order))]
    heapq.heapify(slots)
    for t in order:
        _, slot, prev = heapq.heappop(slots)
        t["prev_ended"] = prev["ended"] if prev else None
        heapq.heappush(slots, (t["script_end"], slot, t))
    keys = ("created", "running", "spawn", "popen", "bootstrap", "script_start", "script_end", "noticed", "logged", "ended")
    per_phase: dict[str, list[float]] = {name: [] for name, _ in PHASES}
    for t in timeline:
        if t["prev_ended"] is not None:
            per_phase[PHASES[0][0]].append(t["created"] - t["prev_ended"])
        for (name, _), a, b in zip(PHASES[1:], keys, keys[1:]):
            per_phase[name].append(t[b] - t[a])
    return {"sweep": {"created": sweep[0], "started": sweep[1], "ended": sweep[2]},
            "first_created": min(t["created"] for t in timeline), "last_ended": max(t["ended"] for t in timeline),
            "phases": per_phase}


def _parallel(order: list[dict[str, Any]]) -> int:
    """Most trials that overlapped (their own clocks): the slots the sweep really used."""
    best = level = 0
    for _, delta in sorted([(t["script_start"], 1) for t in order] + [(t["script_end"], -1) for t in order]):
        level += delta
        best = max(best, level)
    return max(1, best)


# --- what starting one trial costs, outside any sweep ----------------------------------------


def startup_costs(repeats: int, env: dict[str, str]) -> dict[str, dict[str, float]]:
    """Per way of starting the trial script: median ms from fork to the script's first line
    (``to_script``) and from its last line to the process being reaped (``exit``)."""
    ways = {
        "python sweep_trial.py": [PY, TRIAL, "--lr", "0.01"],
        "python -u -m phalanx.launch.bootstrap --script sweep_trial.py": [
            PY, "-u", "-m", "phalanx.launch.bootstrap", "--script", TRIAL, "--lr", "0.01"],
    }
    out: dict[str, dict[str, list[float]]] = {w: {"to_script": [], "exit": []} for w in ways}
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-startup-") as tmp:
        for i in range(repeats + 1):  # the first round warms the caches
            for way, argv in ways.items():
                times = Path(tmp, f"t{i}-{len(out[way]['exit'])}-{abs(hash(way))}")
                rank_dir = Path(tmp, f"rank-{i}-{abs(hash(way))}")
                e = {**env, "SWEEP_BENCH_TIMES": str(times), "PHALANX_RANK_DIR": str(rank_dir)}
                t0 = time.time()
                subprocess.run(argv, cwd=ROOT, env=e, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
                t1 = time.time()
                start, end, *_ = times.read_text().split()
                if i:
                    out[way]["to_script"].append(float(start) - t0)
                    out[way]["exit"].append(t1 - float(end))
    return {w: {k: 1000 * statistics.median(v) for k, v in d.items()} for w, d in out.items()}


def src_digest() -> str:
    """Which phalanx was measured: a digest of src/ (the tree may differ from any commit)."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted((ROOT / "src").rglob("*.py")):
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


# --- report -----------------------------------------------------------------------------------


def table(rows: list[dict[str, Any]], parallel: int) -> str:
    head = (f"{'contender':<44} {'wall s':>7} {'min s':>7} {'util':>6} {'gap med ms':>10} {'gap mean ms':>11} "
            f"{'lead s':>7} {'tail s':>7}  time with 0/1/{parallel} trials running (s)")
    lines = [head]
    for r in rows:
        conc = r["concurrency_s"]
        share = "/".join(f"{conc.get(str(k), 0.0):.1f}" for k in range(parallel + 1))
        lines.append(f"{r['name']:<44} {r['wall_s']:>7.2f} {r['min_wall_s']:>7.2f} {r['util']:>6.1%} "
                     f"{1000 * r['gap_median_s']:>10.0f} {1000 * r['gap_mean_s']:>11.0f} {r['lead_s']:>7.2f} "
                     f"{r['tail_s']:>7.2f}  {share}")
    return "\n".join(lines)


def merge(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds of one contender."""
    out: dict[str, Any] = {"name": samples[0]["name"], "rounds": len(samples),
                           "min_wall_s": min(s["wall_s"] for s in samples),
                           "walls_s": [s["wall_s"] for s in samples]}
    for key in ("wall_s", "busy_s", "util", "trial_median_s", "gap_median_s", "gap_mean_s", "lead_s", "tail_s"):
        out[key] = statistics.median(s[key] for s in samples)
    keys = {k for s in samples for k in s["concurrency_s"]}
    out["concurrency_s"] = {k: statistics.median(s["concurrency_s"].get(k, 0.0) for s in samples) for k in sorted(keys)}
    return out


def phases_report(all_phases: list[dict[str, Any]], n: int) -> str:
    pooled: dict[str, list[float]] = {name: [] for name, _ in PHASES}
    for ph in all_phases:
        for name, values in ph["phases"].items():
            pooled[name].extend(values)
    lines = [f"{'phase (per trial, all rounds pooled)':<34} {'median ms':>9} {'mean ms':>8} {'p90 ms':>7}  what"]
    idle_sum = 0.0
    for name, what in PHASES:
        v = sorted(pooled[name])
        if not v:
            continue
        mean = statistics.fmean(v)
        if name != "script":
            idle_sum += mean
        lines.append(f"{name:<34} {1000 * statistics.median(v):>9.1f} {1000 * mean:>8.1f} "
                     f"{1000 * v[int(0.9 * (len(v) - 1))]:>7.1f}  {what}")
    lines.append(f"{'sum of the non-script phases':<34} {'':>9} {1000 * idle_sum:>8.1f}")
    starts = [ph["first_created"] - ph["t0"] for ph in all_phases]
    ends = [ph["t1"] - ph["last_ended"] for ph in all_phases]
    lines.append(f"before the first trial's record (CLI start-up, sweep record): median {statistics.median(starts):.3f} s; "
                 f"after the last trial ended (sweep end, CLI exit): median {statistics.median(ends):.3f} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64, help="trials per sweep (default 64)")
    parser.add_argument("--parallel", type=int, default=2, help="trials at a time (default 2)")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds, contenders interleaved (default 2)")
    parser.add_argument("--warmup-trials", type=int, default=4, help="trials of the untimed warm-up round (0: none)")
    parser.add_argument("--ray-python", help="an interpreter with ray[tune] installed (a separate venv); "
                                             "without it Ray Tune is skipped")
    parser.add_argument("--ray-default-actors", action="store_true",
                        help="also time Ray Tune with its default reuse_actors=False (a new worker per trial)")
    parser.add_argument("--no-variants", action="store_true", help="time plain `phalanx run` only (no --no-snapshot row)")
    parser.add_argument("--startup-repeats", type=int, default=20,
                        help="runs of each way to start one trial, for the start-up costs (0: skip)")
    parser.add_argument("--json", type=Path, help="also write the results (with every sample) here")
    args = parser.parse_args()

    lrs = lr_values(args.trials)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    why_not_ray = ray_usable(args.ray_python)
    if why_not_ray:
        print(f"bench_sweep: skipping Ray Tune: {why_not_ray}", file=sys.stderr)

    contenders: list[tuple[str, Any]] = [
        ("phalanx run --parallel", lambda l, s: run_phalanx(l, args.parallel, env, s)),
        ("xargs -P", lambda l, s: run_xargs(l, args.parallel, env, s)),
    ]
    help_text = subprocess.run([PHALANX, "run", "--help"], capture_output=True, text=True, env=env).stdout
    if "--no-snapshot" in help_text and not args.no_variants:
        # the code snapshot is per trial; this row shows what it costs
        contenders.insert(1, ("phalanx run --parallel --no-snapshot",
                              lambda l, s: run_phalanx(l, args.parallel, env, s, ("--no-snapshot",))))
    if not why_not_ray:
        contenders.append(("ray tune", lambda l, s: run_ray(l, args.parallel, env, s, args.ray_python)))
        if args.ray_default_actors:
            contenders.append(("ray tune default", lambda l, s: run_ray(l, args.parallel, env, s, args.ray_python, False)))

    samples: dict[str, list[dict[str, Any]]] = {}
    phases: dict[str, list[dict[str, Any]]] = {}
    ray_info: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    digest = src_digest()
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-sweep-") as tmp:
        for rnd in range(args.repeats + (1 if args.warmup_trials else 0)):
            warm = args.warmup_trials and rnd == 0
            values = lrs[: args.warmup_trials] if warm else lrs
            # rotate the order each round so that drift on the machine hits everyone alike
            shift = rnd % len(contenders)
            for label, fn in contenders[shift:] + contenders[:shift]:
                scratch = Path(tmp, f"r{rnd}-{label.replace(' ', '_')}")
                scratch.mkdir()
                res = fn(values, scratch)
                shutil.rmtree(scratch, ignore_errors=True)
                print(f"  round {rnd}{' (warm-up)' if warm else ''}: {label}: {res['t1'] - res['t0']:.2f} s",
                      file=sys.stderr)
                if warm:
                    continue
                n = len(values)
                raw.append({"round": rnd, "label": label, "t0": res["t0"], "t1": res["t1"], "trials": res["trials"]})
                if label.startswith("ray"):
                    info = res["ray"]
                    suffix = "" if label == "ray tune" else ", reuse_actors=False"
                    ray_info.append({**info, "label": label, "process_s": res["t1"] - res["t0"]})
                    samples.setdefault(f"{label}: whole process", []).append(summarise(
                        f"ray tune{suffix}: whole process", res, args.parallel, n))
                    samples.setdefault(f"{label}: Tuner.fit only", []).append(summarise(
                        f"ray tune{suffix}: Tuner.fit only", res, args.parallel, n, info["fit_start"], info["fit_end"]))
                else:
                    name = label.replace("--parallel", f"--parallel {args.parallel}").replace("-P", f"-P {args.parallel}")
                    samples.setdefault(label, []).append(summarise(name, res, args.parallel, n))
                    if "phases" in res:
                        phases.setdefault(name, []).append({**res["phases"], "t0": res["t0"], "t1": res["t1"]})

    rows = [merge(s) for s in samples.values()]
    xa = next(r for r in rows if r["name"].startswith("xargs"))
    ideal = args.trials / args.parallel * TRIAL_SLEEP_S
    print(f"\nphalanx sweep benchmark: {args.trials} trials of a {TRIAL_SLEEP_S:g} s script, {args.parallel} at a time, "
          f"{args.repeats} rounds; {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}")
    print(f"wall = median over rounds; util = sum of trial durations / ({args.parallel} x wall); gap = a slot's idle "
          f"time between one trial's end and the next one's start; ideal wall {ideal:.1f} s\n")
    print(table(rows, args.parallel))
    print()
    for p in [r for r in rows if r["name"].startswith("phalanx")]:
        print(f"{p['name']:<40} / xargs {' ' * 29} = {p['wall_s'] / xa['wall_s']:.2f}  (goal: <= 1.20)")
        for r in rows:
            if r["name"].startswith("ray"):
                print(f"{p['name']:<40} / {r['name']:<34} = {p['wall_s'] / r['wall_s']:.2f}  (goal: < 1)")
    for label in sorted({i["label"] for i in ray_info}):
        sel = [i for i in ray_info if i["label"] == label]
        med = {k: statistics.median(i[k] for i in sel) for k in ("import_s", "init_s", "fit_s", "shutdown_s", "process_s")}
        print(f"{label} (ray {sel[0]['ray_version']}, reuse_actors={sel[0]['reuse_actors']}): import ray {med['import_s']:.2f} s, "
              f"ray.init {med['init_s']:.2f} s, Tuner.fit {med['fit_s']:.2f} s, shutdown {med['shutdown_s']:.2f} s, "
              f"whole process {med['process_s']:.2f} s")
    for name, ph_rounds in phases.items():
        print(f"\nwhere a trial's time goes in `{name}` (from the job records and files):")
        print(phases_report(ph_rounds, args.trials))
    startup = startup_costs(args.startup_repeats, env) if args.startup_repeats else {}
    if startup:
        print(f"\nstarting one trial outside a sweep (median of {args.startup_repeats}):")
        for way, v in startup.items():
            print(f"  {way:<64} fork -> script's first line {v['to_script']:6.1f} ms, last line -> reaped {v['exit']:6.1f} ms")
    print(f"\nsrc/ digest {digest} (git {_git_head()})")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "platform": platform.platform(),
                "trials": args.trials, "parallel": args.parallel, "repeats": args.repeats, "src_digest": digest,
                "git_head": _git_head()}
        args.json.write_text(json.dumps({"meta": meta, "results": rows, "ray": ray_info, "phalanx_phases": phases,
                                         "startup_ms": startup, "samples": raw}, indent=2) + "\n")


def _git_head() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.strip() + (" + uncommitted changes in src/" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    main()
