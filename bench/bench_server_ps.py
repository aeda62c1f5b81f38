"""``ps`` with many people at once on a big store: a team server on PostgreSQL against the same
listing on a laptop's own SQLite store, in the same run (issue 22: ``ps`` p50/p95 with 50
concurrent clients at 100,000 jobs).

    .venv/bin/python bench/bench_server_ps.py [--jobs 100000] [--clients 50] [--requests 10] [--rounds 2] [--json OUT]

- Both stores hold the same ``--jobs`` jobs (``bench_store_pg.jobs``: 10 users, every tenth
  job a sweep's trial, the newest 3 running), filled through the store's own bulk insert
  (``Store.insert_jobs``); PostgreSQL's then VACUUM ANALYZEd, as autovacuum would soon after.
  PostgreSQL is a private server (``tests/pgserver.py``) with its default durability, reached
  over loopback TCP; SQLite is the file in ``$PHALANX_HOME``, as phalanx opens it.
- server: a real ``phalanx server --store postgresql://...`` on loopback; each client a
  ``RemoteFace`` (what ``phalanx ps`` calls when logged in: HTTP, the token checked, the rows
  streamed back as JSON lines), every row read.
- local: each client a ``LocalFace`` on the SQLite file (what ``phalanx ps`` calls with no login).
- ``--clients`` clients at once (threads in ``--procs`` processes, the same harness for both),
  each making ``--requests`` requests of ``ps`` (the running jobs, what a bare ``phalanx ps``
  lists) and ``ps --all`` (the newest page of every job) in turn; one client alone as well, for
  the latency without contention. The two sides take turns, ``--rounds`` times, so the machine's
  other load weighs on each alike.
- The CLI as typed: ``phalanx ps --all`` logged in vs ``phalanx --local ps --all``, one at a
  time, ``--cli-runs`` each, alternating (the interpreter's start included: what a person waits).

Reported: p50 / p95 / p99 per side and request kind, requests per second, ratio server / local.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

from bench_server_load import DURABLE, add_users, pct, start_server, team  # noqa: E402

KINDS = ("ps", "ps --all")
# the load's WAL kept small (a shared disk); reads do not touch it
SETTINGS = {**DURABLE, "max_wal_size": "256MB"}


def one_client(side: str, where: str, token: str, requests: int, out: dict[str, list[float]]) -> None:
    from phalanx.api.ps import PsRequest

    face: Any
    if side == "server":
        from phalanx.remote.face import RemoteFace
        from phalanx.remote.login import Login

        face = RemoteFace(Login(where, token))
    else:
        from phalanx.api.face import LocalFace

        face = LocalFace()
    asks = {"ps": PsRequest(), "ps --all": PsRequest(all=True)}
    for i in range(requests):
        for kind in KINDS:
            began = time.perf_counter()
            listing = face.ps(asks[kind])
            rows = list(listing.rows)
            out[kind].append(time.perf_counter() - began)
            out.setdefault("rows " + kind, []).append(len(rows))


def worker(config: dict[str, Any]) -> None:
    import threading

    os.environ["PHALANX_HOME"] = config["home"]
    out: dict[str, list[float]] = {kind: [] for kind in KINDS}
    # warm: imported, connected, the first answer read (a person's second ps, not their first)
    warm: dict[str, list[float]] = {kind: [] for kind in KINDS}
    one_client(config["side"], config["where"], config["token"], 1, warm)
    while time.time() < config["start_at"]:
        time.sleep(0.005)
    threads = [threading.Thread(target=one_client, args=(config["side"], config["where"], config["token"],
                                                         config["requests"], out)) for _ in range(config["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(out), flush=True)


def storm(side: str, where: str, token: str, home: Path, clients: int, requests: int, procs: int) -> dict[str, Any]:
    procs = max(1, min(procs, clients))
    start_at = time.time() + 5 + procs * 1.0
    children = []
    for p in range(procs):
        config = {"side": side, "where": where, "token": token, "home": str(home), "requests": requests,
                  "start_at": start_at, "threads": len([c for c in range(clients) if c % procs == p])}
        code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'bench')!r}); sys.path.insert(0, {str(ROOT / 'src')!r}); "
                f"from bench_server_ps import worker; worker(json.loads({json.dumps(config)!r}))")
        env = {k: v for k, v in os.environ.items() if k not in ("PHALANX_SERVER", "PHALANX_TOKEN", "PHALANX_STORE")}
        children.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                         env={**env, "PHALANX_HOME": str(home)}))
    outs = [c.communicate(timeout=3600)[0] for c in children]
    seconds = time.time() - start_at
    if any(c.returncode for c in children):
        raise SystemExit(f"a {side} client failed")
    merged: dict[str, list[float]] = {}
    for text in outs:
        for kind, values in json.loads(text.strip().splitlines()[-1]).items():
            merged.setdefault(kind, []).extend(values)
    merged["_seconds"] = [seconds]
    return merged


def cli_runs(url_env: dict[str, str], local_env: dict[str, str], runs: int, cwd: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"server": [], "local": []}
    for _ in range(runs):
        for side, env, extra in (("server", url_env, []), ("local", local_env, ["--local"])):
            began = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "phalanx", *extra, "ps", "--all"], env=env, cwd=cwd,
                                  capture_output=True, text=True, timeout=300)
            if done.returncode:
                raise SystemExit(f"phalanx ps ({side}) failed: {done.stderr}")
            out[side].append(time.perf_counter() - began)
    return out


def fill(store_where: str | Path, rows: list[dict[str, Any]]) -> float:
    from bench_store_pg import fill as bulk

    _, rate = bulk(store_where, rows)
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--procs", type=int, default=10)
    parser.add_argument("--cli-runs", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from bench_store_pg import jobs

    with team(SETTINGS, "phx-ps-") as (pg, work, servers):
        base = {k: v for k, v in os.environ.items() if not k.startswith("PHALANX_")}
        server_home, local_home = work / "server-home", work / "laptop-home"
        env = {**base, "PHALANX_HOME": str(server_home), "HOME": str(work), "OMP_NUM_THREADS": "1", "PGPASSWORD": pg.password}
        store = pg.tcp_url(pg.create_database(), password=False)
        os.environ["PGPASSWORD"] = pg.password
        token = add_users(env, store, 1)[0]
        began = time.perf_counter()
        pg_rate = fill(store, jobs(args.jobs, server_home))
        os.environ["PHALANX_HOME"] = str(local_home)
        from phalanx.api.query import home

        sqlite_rate = fill(home().db, jobs(args.jobs, local_home))
        print(f"filled both stores with {args.jobs} jobs in {time.perf_counter() - began:.0f}s "
              f"({pg_rate:.0f} and {sqlite_rate:.0f} rows/s)", file=sys.stderr)
        proc, url = start_server(env, store, work, work / "server.err")
        servers.append(proc)
        results: dict[str, dict[str, list[float]]] = {}
        for side in ("server", "local"):
            results[f"{side} alone"] = {k: [] for k in KINDS}
            results[side] = {k: [] for k in (*KINDS, "_seconds")}
        for _ in range(args.rounds):
            for side, where, where_home in (("server", url, work / "client-home"), ("local", "", local_home)):
                alone = storm(side, where, token, where_home, 1, args.requests * 3, 1)
                for kind in KINDS:
                    results[f"{side} alone"][kind] += alone[kind]
                many = storm(side, where, token, where_home, args.clients, args.requests, args.procs)
                for kind in (*KINDS, "_seconds"):
                    results[side][kind] += many[kind]
                rows = {kind: many.get("rows " + kind, [None])[0] for kind in KINDS}
                results.setdefault("rows", {}).update({f"{side} {k}": [v] for k, v in rows.items() if v is not None})
        client_env = {**base, "PHALANX_HOME": str(work / "client-home"), "XDG_CONFIG_HOME": str(work / "client-config"),
                      "HOME": str(work)}
        subprocess.run([sys.executable, "-m", "phalanx", "login", url, "--token-stdin"], env=client_env, input=token + "\n",
                       text=True, capture_output=True, check=True)
        local_env = {**base, "PHALANX_HOME": str(local_home), "XDG_CONFIG_HOME": str(work / "client-config"), "HOME": str(work)}
        cli = cli_runs(client_env, local_env, args.cli_runs, work)
        report: dict[str, Any] = {"jobs": args.jobs, "clients": args.clients, "requests_each": args.requests,
                                  "rounds": args.rounds,
                                  "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
                                  "rows": {k: v[0] for k, v in results.get("rows", {}).items()}}
        for side in ("server", "local", "server alone", "local alone"):
            report[side] = {kind: {"n": len(results[side][kind]), "p50": pct(results[side][kind], 50),
                                   "p95": pct(results[side][kind], 95), "p99": pct(results[side][kind], 99)} for kind in KINDS}
        for side in ("server", "local"):
            report[side]["requests_per_s"] = (len(results[side]["ps"]) * len(KINDS)) / sum(results[side]["_seconds"])
        report["ratio server/local"] = {f"{kind} {q}": report["server"][kind][q] / report["local"][kind][q]
                                        for kind in KINDS for q in ("p50", "p95")}
        report["ratio server/local alone"] = {f"{kind} p50": report["server alone"][kind]["p50"] / report["local alone"][kind]["p50"]
                                              for kind in KINDS}
        report["cli ps --all"] = {side: {"p50": pct(v, 50), "p95": pct(v, 95), "n": len(v)} for side, v in cli.items()}
        report["cli ratio server/local p50"] = report["cli ps --all"]["server"]["p50"] / report["cli ps --all"]["local"]["p50"]
        print(json.dumps(report, indent=2))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
