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
import resource
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
PY, PHALANX = str(BIN / "python"), str(BIN / "phalanx")
# torchrun's entry point is torch.distributed.run:main; a venv sharing torch through a .pth lacks the script
TORCHRUN = [str(BIN / "torchrun")] if (BIN / "torchrun").exists() else [PY, "-m", "torch.distributed.run"]
HELLO = "examples/hello.py"
N_FINISHED, N_RUNNING = 1000, 3


def run_once(argv: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[float, float]:
    """Wall-clock seconds, and CPU seconds (user + system) of the command and every process it
    waited for: on a machine others load, CPU time shows a launcher's own cost where wall time
    mostly shows the neighbours."""
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    elapsed = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(argv)}\n{proc.stdout.decode()}{proc.stderr.decode()}")
    return elapsed, (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)


def measure(
    group: str, commands: dict[str, list[str]], env: dict[str, str], repeats: int,
    before: Callable[[], None] | None = None,
) -> list[dict]:
    """Warm up every command, then time them round-robin. ``before`` runs untimed before each call."""
    return measure_in(ROOT, group, commands, env, repeats, before)


def measure_in(
    cwd: Path, group: str, commands: dict[str, list[str]], env: dict[str, str], repeats: int,
    before: Callable[[], None] | None = None,
) -> list[dict]:
    """``measure``, typed in ``cwd``."""
    samples: dict[str, list[float]] = {label: [] for label in commands}
    cpu: dict[str, list[float]] = {label: [] for label in commands}
    for rnd in range(repeats + 1):  # round 0 is the warm-up
        for label, argv in commands.items():
            if before:
                before()
            elapsed, used = run_once(argv, env, cwd)
            if rnd:
                samples[label].append(elapsed)
                cpu[label].append(used)
        print(f"  {group}: round {rnd}/{repeats}" + (" (warm-up)" if rnd == 0 else ""), file=sys.stderr)
    base = statistics.median(samples[list(commands)[-1]])
    base_cpu = statistics.median(cpu[list(commands)[-1]])
    return [
        {"group": group, "command": label, "median_s": statistics.median(s), "min_s": min(s),
         "ratio": statistics.median(s) / base, "extra_s": statistics.median(s) - base, "samples_s": s,
         "cpu_s": statistics.median(cpu[label]), "cpu_ratio": statistics.median(cpu[label]) / base_cpu}
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


def data_project(root: Path) -> Path:
    """A project as people have them: 20 small modules and a script beside 50 MB of data."""
    proj = root / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "model").mkdir()
    with open(proj / "data" / "train.bin", "wb") as fh:
        fh.write(os.urandom(50 * 1024 * 1024))
    for i in range(20):
        (proj / "model" / f"layer{i}.py").write_text(f"WIDTH = {i}\n" * 50)
    (proj / "train.py").write_text("import os\nprint(os.path.getsize('data/train.bin'))\n")
    return proj


def disk_usage(root: Path) -> int:
    """Bytes the tree takes on disk (blocks; a hard-linked file once), as du counts them."""
    seen, total = set(), 0
    for path in [root, *root.rglob("*")] if root.exists() else []:
        st = path.lstat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def measure_growth(proj: Path, home: Path, runs: int) -> dict:
    """$PHALANX_HOME growth per `phalanx run train.py` of ``proj`` (the first run, then each later one)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PHALANX_HOME": str(home)}
    sizes = [disk_usage(home)]
    for _ in range(runs):
        subprocess.run([PHALANX, "run", "train.py"], cwd=proj, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                       check=True)
        sizes.append(disk_usage(home))
    growth = [b - a for a, b in zip(sizes, sizes[1:])]
    return {"group": "snapshot", "command": f"$PHALANX_HOME growth per run, 50 MB data beside the code ({runs} runs)",
            "first_run_bytes": growth[0], "median_later_bytes": statistics.median(growth[1:]), "growth_bytes": growth}


def table(results: list[dict]) -> str:
    lines = [f"{'group':<9} {'command':<52} {'median s':>9} {'min s':>7} {'ratio':>6} {'+median s':>10} {'cpu s':>7} {'cpu ratio':>9}"]
    for r in results:
        lines.append(
            f"{r['group']:<9} {r['command']:<52} {r['median_s']:>9.3f} {r['min_s']:>7.3f} {r['ratio']:>6.2f} {r['extra_s']:>+10.3f}"
            f" {r['cpu_s']:>7.3f} {r['cpu_ratio']:>9.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds of the run comparisons (default 5)")
    parser.add_argument("--ps-repeats", type=int, default=10, help="timed rounds of the ps group (default 10)")
    parser.add_argument("--json", type=Path, help="also write the results (with every sample) here")
    parser.add_argument("--compare-src", type=Path, metavar="SRC",
                        help="also time the phalanx whose sources are in SRC (another checkout's src/), in the same rounds")
    args = parser.parse_args()

    # A normal install writes bytecode on first import; with PYTHONDONTWRITEBYTECODE set (as on
    # this project's machines) every run would compile phalanx from source instead, which is
    # not what users pay. Torch, in site-packages, was byte-compiled by pip either way.
    compileall.compile_dir(str(ROOT / "src" / "phalanx"), quiet=1)
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-") as tmp:
        run_home, ps_home = Path(tmp, "run"), Path(tmp, "ps")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PHALANX_HOME": str(run_home)}
        # The other phalanx, run by this venv's interpreter with its sources first on the path.
        other = ["env", f"PYTHONPATH={args.compare_src.resolve()}", PY, "-m", "phalanx"] if args.compare_src else None
        results = measure("run -n 2", {
            "phalanx run -n 2 hello.py": [PHALANX, "run", "-n", "2", HELLO],
            **({"(compared) phalanx run -n 2 hello.py": [*other, "run", "-n", "2", HELLO]} if other else {}),
            "torchrun --standalone --nproc-per-node 2 hello.py": [*TORCHRUN, "--standalone", "--nproc-per-node", "2", HELLO],
        }, env, args.repeats)
        results += measure("run -n 1", {
            "phalanx run hello.py": [PHALANX, "run", HELLO],
            **({"(compared) phalanx run hello.py": [*other, "run", HELLO]} if other else {}),
            "python hello.py": [PY, HELLO],
        }, env, args.repeats)
        proj = data_project(Path(tmp))
        project_env = {**env, "PHALANX_HOME": str(Path(tmp, "project-home"))}
        results += measure_in(proj, "project", {
            "phalanx run train.py  (project with 50 MB data)": [PHALANX, "run", "train.py"],
            "python train.py": [PY, "train.py"],
        }, project_env, args.repeats)
        growth = measure_growth(proj, Path(tmp, "growth-home"), 10)
        reset = populate(ps_home)
        results += measure("cli", {
            f"phalanx ps  ({N_FINISHED}+{N_RUNNING} jobs)": [PHALANX, "ps"],
            "phalanx ps --all": [PHALANX, "ps", "--all"],
            "phalanx ps --all --json": [PHALANX, "ps", "--all", "--json"],
            "phalanx ps --all --json --limit 10000": [PHALANX, "ps", "--all", "--json", "--limit", "10000"],
            "phalanx --help": [PHALANX, "--help"],
            "phalanx run --dry-run hello.py": [PHALANX, "run", "--dry-run", HELLO],
            "phalanx run --dry-run -n 2x2 hello.py": [PHALANX, "run", "--dry-run", "-n", "2x2", HELLO],
            "python -c pass": [PY, "-c", "pass"],
        }, {**env, "PHALANX_HOME": str(ps_home)}, args.ps_repeats, before=reset)

    print(f"\nphalanx core benchmark, {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}")
    print("ratio = median / median of the group's last (baseline) command; +median s = the difference\n")
    print(table(results))
    print(f"\n{growth['command']}: first run {growth['first_run_bytes'] / 1024:.0f} KiB, "
          f"then median {growth['median_later_bytes'] / 1024:.0f} KiB per run ({', '.join(str(g // 1024) for g in growth['growth_bytes'])} KiB)")
    results.append(growth)
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "platform": platform.platform(),
                "repeats": args.repeats, "ps_repeats": args.ps_repeats}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
