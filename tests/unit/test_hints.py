"""Hints from synthetic resource samples and metrics: each rule fires on its pattern only."""

from __future__ import annotations

from phalanx.monitor import hints as H
from phalanx.monitor.hints import hints

GiB = 2**30


def samples(n=12, every=5.0, cpu=50.0, gpus=(), node=0, attempt=0, start=1000.0):
    """``gpus``: per GPU a (util, mem_used_GiB) pair, or a function of the sample index."""
    out = []
    for i in range(n):
        gs = []
        for index, g in enumerate(gpus):
            util, used = g(i) if callable(g) else g
            gs.append({"index": index, "util": util, "mem_used": used * GiB, "mem_total": 80 * GiB})
        out.append({"time": start + i * every, "node_rank": node, "attempt": attempt, "cpu_percent": cpu, "gpus": gs})
    return out


def test_quiet_when_all_is_well_or_there_is_no_data():
    assert hints([], []) == []
    assert hints(samples(gpus=[(95, 40), (97, 41)]), []) == []
    assert hints(samples(cpu=99.0), []) == []  # CPU-only job: busy CPUs are the point
    assert hints(samples(n=2, cpu=99.0, gpus=[(10, 5)]), []) == []  # too few samples to judge


def test_starved_gpus_with_saturated_cpus_point_at_data_loading():
    (hint,) = hints(samples(cpu=97.0, gpus=[(30, 10), (35, 10)]), [])
    assert "node 0" in hint and "data loading may be the bottleneck" in hint and "DataLoader workers" in hint
    assert hints(samples(cpu=60.0, gpus=[(30, 10)]), []) == []  # GPUs idle but CPUs not saturated: not this


def test_only_the_recent_window_counts():
    # busy start-up (imports, data download) 10 minutes ago, healthy since
    early = samples(n=12, cpu=99.0, gpus=[(5, 1)], start=0.0)
    late = samples(n=30, cpu=40.0, gpus=[(95, 40)], start=600.0)
    assert hints(early + late, []) == []


def test_gpu_memory_near_full():
    (hint,) = hints(samples(gpus=[(90, 79), (90, 40)]), [])
    assert "GPU 0 memory is 99% full" in hint and "out-of-memory" in hint


def test_gpu_idle_for_minutes():
    # GPU 1 idle all along (3 min of samples), GPU 0 busy
    (hint,) = hints(samples(n=40, every=5.0, gpus=[(90, 40), (0, 0.5)]), [])
    assert hint.startswith("node 0: GPU 1 has been idle for 3 min")
    # idle for only a minute: not yet
    assert hints(samples(n=13, every=5.0, gpus=[(90, 40), (0, 0.5)]), []) == []
    # busy until a minute ago
    recent_idle = samples(n=60, every=5.0, gpus=[(90, 40), lambda i: (0 if i > 48 else 80, 2)])
    assert hints(recent_idle, []) == []


def test_each_node_and_only_the_latest_attempt():
    old = samples(cpu=99.0, gpus=[(10, 79)], attempt=0)
    new = samples(cpu=40.0, gpus=[(90, 40)], attempt=1, node=0) + samples(cpu=40.0, gpus=[(90, 79)], attempt=1, node=1)
    (hint,) = hints(old + new, [])
    assert hint.startswith("node 1: GPU 0 memory")


def test_thresholds_are_named_constants():
    for name in ("GPU_STARVED_UTIL", "CPU_SATURATED", "GPU_MEM_FULL", "GPU_IDLE_S", "GPU_IDLE_UTIL", "WINDOW_S"):
        assert isinstance(getattr(H, name), float)
