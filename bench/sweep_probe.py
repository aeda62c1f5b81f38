"""Where a phalanx sweep's time goes, step by step: a diagnostic companion to bench_sweep.py.

    .venv/bin/python bench/sweep_probe.py [--trials 64] [--rounds 2]

Runs the sweep of bench_sweep.py (``phalanx run --parallel 2 --objective loss:min
bench/sweep_trial.py --lr "[...]"``) in-process, with timers wrapped around the sweep runner's
steps (launch, plan, job creation, code snapshot, JobRun start/tick/finish, store writes) and
around every sleep of its loop. Nothing in src/ is changed; the variants are applied in memory:

- ``stock``:   the runner as it is;
- ``refill``:  the runner's loop with one change: when a slot was freed during the tick pass
  and trials are waiting, it does not sleep before launching the next one (see the analysis in
  bench/README.md);
- ``refill --no-snapshot``: the same, without the per-trial code snapshot;
- ``xargs -P 2`` on the same commands, as the reference.

Variants run interleaved, in alternating order. The refill patch is a text replacement of one
line of ``SweepRunner.run``; when that line changes, the variant reports that it cannot apply.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_sweep as bench  # noqa: E402

LOOP_LINE = "hints = [t.run.wait_hint() for t in running.values()] or [0.0]"
REFILL = ("hints = [0.0] if (free and todo and stop_kind is None) else "
          "([t.run.wait_hint() for t in running.values()] or [0.0])")
VARIANTS = {"stock": ("stock", ()), "refill": ("refill", ()), "refill --no-snapshot": ("refill", ("--no-snapshot",))}


def child(mode: str, times: str, n: int, extra: list[str]) -> None:
    """One sweep in this process, with timers; prints one JSON line."""
    import inspect
    import textwrap

    os.environ["SWEEP_BENCH_TIMES"] = times
    from phalanx.launch import procs
    from phalanx.store import Store
    from phalanx.supervise import job, observers as watch
    from phalanx.sweeps import runner

    acc: dict[str, list[float]] = collections.defaultdict(list)
    order: list[str] = []

    def wrap(owner: object, name: str, label: str) -> None:
        fn = getattr(owner, name, None)
        if fn is None:
            return
        order.append(label)

        def inner(*a: object, **k: object) -> object:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[label].append(time.perf_counter() - t)

        setattr(owner, name, inner)

    wrap(runner.SweepRunner, "_launch", "SweepRunner._launch (all of a launch)")
    wrap(runner, "plan_job", "  supervise.submit.plan_job")
    wrap(runner, "create_job", "  supervise.submit.create_job")
    try:
        from phalanx.storage import snapshot

        wrap(snapshot, "snapshot_job", "    storage.snapshot.snapshot_job")
    except ImportError:
        pass
    wrap(Store, "insert_job", "    Store.insert_job")
    wrap(job.JobRun, "start", "  JobRun.start")
    wrap(job, "write_launch_files", "    write_launch_files")
    wrap(watch.Watch, "_sampler", "    Watch._sampler (thread start)")
    wrap(job.JobRun, "tick", "JobRun.tick (all ticks)")
    wrap(job.JobRun, "_attempt_over", "  JobRun._attempt_over")
    wrap(runner.SweepRunner, "_ended", "SweepRunner._ended")
    wrap(runner.SweepRunner, "_follow_metrics", "SweepRunner._follow_metrics")
    wrap(Store, "transition", "Store.transition")

    waits: list[tuple[float, float]] = []
    orig_wait = procs.ChildWatcher.wait

    def wait(self: object, timeout: float) -> None:
        t = time.perf_counter()
        orig_wait(self, timeout)
        waits.append((timeout, time.perf_counter() - t))

    procs.ChildWatcher.wait = wait  # type: ignore[method-assign]
    if mode == "refill":
        src = textwrap.dedent(inspect.getsource(runner.SweepRunner.run))
        if LOOP_LINE not in src:
            print(json.dumps({"error": "the runner loop changed; the refill patch does not apply"}))
            return
        ns = dict(vars(runner))
        exec(compile(src.replace(LOOP_LINE, REFILL), runner.__file__, "exec"), ns)
        runner.SweepRunner.run = ns["run"]  # type: ignore[method-assign]

    from phalanx.cli.main import main

    lrs = bench.lr_values(n)
    t0 = time.time()
    try:
        main(["run", "--parallel", "2", *extra, "--objective", "loss:min", bench.TRIAL, "--lr", f"[{','.join(lrs)}]"])
    except SystemExit as exc:
        if exc.code:
            raise
    t1 = time.time()
    print(json.dumps({"t0": t0, "t1": t1, "acc": {k: [len(acc[k]), sum(acc[k])] for k in order},
                      "waits": waits}))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:  # internal: one sweep, in this process
        mode, times, count, *extra = sys.argv[2:]
        child(mode, times, int(count), extra)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    n = args.trials
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    names = [*VARIANTS, "xargs -P 2"]
    out: dict[str, list[dict]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="phalanx-sweep-probe-") as tmp:
        for rnd in range(args.rounds):
            for name in (names if rnd % 2 == 0 else names[::-1]):
                d = Path(tmp, f"{rnd}-{name.replace(' ', '_')}")
                d.mkdir()
                if name.startswith("xargs"):
                    res = bench.run_xargs(bench.lr_values(n), 2, env, d)
                    s = bench.summarise(name, res, 2, n)
                else:
                    mode, extra = VARIANTS[name]
                    times = d / "times"
                    proc = subprocess.run(
                        [sys.executable, __file__, "--child", mode, str(times), str(n), *extra],
                        cwd=bench.ROOT, env={**env, "PHALANX_HOME": str(d / "home")}, capture_output=True, text=True)
                    if proc.returncode != 0:
                        sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
                    info = json.loads(proc.stdout.strip().splitlines()[-1])
                    if "error" in info:
                        print(f"{name}: {info['error']}", file=sys.stderr)
                        continue
                    res = {"t0": info["t0"], "t1": info["t1"], "trials": bench.read_times(times)}
                    s = bench.summarise(name, res, 2, n)
                    s["acc"], s["waits"] = info["acc"], info["waits"]
                    s["phases"] = bench.phalanx_phases(d / "home", times)["phases"]
                out[name].append(s)
                print(f"  round {rnd}: {name}: {s['wall_s']:.2f} s", file=sys.stderr)

    xa = statistics.median(s["wall_s"] for s in out["xargs -P 2"])
    print(f"\n{n} trials, 2 at a time, {args.rounds} rounds (medians)\n")
    print(f"{'variant':<24} {'wall s':>7} {'/xargs':>7} {'util':>6} {'gap med ms':>10}  time with 0/1/2 running (s)")
    for name, runs in out.items():
        wall = statistics.median(s["wall_s"] for s in runs)
        conc = [statistics.median(s["concurrency_s"].get(str(k), 0.0) for s in runs) for k in range(3)]
        print(f"{name:<24} {wall:>7.2f} {wall / xa:>7.2f} {statistics.median(s['util'] for s in runs):>6.1%} "
              f"{1000 * statistics.median(s['gap_median_s'] for s in runs):>10.0f}  {'/'.join(f'{c:.1f}' for c in conc)}")
    for name, runs in out.items():
        if name.startswith("xargs"):
            continue
        print(f"\n{name}: ms per trial (mean over trials and rounds; the sweep loop runs these one after another)")
        labels = list(runs[0]["acc"])  # in the order they were wrapped: nested steps are indented
        for label in labels:
            total = sum(s["acc"].get(label, [0, 0])[1] for s in runs) / len(runs)
            calls = sum(s["acc"].get(label, [0, 0])[0] for s in runs) / len(runs)
            print(f"  {label:<42} {1000 * total / n:7.2f} ms/trial  ({calls:.0f} calls)")
        sleeps = [w for s in runs for w in s["waits"]]
        long = [w for w in sleeps if w[1] > 0.05]
        print(f"  loop sleeps: {len(sleeps) / len(runs):.0f} per sweep, {sum(w[1] for w in sleeps) / len(runs):.2f} s per "
              f"sweep; {len(long) / len(runs):.0f} longer than 50 ms")
        for phase in ("slot free -> next trial's job record", "interpreter + bootstrap", "bootstrap -> script",
                      "script end -> exit noticed"):
            vals = [v for s in runs for v in s["phases"][phase]]
            print(f"  phase {phase:<40} median {1000 * statistics.median(vals):6.1f} ms, mean {1000 * statistics.fmean(vals):6.1f} ms")


if __name__ == "__main__":
    main()
