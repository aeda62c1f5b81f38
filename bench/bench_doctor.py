"""`phalanx doctor` on two local nodes: how long the whole check takes, against the same probe
started by hand with torchrun (what a user would type to run a check script on two nodes).

Variants, interleaved round by round:

- `phalanx doctor -n 2x1 --burn B`: the command as a user types it, to its verdict (the check as a
  job: plan, supervisor, two node agents, the probe on each node, the links, the table); its
  Python processes start from the warm pool (torch imported), as every local job's do by default;
- the same with `--cold`: every process starts cold and imports torch itself, as the hand-typed
  torchrun's do;
- by hand: two `python -m torch.distributed.run --nnodes 2 --node-rank N --rdzv-backend c10d
  --rdzv-endpoint 127.0.0.1:PORT ... -m phalanx.health.doctor_probe --burn B` on loopback, started
  together, to both exiting (no job record, no verdict, no table: the probe's raw lines).

Also printed: the seconds the probe itself reported (its checks, from its start: the import of torch
included), the doctor's own overhead (doctor - by hand), and the verdict (healthy or not).

    .venv/bin/python bench/bench_doctor.py [--repeats 5] [--burn 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TAG = "PHALANX_DOCTOR_NODE "


def run_doctor(tmp: Path, burn: float, cold: bool = False) -> tuple[float, float | None, bool]:
    env = {**os.environ, "PHALANX_HOME": str(tmp / "home"), "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "phalanx", "doctor", "-n", "2x1", "--burn", str(burn), "--json",
                           *(["--cold"] if cold else [])], env=env, cwd=tmp, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - started
    found = json.loads(proc.stdout)
    probe = max((n.get("seconds") or 0.0) for n in found["nodes"]) if found["nodes"] else None
    return took, probe, bool(found["healthy"])


def run_by_hand(tmp: Path, burn: float) -> tuple[float, float | None, bool]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [[sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={n}",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=doctor",
             f"--rdzv-conf=is_host={str(n == 0).lower()}", "--local-addr=127.0.0.1", "--monitor-interval=0.1",
             "-m", "phalanx.health.doctor_probe", "--burn", str(burn)] for n in (0, 1)]
    started = time.perf_counter()
    procs = [subprocess.Popen(a, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for a in argv]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    took = time.perf_counter() - started
    reports = [json.loads(line[len(TAG):]) for out in outs for line in out.splitlines() if line.startswith(TAG)]
    probe = max((r.get("seconds") or 0.0) for r in reports) if reports else None
    return took, probe, all(p.returncode == 0 for p in procs) and len(reports) == 2


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--burn", type=float, default=2.0)
    args = parser.parse_args()
    variants = {"phalanx doctor -n 2x1": run_doctor,
                "phalanx doctor -n 2x1 --cold": lambda tmp, burn: run_doctor(tmp, burn, cold=True),
                "probe under torchrun by hand (2 nodes)": run_by_hand}
    results: dict[str, list[tuple[float, float | None, bool]]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            with tempfile.TemporaryDirectory() as tmp:
                results[name].append(fn(Path(tmp), args.burn))
    print(f"2 local nodes, --burn {args.burn:g}; seconds from the command to its end, {args.repeats} rounds")
    print(f"{'variant':<42} {'median':>8} {'min':>8} {'max':>8} {'probe':>8}  ok")
    medians = {}
    for name, rows in results.items():
        times = [t for t, _, _ in rows]
        probes = [p for _, p, _ in rows if p is not None]
        medians[name] = statistics.median(times)
        print(f"{name:<42} {medians[name]:8.2f} {min(times):8.2f} {max(times):8.2f} "
              f"{statistics.median(probes) if probes else float('nan'):8.2f}  {sum(ok for _, _, ok in rows)}/{len(rows)}")
    hand = "probe under torchrun by hand (2 nodes)"
    for name in ("phalanx doctor -n 2x1", "phalanx doctor -n 2x1 --cold"):
        paired = [a[0] / b[0] for a, b in zip(results[name], results[hand])]
        mine, theirs = medians[name], medians[hand]
        print(f"ratio {name} / by hand: {mine / theirs:.2f} (median of {len(paired)} rounds' ratios "
              f"{statistics.median(paired):.2f}); difference {mine - theirs:+.2f}s")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"(total {time.time() - t0:.0f}s)")
