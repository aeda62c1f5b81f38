"""Warm starts against cold ones and against what a user would run instead, measured in one run.

    .venv/bin/python bench/bench_warm.py [--repeats N] [--sweep-repeats N] [--groups run1,run2,...] [--json OUT]
                                         [--compare-src OTHER/src]

Groups (each group's last command is its baseline; ratio = median / median of the baseline):

- ``run1``:  ``phalanx run hello.py`` warm and ``--cold``, against ``python hello.py``;
- ``run2``:  ``phalanx run -n 2 hello.py`` warm and ``--cold``, against
  ``torchrun --standalone --nproc-per-node 2 hello.py``;
- ``sweep16``: 16 trials of ``bench/warm_trial.py`` (imports torch, one tiny step), 2 at a time:
  ``phalanx run --parallel 2`` warm and ``--cold``, against ``xargs -P 2 python warm_trial.py``;
- ``sweep64``: 64 trials of ``bench/warm_trial.py --steps 50`` (imports torch, trains 50 steps);
- ``light64``: 64 trials of ``bench/sweep_trial.py`` (no torch, sleeps 0.2 s);
- ``memory``: the pool's RSS and PSS idle, and the PSS of two processes that imported torch
  forked from it against two cold ones (``/proc/PID/smaps_rollup``);
- ``checks``: what each start pays for the pool's placement check, its cgroup-aware key, the
  rank's own cgroup and the end-of-attempt look for leftovers (docs/processes.md), in ms.

``--compare-src OTHER/src`` adds to run1 and run2 the same warm command of another checkout and of
this one, each as ``python -m phalanx`` with ``PYTHONPATH`` naming its sources, in the same rounds.

Every command runs once untimed (round 0: it also starts the pools and fills them), then the
commands of a group run round-robin, so that load on the machine hits every alternative alike.
``PHALANX_HOME`` and the pool directory are fresh temporary directories; pools are stopped at the
end. See bench/README.md.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PY, PHALANX = str(BIN / "python"), str(BIN / "phalanx")
# torchrun's console script, or the same program through python -m where the venv shares torch
TORCHRUN = [str(BIN / "torchrun")] if (BIN / "torchrun").exists() else [PY, "-m", "torch.distributed.run"]
HELLO = "examples/hello.py"
TRIAL = "bench/warm_trial.py"
LIGHT = "bench/sweep_trial.py"


def lrs(n: int) -> list[str]:
    return [f"{10 ** (-4 + 3 * i / max(1, n - 1)):.6g}" for i in range(n)]


def sweep(trial: str, n: int, *extra: str) -> dict[str, list[str] | str]:
    values = lrs(n)
    return {
        "phalanx warm": [PHALANX, "run", "--parallel", "2", "--objective", "loss:min", trial, "--lr",
                         f"[{','.join(values)}]", *extra],
        "phalanx --cold": [PHALANX, "run", "--cold", "--parallel", "2", "--objective", "loss:min", trial, "--lr",
                           f"[{','.join(values)}]", *extra],
        "xargs -P 2 python": {"argv": ["xargs", "-P", "2", "-n", "1", "--", PY, trial, *extra, "--lr"],  # type: ignore[dict-item]
                              "stdin": "\n".join(values) + "\n"},
    }


def run_once(command: list[str] | dict, env: dict[str, str]) -> float:
    argv, stdin = (command["argv"], command.get("stdin")) if isinstance(command, dict) else (command, None)
    env = {**env, **command.get("env", {})} if isinstance(command, dict) else env
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, input=(stdin or "").encode(), capture_output=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(argv[:8])}\n{proc.stdout.decode()[-2000:]}{proc.stderr.decode()[-2000:]}")
    return elapsed


def measure(group: str, commands: dict, env: dict[str, str], repeats: int, settle: float = 0.0) -> list[dict]:
    samples: dict[str, list[float]] = {label: [] for label in commands}
    for rnd in range(repeats + 1):
        for label, command in commands.items():
            elapsed = run_once(command, env)
            if rnd:
                samples[label].append(elapsed)
            elif settle:
                time.sleep(settle)  # round 0: let a pool that just started finish its imports
        print(f"  {group}: round {rnd}/{repeats}" + (" (warm-up)" if rnd == 0 else ""), file=sys.stderr)
    base = statistics.median(samples[list(commands)[-1]])
    return [{"group": group, "command": label, "median_s": statistics.median(s), "min_s": min(s),
             "ratio": statistics.median(s) / base, "samples_s": s} for label, s in samples.items()]


def wait_for_pools(pool_dir: str, timeout: float = 300) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from phalanx.launch.warm import plan as warm

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pools = warm.pools(pool_dir)
        if pools and all(not p.get("busy") and not p.get("dead") for p in pools):
            return
        time.sleep(0.2)


def rollup(pid: int) -> dict[str, int]:
    sizes = {}
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                sizes[key.lower()] = int(rest.split()[0]) * 1024
    return sizes


def memory(env: dict[str, str], pool_dir: str, scratch: Path) -> dict:
    """Two holders of torch forked from the pool, two cold ones: their PSS, and the pool's."""
    from phalanx.launch.warm import plan as warm

    holder = scratch / "holder.py"
    holder.write_text("import os, sys, time, torch\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(30)\n")
    nothing = scratch / "nothing.py"
    nothing.write_text("")
    result: dict = {}
    for _ in range(120):  # until a start is forked: the first of this environment starts its pool
        before = {p["pid"]: p.get("served", 0) for p in warm.pools(pool_dir) if p.get("pid")}
        subprocess.run([PY, "-u", "-m", "phalanx.launch.warm.standin", "--dir", pool_dir, "--preload", "torch", "--",
                        "phalanx.launch.bootstrap", "--script", str(nothing)], env=env, check=True,
                       start_new_session=True, stdin=subprocess.DEVNULL)
        forked = [p for p in warm.pools(pool_dir) if p.get("pid") and p.get("served", 0) > before.get(p["pid"], 0)]
        if forked:
            time.sleep(1.0)
            result["pool_idle"] = [rollup(forked[0]["pid"])]
            break
        time.sleep(0.5)
    for mode in ("warm", "cold"):
        procs, pids = [], []
        for i in range(2):
            pid_file = scratch / f"{mode}{i}.pid"
            module = ["phalanx.launch.bootstrap", "--script", str(holder), str(pid_file)]
            argv = [PY, "-u", "-m", *(["phalanx.launch.warm.standin", "--dir", pool_dir, "--preload", "torch", "--"]
                                      if mode == "warm" else []), *module]
            procs.append(subprocess.Popen(argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL))
            while not pid_file.exists() or not pid_file.read_text():
                time.sleep(0.05)
            pids.append(int(pid_file.read_text()))
        time.sleep(1.0)
        result[mode] = [rollup(pid) for pid in pids]
        if mode == "warm":  # the pool they were forked from: their parent
            parents = {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in pids}
            pools = {p["pid"]: p for p in warm.pools(pool_dir) if p.get("pid")}
            if len(parents) != 1 or not parents <= set(pools):
                logs = "".join(p.read_text() for p in Path(pool_dir).glob("*.log"))
                sys.exit(f"memory: the warm holders were not forked from one pool (parents {parents}, pools {list(pools)})\n{logs}")
            pool = pools[parents.pop()]
            result["pool_with_children"] = [rollup(pool["pid"])]
        for proc in procs:
            proc.kill()
            proc.wait()
    return result


def compare(src: Path | None) -> "Callable[[list[str]], dict]":
    """With ``--compare-src``: the same warm command of the other checkout's phalanx and of this
    one, each as ``python -m phalanx`` with ``PYTHONPATH`` naming its sources (so the two differ in
    nothing else; each has pools of its own, as their environments differ), put first in a group so
    that both trees run in the same rounds. The other checkout is byte-compiled like this one."""
    if src is None:
        return lambda argv: {}
    compileall.compile_dir(str(src / "phalanx"), quiet=1)
    return lambda argv: {"warm, compared src": {"argv": argv, "env": {"PYTHONPATH": str(src.resolve())}},
                         "warm, this src": {"argv": argv, "env": {"PYTHONPATH": str(ROOT / "src")}},
                         # the ranks' own cgroups off (docs/processes.md): what moving into them costs
                         "warm, this src, no cgroups": {"argv": argv, "env": {"PYTHONPATH": str(ROOT / "src"),
                                                                              "PHALANX_RANK_CGROUPS": "0"}}}


def checks(repeats: int = 200) -> dict[str, float]:
    """Median milliseconds of what a warm start does beyond what it did before the pool checked
    its clients' placement and ranks got cgroups of their own (docs/processes.md): the stand-in's
    pool key (it reads its cgroup), the pool's placement check of a real client, a rank's move into
    its own cgroup (in a forked child, as the bootstrap does it, less the fork itself) and ending
    an attempt that left nothing (its cgroup removed), measured in this process."""
    sys.path.insert(0, str(ROOT / "src"))
    from phalanx.launch import strays
    from phalanx.launch.warm import checks as warm_checks, proto as warm_proto

    def median_ms(work) -> float:
        times = []
        for i in range(repeats):
            start = time.perf_counter()
            work(i)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    def fork(enlist: bool, i: int) -> None:
        """A child that exits at once, moving into its rank's cgroup first with ``enlist``."""
        os.environ.update(PHALANX_JOB_ID="benchchk", PHALANX_ATTEMPT=str(i), RANK="0")
        pid = os.fork()
        if pid == 0:
            if enlist:
                strays.enlist()
            os._exit(0)
        os.waitpid(pid, 0)

    client = subprocess.Popen(["sleep", "60"])
    try:
        result = {"pool key (stand-in)": median_ms(lambda i: warm_proto.pool_key(os.environ)),
                  "placement check (pool)": median_ms(lambda i: warm_checks.placement(client.pid))}
    finally:
        client.kill()
        client.wait()
    forked, enlisted, ended = [], [], []
    for i in range(repeats):  # as a rank's life: its move into its cgroup, then its attempt's end
        for work, times in ((lambda i=i: fork(False, i), forked), (lambda i=i: fork(True, i), enlisted),
                            (lambda i=i: strays.end("benchchk", i, {0: "/nonexistent/rank_0"}, 30.0), ended)):
            start = time.perf_counter()
            work()
            times.append(time.perf_counter() - start)
    result["enlist (bootstrap)"] = (statistics.median(enlisted) - statistics.median(forked)) * 1e3
    result["end of an attempt, nothing left"] = statistics.median(ended) * 1e3
    result["cgroup v2 writable here"] = float(strays.cgroup_dir() is not None)
    return result


def table(results: list[dict]) -> str:
    lines = [f"{'group':<8} {'command':<28} {'median s':>9} {'min s':>7} {'ratio':>6}"]
    lines += [f"{r['group']:<8} {r['command']:<28} {r['median_s']:>9.3f} {r['min_s']:>7.3f} {r['ratio']:>6.2f}"
              for r in results]
    return "\n".join(lines)


def memory_table(mem: dict) -> str:
    mib = 1 << 20

    def pair(sizes: dict[str, int]) -> str:
        return f"RSS {sizes['rss'] / mib:6.0f} MiB  PSS {sizes['pss'] / mib:6.0f} MiB"

    lines = [f"pool, idle:                 {pair(m)}" for m in mem["pool_idle"] if m]
    lines += [f"pool, 2 children running:   {pair(m)}" for m in mem.get("pool_with_children", [])]
    for mode in ("warm", "cold"):
        for i, sizes in enumerate(mem[mode]):
            lines.append(f"{mode} process {i} (torch):    {pair(sizes)}")
    warm_total = sum(s["pss"] for s in mem["warm"]) + sum(s["pss"] for s in mem.get("pool_with_children", []))
    cold_total = sum(s["pss"] for s in mem["cold"])
    lines.append(f"PSS of pool + 2 warm: {warm_total / mib:.0f} MiB;  of 2 cold: {cold_total / mib:.0f} MiB")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds of run1 and run2 (default 5)")
    parser.add_argument("--sweep-repeats", type=int, default=2, help="timed rounds of the sweep groups (default 2)")
    parser.add_argument("--groups", default="run1,run2,sweep16,sweep64,light64,memory,checks")
    parser.add_argument("--json", type=Path, help="also write every sample here")
    parser.add_argument("--compare-src", type=Path, metavar="SRC",
                        help="run1/run2 also time the phalanx whose sources are in SRC (another checkout's src/), "
                             "warm, in the same rounds: a change's cost, measured in one run")
    args = parser.parse_args()
    groups = args.groups.split(",")
    compileall.compile_dir(str(ROOT / "src" / "phalanx"), quiet=1)  # see bench_core.py
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-warm-") as tmp:
        pool_dir = Path(tmp, "pools")
        pool_dir.mkdir(mode=0o700)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PHALANX_HOME": str(Path(tmp, "home")),
               "PHALANX_WARM_DIR": str(pool_dir), "PHALANX_WARM": "1"}
        results: list[dict] = []
        mem = None
        extra: dict[str, float] = {}
        try:
            other = compare(args.compare_src)
            if "run1" in groups:
                results += measure("run1", {**other([PY, "-m", "phalanx", "run", HELLO]),
                                            "phalanx warm": [PHALANX, "run", HELLO],
                                            "phalanx --cold": [PHALANX, "run", "--cold", HELLO],
                                            "python hello.py": [PY, HELLO]}, env, args.repeats, settle=5)
            if "run2" in groups:
                results += measure("run2", {
                    **other([PY, "-m", "phalanx", "run", "-n", "2", HELLO]),
                    "phalanx warm": [PHALANX, "run", "-n", "2", HELLO],
                    "phalanx --cold": [PHALANX, "run", "--cold", "-n", "2", HELLO],
                    "torchrun --standalone -n 2": [*TORCHRUN, "--standalone", "--nproc-per-node", "2", HELLO],
                }, env, args.repeats, settle=5)
            if "sweep16" in groups:
                results += measure("sweep16", sweep(TRIAL, 16), env, args.sweep_repeats, settle=5)
            if "sweep64" in groups:
                results += measure("sweep64", sweep(TRIAL, 64, "--steps", "50"), env, args.sweep_repeats, settle=5)
            if "light64" in groups:
                results += measure("light64", sweep(LIGHT, 64), env, args.sweep_repeats, settle=5)
            if "checks" in groups:
                extra = checks()
            if "memory" in groups:
                run_once([PHALANX, "run", HELLO], env)
                wait_for_pools(str(pool_dir))
                mem = memory(env, str(pool_dir), Path(tmp))
        finally:
            subprocess.run([PHALANX, "pool", "stop"], env=env, capture_output=True)
    print(f"\nphalanx warm-start benchmark, {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("ratio = median / median of the group's last (baseline) command\n")
    print(table(results))
    if mem:
        print("\n" + memory_table(mem))
    if extra:
        warm1 = next((r["median_s"] * 1e3 for r in results if r["group"] == "run1" and r["command"] == "phalanx warm"), None)
        print("\nper start, median ms" + (f" (share of a warm run1, {warm1:.0f} ms)" if warm1 else ""))
        for what, ms in extra.items():
            share = f"  {100 * ms / warm1:5.2f}%" if warm1 and "writable" not in what else ""
            print(f"  {what:<34} {ms:8.3f}{share}" if "writable" not in what else f"  {what:<34} {'yes' if ms else 'no'}")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "repeats": args.repeats,
                "sweep_repeats": args.sweep_repeats}
        args.json.write_text(json.dumps({"meta": meta, "results": results, "memory": mem, "checks": extra}, indent=2) + "\n")


if __name__ == "__main__":
    main()
