"""The job store on PostgreSQL against the same store on SQLite, in the same run, at 1,000 /
100,000 / 1,000,000 jobs: are PostgreSQL's reads as flat as SQLite's, and what do its writes cost?

    .venv/bin/python bench/bench_store_pg.py [--sizes 1000,100000,1000000] [--repeats 31] [--json OUT]

A private PostgreSQL (tests/pgserver.py) with its default durability (``fsync`` and
``synchronous_commit`` on: every commit waits for the disk) on a unix socket, and SQLite as
phalanx opens it (WAL, ``synchronous=NORMAL``: a commit does not wait for the disk). Because
that difference decides the cost of a submit, submits are also timed on PostgreSQL with
``synchronous_commit=off`` (the URL's ``options``), SQLite's durability: a crash of the machine
may lose the last commits, never corrupt the store.

Both stores are filled through the store's own API (``Store.insert_jobs``: one COPY on
PostgreSQL, one ``executemany`` on SQLite) with the same rows (``bench_store.rows``' jobs,
each with a user: 10 users, and one with about 20 jobs at every size; every tenth job a trial); PostgreSQL's then
VACUUM ANALYZEd, as autovacuum would soon after such a load.

Measured per size and engine (median of ``--repeats`` after a warm-up, every call of both
engines taken in turn so that the machine's other load weighs on each alike), through the calls
``phalanx ps`` and ``status`` make:

- fill: rows per second of the bulk insert;
- submit: a new id and the job's row (``new_id`` + ``insert_job``), one transaction each;
- ps: the newest 50 top-level jobs (``page_jobs``), and a page deep in the listing (a cursor);
- ps (active): the jobs not ended (``Store.list(active_only=True)``);
- ps --user: the newest 50 of one user (a common one, and a rare one);
- status PREFIX: a job by a unique 6-digit id prefix (``Store.find``); status NAME;
- count by state: how many jobs are RUNNING (``count_jobs``, what the dashboard shows);
- transition: a compare-and-set of one job's state (RUNNING -> RUNNING is refused: no write).

Ratio = PostgreSQL / SQLite in the same run; "flat" = the same op at the largest size / at the
smallest, per engine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on", "shared_buffers": "256MB",
           "max_connections": "100"}


def timed(fns: dict[Any, Callable[[], Any]], repeats: int) -> dict[Any, float]:
    """Median seconds of each call, the calls taken in turn (A, B, A, B, ...) so that what else
    runs on the machine weighs on each alike; one warm-up each."""
    for fn in fns.values():
        fn()
    samples: dict[Any, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            began = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - began)
    return {name: statistics.median(times) for name, times in samples.items()}


def jobs(n: int, home: Path) -> list[dict[str, Any]]:
    from bench_store import rows

    made, _ = rows(n, home)
    every = max(1, n // 20)
    for i, job in enumerate(made):  # 10 users, and one with about 20 jobs at every size
        job["user_name"] = "rare" if i % every == 7 else f"user{i % 10}"
    return made


def fill(where: str | Path, rows: list[dict[str, Any]]) -> tuple[Any, float]:
    from phalanx.store import Store

    store = Store(where)
    began = time.perf_counter()
    for first in range(0, len(rows), 100_000):
        store.insert_jobs(rows[first:first + 100_000])
    took = time.perf_counter() - began
    if store.engine.kind == "postgresql":
        # What autovacuum would do soon after a bulk load (statistics, the visibility map), done
        # now so it does not run during the timings. SQLite's planner runs without statistics,
        # as phalanx leaves it (an ANALYZE there changes its plans).
        store.engine.write("VACUUM ANALYZE")
        store.engine.write("CHECKPOINT")
    return store, len(rows) / took


def ops(store: Any, rows: list[dict[str, Any]]) -> dict[str, Callable[[], Any]]:
    from phalanx.core.state import JobState
    from phalanx.store.listing import Filter, Sort, count_jobs, page_jobs

    top = [r for r in rows if r["sweep_id"] is None]
    ref = top[len(top) // 2]
    from collections import Counter

    stems = Counter(r["id"][:6] for r in rows)
    prefix = next(r["id"][:6] for r in top[len(top) // 3:] if stems[r["id"][:6]] == 1)
    deep = page_jobs(store, Filter(), Sort(), 50)
    for _ in range(3):
        deep = page_jobs(store, Filter(), Sort(), 50, deep.next) if deep.next else deep
    running = next(r["id"] for r in reversed(rows) if r["state"] == "RUNNING")
    counter = iter(range(10**9))

    def submit() -> None:
        job_id = store.new_id()
        store.insert_job(id=job_id, name=f"bench-{next(counter)}", backend="local", nnodes=1, nproc_per_node=1,
                         command="t.py", job_dir=f"/tmp/{job_id}", spec_json="{}", state="SUCCEEDED")

    table = {
        "ps (newest 50)": lambda: page_jobs(store, Filter(), Sort(), 50),
        "ps (a deep page)": lambda: page_jobs(store, Filter(), Sort(), 50, deep.next),
        "ps (active)": lambda: store.list(active_only=True),
        "ps --user (common)": lambda: page_jobs(store, Filter(user="user7"), Sort(), 50),
        "ps --user (rare)": lambda: page_jobs(store, Filter(user="rare"), Sort(), 50),
        "status PREFIX": lambda: store.find(prefix),
        "status NAME": lambda: store.find(ref["name"]),
        "count by state (RUNNING)": lambda: count_jobs(store, Filter(states=("RUNNING",))),
        "transition (refused CAS)": lambda: store.transition(running, JobState.RUNNING),
        "submit (id + row)": submit,
    }
    return table


def main() -> None:
    from tests.pgserver import PgServer, unavailable

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,100000,1000000")
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"cannot run: {why}")
    from phalanx.store import postgres

    work = Path(tempfile.mkdtemp(prefix="phx-bench-pg-"))
    server = PgServer(DURABLE)
    results: list[dict[str, Any]] = []
    try:
        for n in [int(s) for s in args.sizes.split(",")]:
            rows = jobs(n, work / f"home-{n}")
            db = server.create_database(f"bench_{n}")
            pg, pg_fill = fill(server.socket_url(db), rows)
            lite, lite_fill = fill(work / f"sqlite-{n}.db", rows)
            from phalanx.store import Store

            loose = Store(server.socket_url(db, "options=-c%20synchronous_commit%3Doff"))
            calls = {"postgresql": ops(pg, rows), "sqlite": ops(lite, rows)}
            both = {(engine, op): fn for op in calls["sqlite"] for engine, fn in
                    (("postgresql", calls["postgresql"][op]), ("sqlite", calls["sqlite"][op]))}
            both[("loose", "submit")] = submitter(loose)
            took = timed(both, args.repeats)
            found = {engine: {op: took[(engine, op)] for op in calls["sqlite"]} for engine in calls}
            results.append({"jobs": n, "what": "fill (rows/s, bulk)", "postgresql": pg_fill, "sqlite": lite_fill})
            for op in found["postgresql"]:
                results.append({"jobs": n, "what": op, "postgresql": found["postgresql"][op], "sqlite": found["sqlite"][op]})
            results.append({"jobs": n, "what": "submit (id + row), PG synchronous_commit=off",
                            "postgresql": took[("loose", "submit")], "sqlite": found["sqlite"]["submit (id + row)"]})
            plans = {op: " / ".join(pg.engine.explain(sql, params)) for op, (sql, params) in probe(pg).items()}
            results.append({"jobs": n, "what": "plans", "postgresql": plans, "sqlite": None})
            postgres.dispose_all()
            print(f"  {n:,} jobs done", file=sys.stderr)
    finally:
        server.stop()
    report(results, args)


def submitter(store: Any) -> Callable[[], None]:
    counter = iter(range(10**9))

    def submit() -> None:
        job_id = store.new_id()
        store.insert_job(id=job_id, name=f"loose-{next(counter)}", backend="local", nnodes=1, nproc_per_node=1,
                         command="t.py", job_dir=f"/tmp/{job_id}", spec_json="{}", state="SUCCEEDED")

    return submit


def probe(store: Any) -> dict[str, tuple[str, Any]]:
    """The SQL of the newest page and of a prefix lookup, for their plans in the report."""
    from phalanx.store.listing import Filter, Sort, page_jobs

    seen: list[tuple[str, Any]] = []
    rows = store.engine.rows
    store.engine.rows = lambda sql, params=(): (seen.append((sql, params)), rows(sql, params))[1]
    try:
        page_jobs(store, Filter(), Sort(), 50)
        page_jobs(store, Filter(user="rare"), Sort(), 50)
    finally:
        del store.engine.rows
    return {"ps (newest 50)": seen[0], "ps --user (rare)": seen[1]}


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\nphalanx store: PostgreSQL vs SQLite, {os.cpu_count()} CPUs, {platform.platform()}, "
          f"python {platform.python_version()}")
    print("ratio = PostgreSQL / SQLite, same run; times are medians per call\n")
    print(f"{'jobs':>9}  {'what':<46} {'PostgreSQL':>12} {'SQLite':>12} {'ratio':>7}")
    for r in results:
        if r["what"] == "plans":
            continue
        if r["what"].startswith("fill"):
            print(f"{r['jobs']:>9,}  {r['what']:<46} {r['postgresql']:>9,.0f}/s {r['sqlite']:>9,.0f}/s "
                  f"{r['postgresql'] / r['sqlite']:>7.2f}")
        else:
            print(f"{r['jobs']:>9,}  {r['what']:<46} {r['postgresql'] * 1000:>9.3f} ms {r['sqlite'] * 1000:>9.3f} ms "
                  f"{r['postgresql'] / r['sqlite']:>7.2f}")
    sizes = sorted({r["jobs"] for r in results})
    if len(sizes) > 1:
        print(f"\nflat: time at {sizes[-1]:,} jobs / time at {sizes[0]:,} jobs, per engine")
        for what in [r["what"] for r in results if r["jobs"] == sizes[0] and r["what"] not in ("plans",)
                     and not r["what"].startswith("fill")]:
            small = next(r for r in results if r["jobs"] == sizes[0] and r["what"] == what)
            big = next(r for r in results if r["jobs"] == sizes[-1] and r["what"] == what)
            print(f"  {what:<46} PostgreSQL {big['postgresql'] / small['postgresql']:>5.2f}   "
                  f"SQLite {big['sqlite'] / small['sqlite']:>5.2f}")
    for r in results:
        if r["what"] == "plans":
            print(f"\nPostgreSQL's plans at {r['jobs']:,} jobs:")
            for op, plan in r["postgresql"].items():
                print(f"  {op}: {plan}")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "platform": platform.platform()}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
