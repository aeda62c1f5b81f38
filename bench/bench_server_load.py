"""The team server under load, loopback only, bounded: a real ``phalanx server`` on a real
PostgreSQL, many clients submitting at once while others list, then an audit of the store.

    .venv/bin/python bench/bench_server_load.py [--clients 50] [--submits 20] [--ps-clients 10] [--json OUT]

- PostgreSQL: a private server (``tests/pgserver.py``, as the server tests start one) with its
  default durability (fsync and synchronous_commit on), over loopback TCP, its password in
  ``PGPASSWORD`` as a team would keep it; the server's users added with ``phalanx server user add``
  (one per ten clients).
- ``--clients`` clients (threads in ``--procs`` processes, each thread a ``RemoteFace`` of its own:
  what ``phalanx run -d`` calls) each submit ``--submits`` jobs one after another: a one-process
  job whose script prints a line and ends, shipped as the CLI ships code (content-addressed: the
  first submit uploads it, the rest send none). Every job runs for real under its own supervisor
  on the server's local backend.
- ``--ps-clients`` clients meanwhile run ``ps`` (``RemoteFace.ps``: what ``phalanx ps`` calls, every
  row read) in a loop until the submits are done.
- The audit, in the store itself: every id a submit answered is a job exactly once (0 lost, 0
  duplicated), and no job is there that no client was told of. Errors are counted by kind; the
  only documented 429 is "too many failed logins", which these clients never provoke, so every
  error counts.

Reported: submits and ps requests per second, p50/p95/p99 of each (seconds, as the client sees
it: the HTTP round trip, shipping included), lost, duplicated, unclaimed, errors. Nothing here
asserts a time; ``tests/server/test_load.py`` runs a small one asserting 0 lost and 0 errors.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on", "shared_buffers": "256MB",
           "max_connections": "300"}
SCRIPT = "print('done', flush=True)\n"


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": pct(values, 50), "p95": pct(values, 95), "p99": pct(values, 99),
            "max": max(values) if values else None}


# -- the server ---------------------------------------------------------------------------------

def server_env(work: Path, pg: Any) -> tuple[dict[str, str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHALANX_")}
    env.update({"PHALANX_HOME": str(work / "server-home"), "HOME": str(work), "OMP_NUM_THREADS": "1", "PHALANX_WARM": "0",
                "PGPASSWORD": pg.password})
    return env, pg.tcp_url(pg.create_database(), password=False)


def add_users(env: dict[str, str], store: str, n: int) -> list[str]:
    tokens = []
    for i in range(n):
        done = subprocess.run([sys.executable, "-m", "phalanx", "server", "--store", store, "user", "add", f"load{i}"],
                              env=env, capture_output=True, text=True, timeout=240)
        if done.returncode:
            raise SystemExit(f"user add failed: {done.stderr}")
        tokens.append(done.stdout.strip())
    return tokens


def start_server(env: dict[str, str], store: str, cwd: Path, log: Path) -> tuple[subprocess.Popen, str]:
    err = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "phalanx", "server", "--store", store, "--port", "0"], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=err, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("phalanx server: "):
        proc.kill()
        raise SystemExit(f"the server did not start: {log.read_text()[-2000:]}")
    return proc, line.split()[2].rstrip("/")


# -- the clients --------------------------------------------------------------------------------

def _kind(exc: BaseException) -> str:
    text = str(getattr(exc, "message", "") or exc)
    return f"{type(exc).__name__}: {text[:160]}"


def submitter(url: str, token: str, workdir: Path, submits: int, out: dict[str, Any]) -> None:
    from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources
    from phalanx.remote.face import RemoteFace
    from phalanx.remote.login import Login

    face = RemoteFace(Login(url, token))
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(workdir / "job.py")), Resources(1, 1), name="load",
                   workdir=str(workdir), snapshot=True, grace=5.0)
    for _ in range(submits):
        began = time.perf_counter()
        try:
            job = face.submit(spec)
        except Exception as exc:  # noqa: BLE001 - every failure is counted, by kind
            out["errors"].append(_kind(exc))
            continue
        out["submit"].append(time.perf_counter() - began)
        out["ids"].append(job["id"])


def lister(url: str, token: str, done: threading.Event, out: dict[str, Any]) -> None:
    from phalanx.api.ps import PsRequest
    from phalanx.remote.face import RemoteFace
    from phalanx.remote.login import Login

    face = RemoteFace(Login(url, token))
    while not done.is_set():
        began = time.perf_counter()
        try:
            listing = face.ps(PsRequest())
            list(listing.rows)
        except Exception as exc:  # noqa: BLE001
            out["errors"].append(_kind(exc))
            continue
        out["ps"].append(time.perf_counter() - began)


def worker(config: dict[str, Any]) -> None:
    """One client process: its submitters and listers as threads; one JSON line on stdout."""
    out: dict[str, Any] = {"ids": [], "submit": [], "ps": [], "errors": []}
    os.environ["PHALANX_HOME"] = config["home"]  # where shipping keeps its digests: the client's own
    while time.time() < config["start_at"]:
        time.sleep(0.01)
    done = threading.Event()
    submit_threads = [threading.Thread(target=submitter, args=(config["url"], token, Path(config["workdir"]),
                                                              config["submits"], out)) for token in config["submit_tokens"]]
    list_threads = [threading.Thread(target=lister, args=(config["url"], token, done, out), daemon=True)
                    for token in config["ps_tokens"]]
    for t in submit_threads + list_threads:
        t.start()
    for t in submit_threads:
        t.join()
    Path(config["mark"]).write_text(str(len(submit_threads)))
    if config["ps_tokens"]:
        flag = Path(config["flag"])  # the listers run on until every process's submits are done
        while not flag.exists():
            time.sleep(0.05)
    done.set()
    for t in list_threads:
        t.join(60)
    print(json.dumps(out), flush=True)


def load(url: str, tokens: list[str], work: Path, clients: int, submits: int, ps_clients: int,
         procs: int = 10) -> dict[str, Any]:
    """The clients at once, in ``procs`` processes; everything they saw, merged."""
    workdir = work / "project"
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "job.py").write_text(SCRIPT)
    procs = max(1, min(procs, clients))
    flag = work / "submits-done"
    start_at = time.time() + 5 + procs * 1.0  # every process imported and waiting before it (2 busy cores)
    children = []
    for p in range(procs):
        config = {"url": url, "workdir": str(workdir), "home": str(work / f"client-home-{p}"), "submits": submits,
                  "start_at": start_at, "flag": str(flag), "mark": str(work / f"submitted-{p}"),
                  "submit_tokens": [tokens[c % len(tokens)] for c in range(clients) if c % procs == p],
                  "ps_tokens": [tokens[c % len(tokens)] for c in range(ps_clients) if c % procs == p]}
        code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'bench')!r}); sys.path.insert(0, {str(ROOT / 'src')!r}); "
                f"from bench_server_load import worker; worker(json.loads({json.dumps(config)!r}))")
        children.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                         env={**os.environ, "PHALANX_HOME": config["home"]}))
    threading.Thread(target=_flag_when_submitted, args=(children, flag, clients, submits, work), daemon=True).start()
    outs = [c.communicate(timeout=3600)[0] for c in children]
    ended = time.time()
    merged: dict[str, Any] = {"ids": [], "submit": [], "ps": [], "errors": []}
    for child, text in zip(children, outs):
        if child.returncode:
            merged["errors"].append(f"a client process failed ({child.returncode})")
            continue
        for key, values in json.loads(text.strip().splitlines()[-1]).items():
            merged[key].extend(values)
    merged["seconds"] = ended - start_at
    return merged


def _flag_when_submitted(children: list[subprocess.Popen], flag: Path, clients: int, submits: int, work: Path) -> None:
    """Tell the listers to stop once no submitter is left: a submitter thread ends after its
    last submit, so the listers' clocks overlap the whole submit phase. Each process knows only
    its own threads, hence this watcher: it waits for the processes' submit counts on disk."""
    while True:
        done = sum(int(p.read_text() or 0) for p in work.glob("submitted-*"))
        if done >= clients or all(c.poll() is not None for c in children):
            break
        time.sleep(0.1)
    flag.write_text("1")


def audit(store: str, ids: list[str]) -> dict[str, int]:
    """The store against what the clients were told: lost (answered, not in the store),
    duplicated (an id twice), unclaimed (in the store, never answered to anyone)."""
    from phalanx.store import Store

    engine = Store(store).engine
    rows = engine.rows("SELECT id, COUNT(*) FROM jobs GROUP BY id")
    counts = {str(r[0]): int(r[1]) for r in rows}
    told = set(ids)
    return {"jobs": len(counts), "answered": len(ids), "lost": len(told - set(counts)),
            "duplicated": sum(1 for c in counts.values() if c > 1) + (len(ids) - len(told)),
            "unclaimed": len(set(counts) - told)}


def wait_ended(store: str, timeout: float) -> int:
    """Jobs not yet ended once ``timeout`` has passed (their supervisors are still finishing)."""
    from phalanx.core.state import TERMINAL
    from phalanx.store import Store

    engine = Store(store).engine
    deadline = time.monotonic() + timeout
    while True:
        states = ", ".join(f"'{s.value}'" for s in TERMINAL)
        left = int(engine.rows(f"SELECT COUNT(*) FROM jobs WHERE state NOT IN ({states})")[0][0])
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(1)


@contextmanager
def team(settings: dict[str, str], prefix: str) -> Iterator[tuple[Any, Path, list[subprocess.Popen]]]:
    """A private PostgreSQL (``tests/pgserver.py``), a work directory, and a list the caller puts
    its servers in: all of them stopped and removed afterwards."""
    from tests import pgserver

    why = pgserver.unavailable()
    if why:
        raise SystemExit(f"no PostgreSQL here: {why}")
    pg = pgserver.PgServer(settings)
    work = Path(tempfile.mkdtemp(prefix=prefix))
    servers: list[subprocess.Popen] = []
    try:
        yield pg, work, servers
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(30)
        from phalanx.store import postgres as engine

        engine.dispose_all()
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--submits", type=int, default=20)
    parser.add_argument("--ps-clients", type=int, default=10)
    parser.add_argument("--procs", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with team(DURABLE, "phx-load-") as (pg, work, servers):
        env, store = server_env(work, pg)
        tokens = add_users(env, store, max(1, (args.clients + 9) // 10))
        os.environ["PGPASSWORD"] = pg.password  # the audit's own connection
        proc, url = start_server(env, store, work, work / "server.err")
        servers.append(proc)
        result = load(url, tokens, work, args.clients, args.submits, args.ps_clients, args.procs)
        left = wait_ended(store, 600)
        counts = audit(store, result["ids"])
        errors: dict[str, int] = {}
        for kind in result["errors"]:
            errors[kind] = errors.get(kind, 0) + 1
        report = {"clients": args.clients, "submits_each": args.submits, "ps_clients": args.ps_clients,
                  "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
                  "submit": summary(result["submit"]), "ps": summary(result["ps"]),
                  "submits_per_s": len(result["submit"]) / result["seconds"], "ps_per_s": len(result["ps"]) / result["seconds"],
                  "seconds": result["seconds"], **counts, "not_ended_after_10min": left, "errors": errors}
        print(json.dumps(report, indent=2))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
