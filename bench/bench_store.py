"""The job store at 1,000 / 100,000 / 1,000,000 jobs: this tree against main's store code.

    .venv/bin/python bench/bench_store.py [--sizes 1000,100000,1000000] [--repeats 15]
        [--dir /tmp/phalanx-bench-store] [--main-ref main | --main-src PATH] [--json OUT]

Each store is filled through its own code's API: this tree's bulk ``Store.insert_jobs``, main's
``Store.insert_job`` per job inside one transaction (the same rows for both: 8-hex ids, 5,000
names, every tenth job a trial of a 50-trial sweep, 3 running jobs whose supervisor is alive,
specs as ``phalanx run`` records them). Filled stores are kept in ``--dir`` for the next run.

Measured per size, for both codes, each in its own process (two ``phalanx`` packages cannot
share one):

- library calls, median of ``--repeats`` after a warm-up: what ``ps`` (``list_jobs`` +
  ``list_sweeps``), ``ps --all`` (the same with the default limit of 50), ``status ID``,
  ``status PREFIX`` (6 hex digits, unique), ``status NAME`` (``get_job``) and a submit (a new id
  and the job's record) cost;
- the CLI end to end (``python -m phalanx ...`` as a user types it, interpreter start-up and
  imports included), round-robin between the two codes: ``ps --all``, ``status PREFIX``,
  ``status NAME``, and ``ps --all --json`` listing every job (wall time and peak memory; main
  is skipped at 1,000,000 jobs, where it needs about 7 GB: ``--main-json-max``);
- opening main's store with this tree's code once (the migration), on a copy.

Ratio = this tree / main, in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMES = 5000
RUNNING = "/home/user/project/running.py"  # the command of the 3 running jobs
TRIALS_PER_SWEEP = 50


# -- the worker: one code, one store ------------------------------------------------------------


def rows(n: int, home: Path) -> tuple[list[dict], list[dict]]:
    """The same jobs and sweeps for every code (a seeded generator)."""
    rnd = random.Random(n)
    ids: set[str] = set()
    spec = {"auto_metrics": True, "backend": "local", "backend_options": {}, "channels": [],
            "entrypoint": {"args": ["--lr", "0.01"], "kind": "script", "target": "/home/user/project/train.py"},
            "env": {}, "framework": "torch", "grace": 30.0, "max_restarts": 0, "max_retries": 0, "metrics": [],
            "name": "", "no_retry_on": ["CUDA out of memory", "OutOfMemoryError"], "output_uri": None,
            "python": "/home/user/project/.venv/bin/python3", "resources": {"nnodes": 1, "nproc_per_node": 2},
            "retry_on_exit_codes": [], "sample_interval": 5.0, "skip_if_done": False, "snapshot": True,
            "spawn": "auto", "stall_timeout": None, "state_uri": None, "workdir": "/home/user/project"}

    def new_id() -> str:
        while True:
            candidate = f"{rnd.getrandbits(32):08x}"
            if candidate not in ids:
                ids.add(candidate)
                return candidate

    now = time.time() - n - 10
    jobs, sweeps = [], []
    sweep_id = None
    for i in range(n):
        job_id = new_id()
        trial = i % 10 == 3
        if trial and (sweep_id is None or (i // 10) % TRIALS_PER_SWEEP == 0):
            sweep_id = new_id()
            sweeps.append(dict(id=sweep_id, name=f"sweep-{len(sweeps)}", state="SUCCEEDED", strategy="grid",
                               command="train.py --lr [...]", topology="1x2", spec_json="{}", settings_json="{}",
                               sweep_dir=str(home / "sweeps" / sweep_id), created_at=now + i, total=TRIALS_PER_SWEEP))
        running = i >= n - 3
        name = f"train-{rnd.randrange(NAMES)}"
        jobs.append(dict(
            id=job_id, name=name, state="RUNNING" if running else rnd.choice(("SUCCEEDED", "SUCCEEDED", "FAILED")),
            backend="local", nnodes=1, nproc_per_node=2, command=RUNNING if running else "/home/user/project/train.py",
            job_dir=str(home / "jobs" / job_id), spec_json=json.dumps({**spec, "name": name}, sort_keys=True),
            created_at=now + i, started_at=now + i + 1, ended_at=None if running else now + i + 5,
            exit_code=None if running else 0,
            sweep_id=sweep_id if trial else None, trial=i if trial else None))
    return jobs, sweeps


def populate(home: Path, n: int, bulk: bool) -> float:
    from phalanx.store import Store

    home.mkdir(parents=True, exist_ok=True)
    jobs, sweeps = rows(n, home)
    store = Store(home / "phalanx.db")
    began = time.perf_counter()
    if bulk or hasattr(Store, "insert_jobs"):  # any tree with the bulk insert (main's too, since it has one)
        for first in range(0, len(jobs), 100_000):
            store.insert_jobs(jobs[first:first + 100_000])
    else:
        store._conn.execute("BEGIN")
        for job in jobs:
            store.insert_job(**job)
        store._conn.execute("COMMIT")
    store._conn.execute("BEGIN")
    for sweep in sweeps:
        store.sweeps.insert(**sweep)
    store._conn.execute("COMMIT")
    took = time.perf_counter() - began
    (home / "filled.json").write_text(json.dumps({"jobs": n, "sweeps": len(sweeps), "seconds": took}))
    return took


def keep_running(home: Path) -> None:
    """The running jobs' supervisor is the driver of this benchmark (alive while it runs, so
    reconciling them writes nothing); untimed, like bench_core's reset."""
    import sqlite3

    import psutil

    driver = psutil.Process(os.getppid())
    with sqlite3.connect(home / "phalanx.db") as conn:
        conn.execute("UPDATE jobs SET state = 'RUNNING', ended_at = NULL, exit_code = NULL, root_cause = NULL,"
                     " supervisor_pid = ?, supervisor_started = ? WHERE command = ?",
                     (driver.pid, driver.create_time(), RUNNING))


def refs(home: Path, n: int) -> dict[str, str]:
    """An id, a unique 6-digit prefix and a name to look up (the same for every code)."""
    import sqlite3

    conn = sqlite3.connect(home / "phalanx.db")
    job_id, name = conn.execute("SELECT id, name FROM jobs WHERE sweep_id IS NULL ORDER BY created_at LIMIT 1 OFFSET ?",
                                (n // 2,)).fetchone()
    for other, in conn.execute("SELECT id FROM jobs WHERE sweep_id IS NULL ORDER BY created_at LIMIT 200 OFFSET ?", (n // 3,)):
        if conn.execute("SELECT COUNT(*) FROM jobs WHERE substr(id, 1, 6) = ?", (other[:6],)).fetchone()[0] == 1:
            prefix = other[:6]
            break
    return {"id": job_id, "prefix": prefix, "name": name}


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def worker(src: str, home: Path, n: int, repeats: int, bulk: bool) -> None:
    sys.path.insert(0, src)
    os.environ["PHALANX_HOME"] = str(home)
    filled = home / "filled.json"
    populated = None
    if not filled.exists() or json.loads(filled.read_text())["jobs"] != n:
        shutil.rmtree(home, ignore_errors=True)
        populated = populate(home, n, bulk)
    keep_running(home)
    try:  # the layered tree: reads are query's, ids are allocated where jobs are submitted
        from phalanx.api import query as jobs
        from phalanx.supervise.submit import new_job_id as allocate

        def new_job_id() -> str:
            return allocate(jobs.home())
    except ImportError:  # a tree from before the layers (main's, compared against)
        from phalanx.api import jobs  # type: ignore[no-redef]

        new_job_id = jobs.new_job_id  # type: ignore[attr-defined]

    ref = refs(home, n)
    store = jobs.open_store()
    counter = iter(range(10**9))

    def submit() -> None:
        job_id = new_job_id()
        jobs.open_store().insert_job(id=job_id, name=f"bench-{next(counter)}", backend="local", nnodes=1,
                                     nproc_per_node=1, command="t.py", job_dir=str(home / "jobs" / job_id),
                                     spec_json="{}", state="SUCCEEDED")

    ops = {
        "ps": lambda: (jobs.list_jobs(), jobs.list_sweeps()),
        "ps --all": lambda: (jobs.list_jobs(all_jobs=True, limit=50), jobs.list_sweeps(all_sweeps=True, limit=50)),
        "status ID": lambda: jobs.get_job(ref["id"]),
        "status PREFIX": lambda: jobs.get_job(ref["prefix"]),
        "status NAME": lambda: jobs.get_job(ref["name"]),
        "submit (id + record)": submit,
    }
    assert len(jobs.list_jobs()) == 3, "the 3 running jobs are listed (their supervisor, this process, is alive)"
    result = {name: timed(fn, repeats) for name, fn in ops.items()} if repeats else {}
    print(json.dumps({"ops": result, "refs": ref, "populate_s": populated, "jobs": store.count()}))


def migrate(src: str, db: Path) -> None:
    """Open main's store with this tree's code (the numbered migrations run once)."""
    sys.path.insert(0, src)
    from phalanx.store import Store

    began = time.perf_counter()
    Store(db).close()
    print(json.dumps({"migrate_s": time.perf_counter() - began}))


# -- the driver ---------------------------------------------------------------------------------


def run_json(argv: list[str]) -> dict:
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(argv)}\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def cli(src: str, home: Path, args: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (KiB) of ``phalanx ARGS`` run
    from ``src``, output discarded. CPU time is what the command costs whatever else runs on
    the machine; wall time is what a user waits, and grows with the load."""
    code = f"import sys; sys.path.insert(0, {src!r}); from phalanx.cli.main import main; sys.argv[0] = 'phalanx'; main()"
    env = {**os.environ, "PHALANX_HOME": str(home)}
    began = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env, cwd=tempfile.gettempdir())
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - began
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"phalanx {' '.join(args)} failed ({src}): {proc.stderr.read().decode() if proc.stderr else ''}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def cli_rows(args: argparse.Namespace, codes: dict[str, str], homes: dict[str, Path], n: int,
             ref: dict[str, str]) -> list[dict]:
    out = []
    commands = {"phalanx ps --all": ["ps", "--all"], "phalanx status PREFIX": ["status", ref["prefix"]],
                "phalanx status NAME": ["status", ref["name"]]}
    for label, argv in commands.items():
        samples: dict[str, list[tuple[float, float, int]]] = {code: [] for code in codes}
        for rnd in range(args.cli_repeats + 1):  # round-robin, round 0 warms up
            for code, src in codes.items():
                measured = cli(src, homes[code], argv)
                if rnd:
                    samples[code].append(measured)
        out.append({"jobs": n, "what": label, "kind": "cli",
                    **{f"{code}_s": statistics.median(m[0] for m in samples[code]) for code in codes},
                    **{f"{code}_cpu_s": statistics.median(m[1] for m in samples[code]) for code in codes}})
    listing = {code: cli(src, homes[code], ["ps", "--all", "--json", "--limit", str(10 * n)])
               for code, src in codes.items() if code == "this" or n <= args.main_json_max}
    out.append({"jobs": n, "what": "phalanx ps --all --json (every job)", "kind": "cli",
                "this_s": listing["this"][0], "main_s": listing["main"][0] if "main" in listing else None,
                "this_cpu_s": listing["this"][1], "main_cpu_s": listing["main"][1] if "main" in listing else None,
                "this_rss_mb": listing["this"][2] / 1024,
                "main_rss_mb": listing["main"][2] / 1024 if "main" in listing else None})
    return out


def main_source(args: argparse.Namespace, work: Path) -> str:
    if args.main_src:
        return str(Path(args.main_src).resolve())
    dest = work / f"main-src-{args.main_ref}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.main_ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return str(dest / "src")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,100000,1000000")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--cli-repeats", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "phalanx-bench-store")
    parser.add_argument("--main-ref", default="main")
    parser.add_argument("--main-src")
    parser.add_argument("--main-json-max", type=int, default=100_000, help="largest store main lists whole as JSON")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--parts", default="library,cli,migrate", help="what to measure (stores are kept)")
    parser.add_argument("--worker", nargs=5, metavar=("SRC", "HOME", "N", "REPEATS", "BULK"), help=argparse.SUPPRESS)
    parser.add_argument("--migrate", nargs=2, metavar=("SRC", "DB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        src, home, n, repeats, bulk = args.worker
        worker(src, Path(home), int(n), int(repeats), bulk == "1")
        return
    if args.migrate:
        migrate(args.migrate[0], Path(args.migrate[1]))
        return
    args.dir.mkdir(parents=True, exist_ok=True)
    codes = {"this": str(ROOT / "src"), "main": main_source(args, args.dir)}
    results: list[dict] = []
    parts = set(args.parts.split(","))
    sizes = [int(size) for size in args.sizes.split(",")]
    for n in sizes:
        homes = {code: args.dir / f"{code}-{n}" for code in codes}
        lib = {code: run_json([sys.executable, __file__, "--worker", src, str(homes[code]), str(n),
                               str(args.repeats if "library" in parts else 0), "1" if code == "this" else "0"])
               for code, src in codes.items()}
        if "library" in parts:
            for op in lib["this"]["ops"]:
                results.append({"jobs": n, "what": op, "kind": "library", "this_s": lib["this"]["ops"][op],
                                "main_s": lib["main"]["ops"][op]})
            print(f"  {n:,} jobs: library calls done", file=sys.stderr)
        if "cli" in parts:
            results += cli_rows(args, codes, homes, n, lib["this"]["refs"])
            print(f"  {n:,} jobs: CLI done", file=sys.stderr)
        if "migrate" in parts and n == max(sizes):
            copy = args.dir / "migrate.db"
            shutil.copy(homes["main"] / "phalanx.db", copy)
            took = run_json([sys.executable, __file__, "--migrate", codes["this"], str(copy)])["migrate_s"]
            copy.unlink()
            results.append({"jobs": n, "what": "open main's store (migration 4, once)", "kind": "library",
                            "this_s": took, "main_s": None})
    print(f"\nphalanx store benchmark, {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}")
    print("ratio = this tree / main, same run; library = the calls behind the command, cli = the whole command\n")
    print(f"{'jobs':>9}  {'kind':<7} {'what':<40} {'this':>10} {'main':>10} {'ratio':>7}  notes")
    for r in results:
        ratio = f"{r['this_s'] / r['main_s']:.3f}" if r["main_s"] else "-"
        main_s = f"{r['main_s'] * 1000:.1f} ms" if r["main_s"] is not None else "-"
        note = ""
        if r.get("this_cpu_s") is not None:
            main_cpu = r.get("main_cpu_s")
            note = f"CPU {r['this_cpu_s'] * 1000:.0f} ms" + (
                f" vs {main_cpu * 1000:.0f} ms (ratio {r['this_cpu_s'] / main_cpu:.3f}); " if main_cpu else "; ")
        if "this_rss_mb" in r:
            note += f"peak RSS {r['this_rss_mb']:.0f} MB" + (f" vs {r['main_rss_mb']:.0f} MB" if r["main_rss_mb"] else
                                                            " (main not run: ~7 GB)")
        print(f"{r['jobs']:>9,}  {r['kind']:<7} {r['what']:<40} {r['this_s'] * 1000:>7.1f} ms {main_s:>10} {ratio:>7}  {note}")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "platform": platform.platform()}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
