"""The store side of the team server's load: many clients listing and looking up jobs at once,
PostgreSQL against SQLite in the same run (the server's own benchmark, issue 22's ``ps`` p50/p95
with 50 concurrent clients, adds HTTP and identity on top of this).

    .venv/bin/python bench/bench_store_clients.py [--jobs 100000] [--clients 50] [--requests 20]

One store per engine with ``--jobs`` jobs (``bench_store_pg.jobs``: the same rows), then
``--clients`` processes at once, each opening the store and making ``--requests`` requests of
``ps`` (the newest 50, through ``page_jobs``) and ``status PREFIX`` (``Store.find``) in turn.
Reported per engine: p50, p95 and the largest latency of each request kind, and the requests
per second of the whole run. Every client process has its own connection (PostgreSQL) or file
handle (SQLite), as separate server workers would.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))


def client(where: str, prefixes: list[str], requests: int, start_at: float) -> None:
    from phalanx.store import Store
    from phalanx.store.listing import Filter, Sort, page_jobs

    store = Store(where)
    page_jobs(store, Filter(), Sort(), 50)  # connected and warm before the start
    while time.time() < start_at:
        time.sleep(0.005)
    out: dict[str, list[float]] = {"ps": [], "status PREFIX": []}
    for i in range(requests):
        began = time.perf_counter()
        page_jobs(store, Filter(), Sort(), 50)
        out["ps"].append(time.perf_counter() - began)
        began = time.perf_counter()
        store.find(prefixes[i % len(prefixes)])
        out["status PREFIX"].append(time.perf_counter() - began)
    print(json.dumps(out))


def storm(where: str, prefixes: list[str], clients: int, requests: int) -> dict[str, Any]:
    start_at = time.time() + 10 + clients * 0.6  # every client connected and warm before it (2 busy cores)
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); sys.path.insert(0, {str(ROOT / 'src')!r}); "
            f"from bench_store_clients import client; client({where!r}, {prefixes!r}, {requests}, {start_at})")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(clients)]
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    ended = time.time()
    if any(p.returncode for p in procs):
        sys.exit("a client failed")
    merged: dict[str, list[float]] = {}
    for out in outs:
        for kind, times in json.loads(out.strip().splitlines()[-1]).items():
            merged.setdefault(kind, []).extend(times)
    result: dict[str, Any] = {"rps": clients * requests * 2 / (ended - start_at)}
    for kind, times in merged.items():
        cuts = statistics.quantiles(times, n=20)
        result[kind] = {"p50": statistics.median(times), "p95": cuts[18], "max": max(times)}
    return result


def main() -> None:
    from bench_store_pg import DURABLE, fill, jobs

    from tests.pgserver import PgServer, unavailable

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"cannot run: {why}")
    work = Path(tempfile.mkdtemp(prefix="phx-bench-clients-"))
    server = PgServer({**DURABLE, "max_connections": str(args.clients + 20)})
    try:
        rows = jobs(args.jobs, work / "home")
        from collections import Counter

        stems = Counter(r["id"][:6] for r in rows)
        prefixes = [r["id"][:6] for r in rows[:: max(1, len(rows) // 60)] if stems[r["id"][:6]] == 1][:50]
        db = server.create_database("clients")
        wheres = {"postgresql": server.socket_url(db), "sqlite": str(work / "p.db")}
        for where in wheres.values():
            fill(where, rows)
        results = {engine: storm(where, prefixes, args.clients, args.requests) for engine, where in wheres.items()}
    finally:
        server.stop()
    print(f"\n{args.clients} clients x {args.requests} requests of each kind, {args.jobs:,} jobs, {os.cpu_count()} CPUs")
    print(f"{'engine':<11} {'request':<14} {'p50':>9} {'p95':>9} {'max':>9}   requests/s (all)")
    for engine, result in results.items():
        for kind in ("ps", "status PREFIX"):
            r = result[kind]
            print(f"{engine:<11} {kind:<14} {r['p50'] * 1000:>6.1f} ms {r['p95'] * 1000:>6.1f} ms {r['max'] * 1000:>6.1f} ms"
                  f"   {result['rps']:,.0f}")


if __name__ == "__main__":
    main()
