"""2 nodes over SSH: time from the command to every rank's first line.

phalanx (`phalanx run --backend ssh --hosts node1,node2 -n 2x1`, preflight and code shipping
included) vs what a user types by hand: one `ssh HOST torchrun --nnodes 2 --node-rank N ...`
per node, started in parallel. Real sshd "hosts" on 127.0.0.2/3 are started for the run.

    .venv/bin/python bench/bench_ssh.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.cluster import sshd  # noqa: E402

SCRIPT = str(ROOT / "bench" / "first_line.py")
PY = sys.executable
TORCHRUN = str(Path(PY).parent / "torchrun")


def _last_first_line(text: str) -> float:
    times = [float(t) for t in re.findall(r"first rank=\d+ t=([0-9.]+)", text)]
    assert len(times) == 2, text
    return max(times)


def run_phalanx(hosts: sshd.SshHosts, tmp: Path) -> float:
    env = {**os.environ, "PHALANX_HOME": str(tmp / "home"), "OMP_NUM_THREADS": "1"}
    start = time.time()
    out = subprocess.run(
        [str(Path(PY).parent / "phalanx"), "run", "--backend", "ssh", "--ssh-config", str(hosts.config),
         "--hosts", "node1,node2", "--remote-home", str(tmp / "remote"), "-n", "2x1", SCRIPT],
        env=env, capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    return _last_first_line(out.stdout) - start


def hand_commands(hosts: sshd.SshHosts, target: str, env: str = "") -> list[tuple[str, str]]:
    """What a user types by hand, per host: ``cd ROOT && [env] torchrun --node-rank N ... target``,
    the first host holding the rendezvous on a free port. (host, remote command) pairs."""
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    return [
        (name, f"cd {shlex.quote(str(ROOT))} && {env}OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo {TORCHRUN} --nnodes 2 "
               f"--nproc-per-node 1 --node-rank {rank} --rdzv-backend c10d --rdzv-endpoint 127.0.0.2:{port} "
               f"--rdzv-id hand{port} --rdzv-conf is_host={'true' if rank == 0 else 'false'} --local-addr {addr} {target}")
        for rank, (name, addr) in enumerate(zip(hosts.names, hosts.addrs))
    ]


def run_by_hand(hosts: sshd.SshHosts) -> float:
    procs = []
    start = time.time()
    for name, cmd in hand_commands(hosts, SCRIPT):
        procs.append(subprocess.Popen(["ssh", "-F", str(hosts.config), name, cmd], stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    return _last_first_line("".join(outs)) - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hosts = sshd.start(Path(tmp) / "sshd")
        try:
            results: dict[str, list[float]] = {"phalanx --backend ssh": [], "ssh host torchrun ... (by hand, parallel)": []}
            for i in range(args.repeats + 1):  # the first round warms caches and is dropped
                with tempfile.TemporaryDirectory() as run_tmp:
                    a = run_phalanx(hosts, Path(run_tmp))
                b = run_by_hand(hosts)
                if i:
                    results["phalanx --backend ssh"].append(a)
                    results["ssh host torchrun ... (by hand, parallel)"].append(b)
        finally:
            sshd.stop(hosts)
    print(f"{'variant':<46} {'median s':>9} {'min s':>7}")
    for name, samples in results.items():
        print(f"{name:<46} {statistics.median(samples):9.2f} {min(samples):7.2f}")
    ph, hand = (statistics.median(v) for v in results.values())
    print(f"ratio phalanx / by hand (median): {ph / hand:.2f}")


if __name__ == "__main__":
    main()
