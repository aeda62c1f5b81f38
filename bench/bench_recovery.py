"""Recovery latency: from a worker's SIGKILL to the first step of the restarted training.

Compares, in one run and interleaved, a phalanx job-level retry (`phalanx run --max-retries 1`:
the whole job is rerun, fresh rendezvous) with torchrun's in-place restart
(`torchrun --max-restarts 1`), with and without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1.

    .venv/bin/python bench/bench_recovery.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "recovery_train.py")
BIN = Path(sys.executable).parent
TIMEOUT = 60


def _restart_first_step(text: str) -> float | None:
    """Wall time of the restarted training's first step: the last `step=1` line."""
    times = re.findall(r"^step=1 t=([0-9.]+)", text, flags=re.M)
    return float(times[-1]) if times else None


def run_phalanx(tmp: Path, env: dict[str, str]) -> float | None:
    marker = tmp / "died"
    home = tmp / "home"
    proc = subprocess.run(
        [str(BIN / "phalanx"), "run", "-n", "2", "--max-retries", "1", SCRIPT, "--marker", str(marker)],
        env={**env, "PHALANX_HOME": str(home)}, capture_output=True, text=True, timeout=TIMEOUT,
    )
    if proc.returncode != 0 or not marker.exists():
        return None
    death = float(marker.read_text())
    logs = "".join(p.read_text() for p in home.glob("jobs/*/attempt_1/rank_0/output.log"))
    first = _restart_first_step(logs)
    return None if first is None else first - death


def run_torchrun(tmp: Path, env: dict[str, str]) -> float | None:
    marker = tmp / "died"
    proc = subprocess.Popen(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
         "--monitor-interval", "0.1", SCRIPT, "--marker", str(marker)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        stdout, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        # Hung after the restart (the failure mode measured here). SIGTERM lets torchrun stop its
        # workers, which run in sessions of their own and would outlive a SIGKILL of torchrun.
        proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        return None
    if proc.returncode != 0 or not marker.exists():
        return None
    first = _restart_first_step(stdout)
    if first is None or stdout.count("step=1 ") < 2:
        return None
    return first - float(marker.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    base = {**os.environ, "OMP_NUM_THREADS": "1"}
    variants = {
        "phalanx --max-retries 1 (job-level)": (run_phalanx, base),
        "torchrun --max-restarts 1": (run_torchrun, base),
        "torchrun --max-restarts 1 + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1": (
            run_torchrun, {**base, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}),
    }
    results: dict[str, list[float | None]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, (fn, env) in variants.items():
            with tempfile.TemporaryDirectory() as tmp:
                results[name].append(fn(Path(tmp), env))
    print(f"{'variant':<66} {'recovered':>9} {'median s':>9} {'min s':>7}")
    for name, samples in results.items():
        good = [s for s in samples if s is not None]
        med = f"{statistics.median(good):9.2f}" if good else f"{'-':>9}"
        low = f"{min(good):7.2f}" if good else f"{'-':>7}"
        print(f"{name:<66} {len(good):>5}/{len(samples):<3} {med} {low}")
    ph = [s for s in results["phalanx --max-retries 1 (job-level)"] if s is not None]
    for name in list(variants)[1:]:
        good = [s for s in results[name] if s is not None]
        if ph and good:
            print(f"ratio phalanx / [{name}]: {statistics.median(ph) / statistics.median(good):.2f}")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"(total {time.time() - t0:.0f}s)")
