"""Teams (issue 27): how long the queue takes to give a freed GPU to the next job, and what the
role check costs ``ps``.

    .venv/bin/python bench/bench_teams.py [--queued 1,1000,10000] [--size 100000] [--repeats 9]
        [--dir /tmp/phalanx-bench-teams]

Queue: a project with an 8-GPU quota, 8 one-GPU jobs running (their supervisor is this process,
alive, so nothing is reconciled) and N one-GPU jobs queued at mixed priorities. One running job
ends (its row set SUCCEEDED, untimed), then ``admission.advance`` is timed: the decision that
admits the next job in priority-then-submission order (what a job's supervisor runs as its job
ends, and the server's housekeeping runs every few seconds). The admitted job then holds the GPU,
and the next round frees another; the ended job
is queued again (untimed), so the queue keeps its length. Goal: < 1 s at 1,000 queued.

Roles: ``--size`` jobs in 10 projects; ``LocalFace.ps`` (the face's view, the rows consumed as
``ps`` prints them) as a server admin (no role check: every project) against a member of all 10
projects (the role check: the same rows, through the projects filter) and a member of 1 project
(a tenth of them), interleaved, medians. Ratio = member of all / admin. Goal: <= 1.1x.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

PROJECTS = [f"team{i}" for i in range(10)]


def new_store(home: Path):  # type: ignore[no-untyped-def]
    from phalanx.store import Store

    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    return Store(home / "phalanx.db")


def queue_round(home: Path, queued: int, repeats: int) -> list[float]:
    """The seconds ``advance`` took to admit the next job, one per freed GPU."""
    import psutil

    from bench_store import rows
    from phalanx.supervise import admission

    store = new_store(home)
    me = psutil.Process()
    jobs, _ = rows(8 + queued, home)
    now = time.time()
    for i, job in enumerate(jobs):
        job.update(sweep_id=None, trial=None, ended_at=None, exit_code=None, created_at=now - len(jobs) + i)
    store.insert_jobs(jobs)
    c = store._conn
    c.execute("BEGIN")
    c.execute("INSERT INTO projects (name, created_at, max_gpus) VALUES ('vision', ?, 8)", (now,))
    c.execute("UPDATE jobs SET project = 'vision', gpus = 1, supervisor_pid = ?, supervisor_started = ?",
              (me.pid, me.create_time()))
    ids = [j["id"] for j in jobs]
    c.executemany("UPDATE jobs SET state = 'RUNNING', admitted_at = ? WHERE id = ?", [(now, i) for i in ids[:8]])
    c.executemany("UPDATE jobs SET state = 'QUEUED', admitted_at = NULL, started_at = NULL, priority = ? WHERE id = ?",
                  [(i % 3, job_id) for i, job_id in enumerate(ids[8:])])
    c.execute("COMMIT")
    running = list(ids[:8])
    took = []
    for _ in range(repeats):
        freed = running.pop(0)
        c.execute("UPDATE jobs SET state = 'SUCCEEDED', ended_at = ?, exit_code = 0 WHERE id = ?", (time.time(), freed))
        began = time.perf_counter()
        admitted = admission.advance(store, ["vision"])
        took.append(time.perf_counter() - began)
        assert len(admitted) == 1, admitted  # exactly the freed GPU's worth
        first = c.execute("SELECT id FROM jobs WHERE state = 'QUEUED' AND admitted_at IS NULL "
                          "ORDER BY priority DESC, created_at, id LIMIT 1").fetchone()
        assert first is None or first[0] != admitted[0]
        running.append(admitted[0])
        # the queue keeps its length: the ended job comes back as the newest queued one (untimed)
        c.execute("UPDATE jobs SET state = 'QUEUED', admitted_at = NULL, ended_at = NULL, exit_code = NULL, "
                  "created_at = ? WHERE id = ?", (time.time(), freed))
    return took


def role_rounds(home: Path, size: int, repeats: int) -> dict[str, list[float]]:
    from bench_store import rows
    from phalanx.api.face import LocalFace
    from phalanx.api.ps import PsRequest
    from phalanx.core.identity import Principal

    if not (home / "filled.json").exists():
        store = new_store(home)
        jobs, sweeps = rows(size, home)
        for i, job in enumerate(jobs):
            job.update(sweep_id=None, trial=None)
            if job["state"] == "RUNNING":
                job.update(state="SUCCEEDED", ended_at=job["started_at"] + 4, exit_code=0)
        store.insert_jobs(jobs)
        c = store._conn
        c.execute("BEGIN")
        c.executemany("INSERT INTO projects (name, created_at) VALUES (?, ?)", [(p, time.time()) for p in PROJECTS])
        c.executemany("UPDATE jobs SET project = ? WHERE id = ?",
                      [(PROJECTS[i % len(PROJECTS)], j["id"]) for i, j in enumerate(jobs)])
        c.execute("COMMIT")
        (home / "filled.json").write_text(json.dumps({"jobs": size}))
    os.environ["PHALANX_HOME"] = str(home)
    faces = {"admin (no role check)": LocalFace(Principal(user="root", admin=True)),
             "member of all 10": LocalFace(Principal(user="bob", projects={p: "member" for p in PROJECTS})),
             "member of 1": LocalFace(Principal(user="bob", projects={PROJECTS[3]: "member"}))}
    requests = {"ps --all": PsRequest(all=True), "ps --all --limit 10000": PsRequest(all=True, limit=10_000),
                "ps --state failed": PsRequest(states=("failed",))}
    out: dict[str, list[float]] = {f"{r} / {f}": [] for r in requests for f in faces}
    for round_ in range(repeats + 1):  # the first round warms the caches and is not counted
        for r, request in requests.items():
            for f, face in faces.items():
                began = time.perf_counter()
                n = sum(1 for _ in face.ps(request).rows)
                took = time.perf_counter() - began
                if round_:
                    out[f"{r} / {f}"].append(took)
                assert n > 0, (r, f)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queued", default="1,1000,10000")
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "phalanx-bench-teams"))
    args = parser.parse_args()
    work = Path(args.dir)
    print("## queue decision: a freed GPU given to the next job (admission.advance)")
    print("| queued | median | max |\n|---|---|---|")
    for n in (int(x) for x in args.queued.split(",")):
        took = queue_round(work / f"queue-{n}", n, args.repeats)
        print(f"| {n:,} | {statistics.median(took) * 1000:.1f} ms | {max(took) * 1000:.1f} ms |", flush=True)
    if not args.size:
        return
    print(f"\n## role check on ps at {args.size:,} jobs (LocalFace.ps, rows consumed)")
    times = role_rounds(work / f"roles-{args.size}", args.size, args.repeats)
    print("| listing | who | median | ratio to admin |\n|---|---|---|---|")
    for key, values in times.items():
        listing, who = key.split(" / ")
        base = statistics.median(times[f"{listing} / admin (no role check)"])
        print(f"| {listing} | {who} | {statistics.median(values) * 1000:.1f} ms | "
              f"{statistics.median(values) / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
