"""Kubernetes backend: the cost of the command, against what a user would do instead.

1. **First lines**: time from the command to every rank's first line on the user's terminal, for
   2 nodes x 1 process of ``bench/first_line.py`` (joins a gloo group, prints one line):
   - ``phalanx run --backend k8s -n 2x1`` against the FAKE API server of the tests, whose pods run as
     processes in network namespaces (``tests/kubernetes/podsim.py``: the image is python3 + torch,
     the code travels in the ConfigMap and is fetched by the init step, each pod's entry waits for
     node 0's name, mirrors its files back through its log);
   - by hand, in the same two namespaces with the same image: one
     ``python3 -m torch.distributed.run --nnodes 2 --node-rank N --rdzv-endpoint NODE0:29500 first_line.py``
     per namespace, started together (what ``kubectl exec`` into two running pods would do), output
     read from each process.
   No image pull, scheduling or kubelet latency is simulated: the ratio is phalanx's own overhead.
2. **Plans**: ``backend.plan`` in-process (2x8 and 64x8 nodes), and ``phalanx run --backend k8s
   --dry-run -n 4x8`` against ``phalanx run --dry-run -n 4x8`` (local) and ``python -c pass``.

Needs root (network and mount namespaces).

    .venv/bin/python bench/bench_k8s.py [--repeats 3] [--plan-repeats 5]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cluster import netns  # noqa: E402
from tests.kubernetes.fakecluster import Cluster  # noqa: E402
from tests.kubernetes.podsim import NetnsKubelet, make_image  # noqa: E402

BENCH = ROOT / "bench"
PY = sys.executable
FIRST = re.compile(rb"first rank=(\d+) t=")


def _watch(proc: subprocess.Popen, seen: dict[int, float]) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = FIRST.search(line)
            if match:
                seen.setdefault(int(match.group(1)), time.time())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def run_phalanx(cluster: Cluster, tmp: Path) -> float:
    cluster.reset()
    env = {**os.environ, "PHALANX_HOME": str(tmp / f"home-{time.monotonic_ns()}"), "OMP_NUM_THREADS": "1",
           "KUBECONFIG": str(cluster.api.kubeconfig(tmp / "kubeconfig"))}
    seen: dict[int, float] = {}
    start = time.time()
    proc = subprocess.Popen([PY, "-m", "phalanx", "run", "--backend", "k8s", "-n", "2x1", "first_line.py"], env=env,
                            cwd=BENCH, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    reader = _watch(proc, seen)
    assert proc.wait(300) == 0, "phalanx run failed"
    reader.join(10)
    assert len(seen) == 2, seen
    return max(seen.values()) - start


def run_by_hand(net: netns.Network, image_env: dict[str, str], tmp: Path) -> float:
    names = {f"hand-{i}": addr for i, addr in enumerate(net.node_addrs[:2])}
    for ns in net.node_namespaces[:2]:
        netns.set_hosts(net, ns, names)
    procs, seen, readers = [], {}, []
    start = time.time()
    for rank, ns in enumerate(net.node_namespaces[:2]):
        argv = ["python3", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{net.node_addrs[0]}:29500", "--rdzv-id", f"hand{start}",
                "--rdzv-conf", f"is_host={'true' if rank == 0 else 'false'}", str(BENCH / "first_line.py")]
        proc = subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                                 f"hand-{rank}", *argv], env={**image_env, "OMP_NUM_THREADS": "1"}, cwd=BENCH,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(proc)
        readers.append(_watch(proc, seen))
    for proc in procs:
        assert proc.wait(300) == 0, "torchrun failed"
    for reader in readers:
        reader.join(10)
    assert len(seen) == 2, seen
    return max(seen.values()) - start


def plan_times(repeats: int) -> dict[str, list[float]]:
    from phalanx.backends.registry import get_backend
    from phalanx.core.paths import HomePaths
    from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources

    backend = get_backend("k8s")
    out: dict[str, list[float]] = {}
    for nodes in (2, 64):
        spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/work/train.py"), Resources(nodes, 8), name="t", backend="k8s",
                       workdir="/work", snapshot=True)
        facts = backend.facts(spec)  # once: a plan is pure, the facts are asked of the world before it
        samples = []
        for _ in range(max(repeats * 4, 10)):
            started = time.perf_counter()
            backend.plan(spec, "3f2a9c1d", 0, HomePaths(Path("/tmp")), facts)
            samples.append(time.perf_counter() - started)
        out[f"plan {nodes}x8 (in-process)"] = samples
    home = tempfile.mkdtemp(prefix="phx-bench-k8s-plan-")
    env = {**os.environ, "PHALANX_HOME": home}
    commands = {
        "phalanx run --backend k8s --dry-run -n 4x8": [PY, "-m", "phalanx", "run", "--backend", "k8s", "--dry-run", "-n", "4x8",
                                                       "first_line.py"],
        "phalanx run --dry-run -n 4x8 (local)": [PY, "-m", "phalanx", "run", "--dry-run", "-n", "4x8", "first_line.py"],
        "python -c pass": [PY, "-c", "pass"],
    }
    for cmd in commands.values():  # warm up
        subprocess.run(cmd, env=env, cwd=BENCH, capture_output=True, check=True)
    for _ in range(repeats):
        for name, cmd in commands.items():
            started = time.perf_counter()
            subprocess.run(cmd, env=env, cwd=BENCH, capture_output=True, check=True)
            out.setdefault(name, []).append(time.perf_counter() - started)
    shutil.rmtree(home, ignore_errors=True)
    return out


def report(title: str, results: dict[str, list[float]], base: str) -> None:
    print(f"\n{title}")
    base_median = statistics.median(results[base])
    for name, samples in results.items():
        median = statistics.median(samples)
        print(f"  {name:<48} median {median:7.3f}s  min {min(samples):7.3f}s  ratio {median / base_median:5.2f}  "
              f"(+{median - base_median:.2f}s)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plan-repeats", type=int, default=5)
    args = parser.parse_args()
    report("plans and --dry-run (no cluster)", plan_times(args.plan_repeats), "python -c pass")
    if os.geteuid() != 0:
        print("\nfirst lines: skipped (network namespaces need root)")
        return
    tmp = Path(tempfile.mkdtemp(prefix="phx-bench-k8s-"))
    net = netns.create(2)
    try:
        image = make_image(tmp / "image")
        kubelet = NetnsKubelet(tmp, net, image)
        cluster = Cluster(tmp / "api", kubelet)
        try:
            run_phalanx(cluster, tmp)  # warm up (page cache, image imports)
            run_by_hand(net, image.env, tmp)
            results: dict[str, list[float]] = {"phalanx run --backend k8s -n 2x1": [], "torchrun by hand in the pods": []}
            for _ in range(args.repeats):
                results["phalanx run --backend k8s -n 2x1"].append(run_phalanx(cluster, tmp))
                results["torchrun by hand in the pods"].append(run_by_hand(net, image.env, tmp))
            report("command to every rank's first line, 2 pods x 1 process (podsim)", results, "torchrun by hand in the pods")
        finally:
            cluster.close()
            kubelet.close()
    finally:
        netns.destroy(net)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
