"""What ``--track mlflow`` costs a job, and how soon a printed metric is readable in MLflow.

    .venv/bin/python bench/bench_track.py [--lines 1000000] [--repeats 3] [--mode overhead,latency] [--json OUT]

overhead  A script printing N metric lines (``step I loss=X``), run by ``phalanx run`` with no
          tracker and with ``--track mlflow`` (a real ``mlflow server``, SQLite, on loopback,
          started here), alternating, after a warm-up. Per run: the command's wall time (the job's
          start to its end), the supervisor's own CPU seconds (the ``phalanx run`` process: it is
          the supervisor of a foreground job) and, with tracking, the exporter's CPU seconds and
          how long after the job's end MLflow held every point. Goals: wall <= 1.05x, the
          supervisor's CPU <= 1% of a core more.
latency   A script printing one metric line every 0.1 s whose value is the time it was printed;
          MLflow's REST API is polled every 20 ms and each step's delay (first seen in MLflow -
          printed) recorded. Goal: p95 <= 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.cluster.mlflow_server import MlflowServer  # noqa: E402

PHALANX = str(Path(sys.executable).parent / "phalanx")
PRINTER = """import sys
n = int(sys.argv[1])
out = sys.stdout
for i in range(n):
    out.write(f"step {i} loss={1.0 / (i + 1):.6f}\\n")
"""
TICKER = """import sys, time
for i in range(int(sys.argv[1])):
    print(f"step {i} printed_at={time.time():.6f}", flush=True)
    time.sleep(0.1)
"""


def _cpu_of(pid: int) -> float:
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
        return float(t.user + t.system)
    except psutil.Error:
        return -1.0


def _run(home: Path, script: Path, opts: list[str], script_args: list[str], env: dict[str, str]) -> dict[str, float]:
    """``phalanx run``: its wall time and its own CPU seconds (sampled until it exits)."""
    began, began_at = time.monotonic(), time.time()
    proc = subprocess.Popen([PHALANX, "run", "--cold", "-q", *opts, str(script), *script_args], cwd=script.parent,
                            env={**os.environ, "PHALANX_HOME": str(home), "PHALANX_TRACE": "1", **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cpu = 0.0
    while proc.poll() is None:
        seen = _cpu_of(proc.pid)
        cpu = seen if seen >= 0 else cpu
        time.sleep(0.05)
    wall, ended_at = time.monotonic() - began, time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"phalanx run failed: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
    # the supervisor's "started" mark (PHALANX_TRACE): the attempt's processes started then
    job = max((home / "jobs").iterdir(), key=lambda p: p.stat().st_mtime)
    marks = [json.loads(line) for line in (job / "trace.jsonl").read_text().splitlines()]
    started = next(m["t"] for m in marks if m.get("who") == "supervisor" and m.get("step") == "started")
    return {"wall": wall, "supervisor_cpu": cpu, "to_start": started - began_at, "from_start": ended_at - started}


def _state(home: Path) -> tuple[Path, dict[str, object]]:
    job = max((home / "jobs").iterdir(), key=lambda p: p.stat().st_mtime)
    path = job / "track" / "mlflow.json"
    return job, (json.loads(path.read_text()) if path.exists() else {})


def _drain(home: Path, ended: float, timeout: float) -> dict[str, float]:
    """After the job's end: seconds until the exporter closed the run (every point in MLflow), or
    ``timeout``; the points sent by then, and the exporter's CPU seconds (sampled while it lives).
    An exporter still sending then is stopped (it is this benchmark's), so that it does not load
    the server during the next run."""
    cpu, state = 0.0, {}
    while True:
        _job, state = _state(home)
        pid = state.get("pid")
        if isinstance(pid, int):
            cpu = max(cpu, _cpu_of(pid))
        waited = time.monotonic() - ended
        if state.get("finished") and not state.get("waiting"):
            return {"drain_after_end": waited, "exporter_cpu": cpu, "points_sent": float(state.get("sent") or 0),
                    "drained": 1.0}
        if waited > timeout:
            if isinstance(pid, int):
                os.kill(pid, 15)
            return {"drain_after_end": waited, "exporter_cpu": cpu, "points_sent": float(state.get("sent") or 0),
                    "drained": 0.0}
        time.sleep(0.1)


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def overhead(server: MlflowServer, lines: int, repeats: int, work: Path, drain: float) -> dict[str, object]:
    (work / "code").mkdir(exist_ok=True)
    script = work / "code" / "printer.py"
    script.write_text(PRINTER)
    env_on = {"MLFLOW_TRACKING_URI": server.uri, "MLFLOW_EXPERIMENT_NAME": "bench"}
    _run(work / "warm", script, [], ["1000"], {})  # warm-up: caches, interpreter files
    rows: dict[str, list[dict[str, float]]] = {"off": [], "mlflow": []}
    for i in range(repeats):
        for kind in ("off", "mlflow"):
            home = work / f"{kind}-{i}"
            row = _run(home, script, ["--track", "mlflow"] if kind == "mlflow" else [], [str(lines)],
                       env_on if kind == "mlflow" else {})
            if kind == "mlflow":
                row.update(_drain(home, time.monotonic(), drain))
                # MLflow's intake (points per second over the job and the drain): the tracker's pace
                row["points_per_s"] = row["points_sent"] / (row["wall"] + row["drain_after_end"])
            rows[kind].append(row)
            print(f"  {kind:<7} run {i}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    off_wall = statistics.median(r["wall"] for r in rows["off"])
    on_wall = statistics.median(r["wall"] for r in rows["mlflow"])
    off_cpu = statistics.median(r["supervisor_cpu"] for r in rows["off"])
    on_cpu = statistics.median(r["supervisor_cpu"] for r in rows["mlflow"])
    pairs = list(zip(rows["off"], rows["mlflow"]))
    return {
        "lines": lines, "repeats": repeats, "runs": rows,
        # round by round (each pair ran back to back, so shares the machine's load of the moment)
        "paired_wall_ratio": _stats([b["wall"] / a["wall"] for a, b in pairs]),
        "paired_supervisor_cpu_extra": _stats([b["supervisor_cpu"] - a["supervisor_cpu"] for a, b in pairs]),
        "to_start_off": _stats([r["to_start"] for r in rows["off"]]),
        "to_start_mlflow": _stats([r["to_start"] for r in rows["mlflow"]]),
        "from_start_ratio": statistics.median(r["from_start"] for r in rows["mlflow"])
        / statistics.median(r["from_start"] for r in rows["off"]),
        "wall_off": _stats([r["wall"] for r in rows["off"]]), "wall_mlflow": _stats([r["wall"] for r in rows["mlflow"]]),
        "wall_ratio": on_wall / off_wall,
        "supervisor_cpu_off": off_cpu, "supervisor_cpu_mlflow": on_cpu,
        # the supervisor's extra CPU as a share of one core over the job's wall time
        "supervisor_extra_core_share": (on_cpu - off_cpu) / on_wall,
        "exporter_cpu": _stats([r["exporter_cpu"] for r in rows["mlflow"]]),
        "drain_after_end": _stats([r["drain_after_end"] for r in rows["mlflow"]]),
        "mlflow_points_per_s": _stats([r["points_per_s"] for r in rows["mlflow"]]),
    }


def latency(server: MlflowServer, ticks: int, work: Path) -> dict[str, object]:
    (work / "code").mkdir(exist_ok=True)
    script = work / "code" / "ticker.py"
    script.write_text(TICKER)
    home = work / "latency"
    env = {**os.environ, "PHALANX_HOME": str(home), "MLFLOW_TRACKING_URI": server.uri,
           "MLFLOW_EXPERIMENT_NAME": "latency"}
    proc = subprocess.Popen([PHALANX, "run", "--cold", "-q", "--track", "mlflow", str(script), str(ticks)],
                            cwd=script.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: dict[int, float] = {}
    run_id = None
    while len(seen) < ticks:
        now = time.time()
        if run_id is None:
            try:
                run_id = _state(home)[1].get("run_id")
            except (OSError, ValueError):
                pass
        if run_id:
            for m in server.history(str(run_id), "printed_at"):
                if m["step"] not in seen:
                    seen[m["step"]] = now - m["value"]
        if proc.poll() is not None and len(seen) < ticks and _state(home)[1].get("finished"):
            break
        time.sleep(0.02)
    proc.wait()
    delays = sorted(seen.values())
    q = statistics.quantiles(delays, n=100)
    return {"ticks": ticks, "seen": len(seen), "p50": statistics.median(delays), "p95": q[94], "max": delays[-1]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ticks", type=int, default=150)
    parser.add_argument("--drain", type=float, default=60.0, help="seconds to wait after a job for MLflow to hold every point")
    parser.add_argument("--mode", default="overhead,latency")
    parser.add_argument("--server-nice", type=int, default=0,
                        help="run the MLflow server at this niceness (a server elsewhere takes none of the job's cores)")
    parser.add_argument("--json")
    args = parser.parse_args()
    modes = args.mode.split(",")
    result: dict[str, object] = {"machine": f"{platform.node()} {os.cpu_count()} cores", "python": sys.version.split()[0]}
    with tempfile.TemporaryDirectory(prefix="bench-track-") as tmp:
        work = Path(tmp)
        (work / "mlflow").mkdir()
        server = MlflowServer(work / "mlflow")
        server.start()
        if args.server_nice:
            import psutil

            for proc in [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]:
                proc.nice(args.server_nice)
        result["server_nice"] = args.server_nice
        try:
            if "latency" in modes:
                print("latency: a metric line every 0.1 s, MLflow polled every 20 ms", flush=True)
                result["latency"] = latency(server, args.ticks, work)
                print(json.dumps(result["latency"], indent=1), flush=True)
            if "overhead" in modes:
                print(f"overhead: {args.lines:,} metric lines, off vs --track mlflow, {args.repeats} rounds", flush=True)
                result["overhead"] = overhead(server, args.lines, args.repeats, work, args.drain)
                shown = {k: v for k, v in result["overhead"].items() if k != "runs"}  # type: ignore[union-attr]
                print(json.dumps(shown, indent=1), flush=True)
        finally:
            server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
