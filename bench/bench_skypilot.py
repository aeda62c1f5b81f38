"""SkyPilot: what phalanx adds before a launch, against SkyPilot's own CLI, on the real skypilot
0.14.1 (.venv-sky) and a real local API server (tests/backends/skypilot/realsky.py: a namespace
with only loopback, a temporary HOME). No cloud can be enabled here, so both end at the same
point, SkyPilot's "no cloud" answer to a dry run of the same task:

- phalanx: `phalanx run --backend skypilot --cpus 2+ -n 2x1 train.py` (options, plan, SkyPilot
  reading the task, `sky.launch(..., dryrun=True)`, the one-line error);
- by hand: `sky launch --dryrun -y task.yaml` with the task phalanx's `--dry-run` prints (less
  its workdir, which phalanx's check leaves out too);
- floor: `python -c pass` in the same environment.

Round-robin, wall clock and CPU seconds (the command and its children; the API server's own work
is the same for both and not counted). Needs root. `.venv/bin/python bench/bench_skypilot.py [--repeats 5]`
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.backends.skypilot import realsky, skyenv  # noqa: E402


def timed(server: realsky.SkyServer, argv: list[str], cwd: Path) -> tuple[float, float, int]:
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = server.run(argv, cwd=cwd, timeout=300)
    wall = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime), result.returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    python = skyenv.ensure()
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-sky-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        (work / "train.py").write_text("print('hello')\n")
        server = realsky.SkyServer(python, Path(tmp) / "home")
        try:
            plan = server.run([str(python), "-m", "phalanx", "run", "--dry-run", "--backend", "skypilot", "--cpus", "2+", "-n", "2x1", "train.py"], cwd=work)
            task = plan.stdout[plan.stdout.index("# SkyPilot task"):]
            task = task[:task.index("\n\n")] if "\n\n" in task else task
            # phalanx's dry run leaves the workdir out too (start fills it); the rest is the same task
            (work / "task.yaml").write_text("\n".join(line for line in task.splitlines() if not line.startswith("workdir:")) + "\n")
            sky = str(Path(python).parent / "sky")
            commands = {
                "phalanx run --backend skypilot": [str(python), "-m", "phalanx", "run", "--backend", "skypilot", "--cpus", "2+", "-n", "2x1", "train.py"],
                "sky launch --dryrun": [sky, "launch", "--dryrun", "-y", "-c", "phx-bench", "task.yaml"],
                "python -c pass": [str(python), "-c", "pass"],
            }
            samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in commands}
            for name, argv in commands.items():  # warm-up
                timed(server, argv, work)
            for _ in range(args.repeats):
                for name, argv in commands.items():
                    samples[name].append(timed(server, argv, work))
        finally:
            server.stop()
    base = statistics.median(w for w, _, _ in samples["sky launch --dryrun"])
    base_cpu = statistics.median(c for _, c, _ in samples["sky launch --dryrun"])
    print(f"{'command':34} {'median s':>9} {'min s':>7} {'ratio':>6} {'cpu s':>6} {'cpu ratio':>9}  exit codes")
    for name, rows in samples.items():
        wall = statistics.median(w for w, _, _ in rows)
        cpu = statistics.median(c for _, c, _ in rows)
        print(f"{name:34} {wall:9.2f} {min(w for w, _, _ in rows):7.2f} {wall / base:6.2f} {cpu:6.2f} {cpu / base_cpu:9.2f}  "
              f"{sorted({code for _, _, code in rows})}")


if __name__ == "__main__":
    main()
