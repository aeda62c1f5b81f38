"""Recovery latency: from a worker's SIGKILL to the restarted training's ranks running and talking.

Compares, in one run and interleaved, a phalanx job-level retry (`phalanx run -n 2 --max-retries 1`:
the supervisor decides, the kept node agent runs a new attempt with a fresh rendezvous) with
torchrun's in-place restart (`torchrun --standalone --nproc-per-node 2 --max-restarts 1`), with and
without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1. Measured, from the death (the dying rank writes
the time first):

- first line: every rank of the new attempt runs the script's first statement;
- first collective: every rank of the new attempt has finished its first all_reduce;

and where the time goes (medians, seconds after the death): the failed attempt handled (every node's
workers stopped and, for phalanx, the supervisor's decision), the new rendezvous begun, the workers
being started. phalanx's steps come from its PHALANX_TRACE file, torchrun's from its INFO log.
`--before SRC` adds phalanx from another checkout's `src` directory (PYTHONPATH), e.g. the code
before kept agents, measured in the same rounds. `--nodes 2`: two local nodes of one rank each
(`phalanx -n 2x1` against one torchrun per node, c10d on loopback).

    .venv/bin/python bench/bench_recovery.py [--repeats 5] [--before /tmp/before/src] [--nodes 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "recovery_train.py")
TIMEOUT = 120
RANKS = 2
STEPS = ("handled", "rendezvous", "start workers", "first line", "first collective")


@dataclass
class Sample:
    """Seconds after the death at which each step was reached (None: not measured)."""

    at: dict[str, float | None] = field(default_factory=dict)


def _times(text: str, kind: str, after: float = 0.0) -> list[float]:
    # Not anchored at line starts: torchrun's workers share one stdout and write unbuffered (-u), so
    # one rank's newline may come after the other's line.
    return [t for t in map(float, re.findall(rf"{kind} t=([0-9]+\.[0-9]+)", text)) if t > after]


def run_phalanx(tmp: Path, env: dict[str, str], src: str | None = None, nodes: int = 1) -> Sample | None:
    marker, home = tmp / "died", tmp / "home"
    env = {**env, "PHALANX_HOME": str(home), "PHALANX_TRACE": "1"}
    if src:
        env["PYTHONPATH"] = src
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx", "run", "-n", str(RANKS) if nodes == 1 else f"{nodes}x{RANKS // nodes}",
         "--max-retries", "1", SCRIPT, "--marker", str(marker)],
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )
    if proc.returncode != 0 or not marker.exists():
        _not_recovered("phalanx", f"exit {proc.returncode}", proc.stderr)
        return None
    death = float(marker.read_text())
    (job,) = home.glob("jobs/*")
    logs = [(job / "attempt_1" / f"rank_{r}" / "output.log").read_text() for r in range(RANKS)]
    firsts = [_times(log, "first") for log in logs]
    collectives = [_times(log, "collective") for log in logs]
    if not all(firsts) or not all(collectives):
        _not_recovered("phalanx", "a rank of the retry printed no first line or collective", "\n".join(logs))
        return None
    trace = [json.loads(line) for line in (job / "trace.jsonl").read_text().splitlines()] if (job / "trace.jsonl").exists() else []

    def step(who: str, name: str, attempt: int) -> float | None:
        times = [e["t"] for e in trace if e["who"] == who and e["step"] == name and e["attempt"] == attempt]
        return max(times) - death if times else None

    handled = step("supervisor", "attempt over", 0)
    if handled is None:  # a phalanx without the trace: the failed attempt's node reports
        ends = [json.loads(p.read_text()).get("finished") for p in job.glob("attempt_0/node_*/result.json")]
        handled = max(ends) - death if ends and all(ends) else None
    return Sample({"handled": handled, "rendezvous": step("agent", "rendezvous", 1),
                   "start workers": step("agent", "start workers", 1),
                   "first line": max(f[0] for f in firsts) - death,
                   "first collective": max(c[0] for c in collectives) - death})


def _not_recovered(variant: str, why: str, output: str) -> None:
    """Say on stderr why a round did not count (the table only counts it)."""
    tail = "\n    ".join(output.strip().splitlines()[-6:])
    print(f"round not recovered ({variant}): {why}\n    {tail}", file=sys.stderr, flush=True)


_LOG = re.compile(r"^I(\d{4}) (\d\d:\d\d:\d\d\.\d+) \d+ \S+\] (.*)$", re.M)


def _torch_log(stderr: str, message: str, after: float) -> float | None:
    """When torch's INFO log said ``message`` first after ``after`` (its lines carry local time)."""
    year = dt.date.today().year
    for day, clock, text in _LOG.findall(stderr):
        if text.startswith(message):
            stamp = dt.datetime.strptime(f"{year}{day} {clock}", "%Y%m%d %H:%M:%S.%f").timestamp()
            if stamp >= after - 0.001:  # torch prints milliseconds
                return stamp
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _torchruns(nodes: int, marker: Path) -> list[list[str]]:
    """What a user types: one torchrun (``--standalone``), or one per node on loopback with an explicit
    host (as ``docs/restarts.md`` measured, and as phalanx runs local nodes)."""
    common = ["--max-restarts", "1", "--monitor-interval", "0.1"]
    tail = [SCRIPT, "--marker", str(marker)]
    run = [sys.executable, "-m", "torch.distributed.run"]
    if nodes == 1:
        return [[*run, "--standalone", "--nproc-per-node", str(RANKS), *common, *tail]]
    port = _free_port()
    return [[*run, f"--nnodes={nodes}", f"--nproc-per-node={RANKS // nodes}", f"--node-rank={n}", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=bench", f"--rdzv-conf=is_host={str(n == 0).lower()}",
             "--local-addr=127.0.0.1", *common, *tail] for n in range(nodes)]


def run_torchrun(tmp: Path, env: dict[str, str], nodes: int = 1) -> Sample | None:
    marker = tmp / "died"
    procs = [subprocess.Popen(argv, env={**env, "LOGLEVEL": "INFO"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for argv in _torchruns(nodes, marker)]
    outs: list[tuple[str, str]] = []
    deadline = time.monotonic() + TIMEOUT
    for proc in procs:
        try:
            outs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            # Hung after the restart (the failure mode of the shared store). SIGTERM lets torchrun stop
            # its workers, which run in sessions of their own and would outlive a SIGKILL of torchrun.
            for other in procs:
                other.terminate()
            for other in procs:
                try:
                    other.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    other.kill()
                    other.communicate()
            _not_recovered("torchrun", f"no end within {TIMEOUT}s after the restart", "")
            return None
    if any(p.returncode != 0 for p in procs) or not marker.exists():
        _not_recovered("torchrun", f"exit {[p.returncode for p in procs]}", "".join(err for _, err in outs))
        return None
    death = float(marker.read_text())
    stdout = "".join(out for out, _ in outs)
    firsts, collectives = _times(stdout, "first", death), _times(stdout, "collective", death)
    if len(firsts) != RANKS or len(collectives) != RANKS:
        _not_recovered("torchrun", "a rank printed no first line or collective after the death", stdout)
        return None

    def logged(message: str) -> float | None:  # the last node to get there
        stamps = [_torch_log(err, message, death) for _, err in outs]
        return None if None in stamps else max(s for s in stamps if s is not None) - death

    rendezvous = logged("[default] Rendezvous'ing worker group")
    return Sample({"handled": rendezvous, "rendezvous": rendezvous, "start workers": logged("[default] Starting worker group"),
                   "first line": max(firsts) - death, "first collective": max(collectives) - death})


def _median(samples: list[Sample], key: str) -> float | None:
    values = [s.at[key] for s in samples if s.at.get(key) is not None]
    return statistics.median(values) if values else None  # type: ignore[type-var]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", metavar="SRC", help="another checkout's src directory, measured too")
    parser.add_argument("--nodes", type=int, choices=(1, 2), default=1,
                        help="2: two local nodes of one rank each (phalanx -n 2x1; one torchrun per node)")
    args = parser.parse_args()
    nodes = args.nodes
    base = {**os.environ, "OMP_NUM_THREADS": "1"}
    base.pop("PYTHONPATH", None)
    ours = "phalanx --max-retries 1 (kept agent)"
    variants = {ours: lambda tmp: run_phalanx(tmp, base, nodes=nodes)}
    if args.before:
        variants["phalanx --max-retries 1 (--before)"] = lambda tmp: run_phalanx(tmp, base, args.before, nodes)
    if nodes == 1:  # two nodes sharing the store hang past any timeout (docs/restarts.md: 0/10)
        variants["torchrun --max-restarts 1"] = lambda tmp: run_torchrun(tmp, base, nodes)
    variants["torchrun --max-restarts 1, DISABLE_SHARE_RDZV_TCP_STORE"] = lambda tmp: run_torchrun(
        tmp, {**base, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}, nodes)
    results: dict[str, list[Sample | None]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            with tempfile.TemporaryDirectory() as tmp:
                results[name].append(fn(Path(tmp)))
    print(f"{nodes} node(s), {RANKS} ranks; median seconds after the death at which each step was reached "
          "(every node / every rank)")
    print(f"{'variant':<58} {'recovered':>9} " + " ".join(f"{s:>16}" for s in STEPS))
    for name, samples in results.items():
        good = [s for s in samples if s is not None]
        cells = []
        for key in STEPS:
            value = _median(good, key)
            cells.append(f"{'-':>16}" if value is None else f"{value:16.3f}")
        print(f"{name:<58} {len(good):>5}/{len(samples):<3} " + " ".join(cells))
    print("spread (min .. max seconds):")
    for name, samples in results.items():
        good = [s for s in samples if s is not None]
        spread = [f"{key} {min(s.at[key] for s in good):.3f} .. {max(s.at[key] for s in good):.3f}"  # type: ignore[type-var]
                  for key in ("first line", "first collective")] if good else []
        print(f"  {name:<58} " + "; ".join(spread))
    mine = [s for s in results[ours] if s is not None]
    for name in variants:
        if name == ours:
            continue
        other = [s for s in results[name] if s is not None]
        for key in ("first line", "first collective"):
            a, b = _median(mine, key), _median(other, key)
            # Paired by round (the machine's load drifts): the median of the rounds' own ratios.
            pairs = [m.at[key] / o.at[key] for m, o in zip(results[ours], results[name])  # type: ignore[operator]
                     if m is not None and o is not None and o.at[key]]
            paired = f", median of {len(pairs)} rounds' ratios {statistics.median(pairs):.2f}" if pairs else ""
            if a is not None and b:
                print(f"ratio {key:<16} phalanx (kept agent) / [{name}]: {a / b:.2f}{paired}")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"(total {time.time() - t0:.0f}s)")
