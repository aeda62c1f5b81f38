"""The slow rank named from resource samples, replayed from real runs.

``recorded/stragglers/`` holds the resource samples (``node_<n>/resources.jsonl``) of real 4-rank
gloo DDP runs under phalanx on a loaded 2-core machine (``bench/straggler_record.py``; only rank
0 prints): 20 healthy runs and runs where one rank does 2 to 3 times the work of the others per
step. The detector sees each run as it grew, sample by sample, as the supervisor does: the
healthy ones must never draw a warning, the slow ones must name their slow rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phalanx.health import straggler
from phalanx.health.straggler import Straggler, find, from_probes, from_steps
from phalanx.health.straggler_probe import StateProbe, site_of, thread_state

RECORDED = Path(__file__).parent / "recorded" / "stragglers"


def runs(kind: str) -> list[tuple[dict, list[dict]]]:
    out = []
    for path in sorted(RECORDED.glob(f"{kind}-*.jsonl")):
        lines = path.read_text().splitlines()
        out.append((json.loads(lines[0])["meta"], [json.loads(line) for line in lines[1:] if line.strip()]))
    return out


def as_it_grew(samples: list[dict]) -> list[tuple[float, Straggler | None]]:
    """The detector's verdict after each sample, as the supervisor would have judged then."""
    times = sorted({s["time"] for s in samples})
    return [(t - times[0], from_probes([dict(s) for s in samples if s["time"] <= t])) for t in times]


def test_twenty_healthy_runs_draw_no_warning_at_any_moment():
    healthy = runs("healthy")
    assert len(healthy) == 20
    for meta, samples in healthy:
        assert any("probes" in r for s in samples for r in s["ranks"].values())  # the probe's counts are there
        verdicts = [(t, v.message()) for t, v in as_it_grew(samples) if v is not None]
        assert verdicts == [], (meta, verdicts)


def test_the_slow_rank_of_each_slow_run_is_named():
    slow = runs("slow")
    assert slow
    for meta, samples in slow:
        named = [v for _, v in as_it_grew(samples) if v is not None]
        assert named, meta
        assert {v.ranks for v in named} == {(meta["slow_rank"],)}, meta  # never another rank
        last = named[-1]
        assert 1.5 <= last.factor <= meta["factor"] + 1.0 and last.others_wait >= straggler.WAIT_MIN
        node = 1 if meta["topology"] == "2x2" and meta["slow_rank"] >= 2 else 0
        assert last.nodes == (node,) and last.hosts and last.source == "probes"
        assert last.message().startswith(f"rank {meta['slow_rank']} on node {node} (")
        assert "slower per step than the median; the others wait for it" in last.message()


def sample(node: int, t: float, ranks: dict[int, tuple[int, int, float]], interval: float = 5.0) -> dict:
    """A resource sample: rank -> (busy, waiting, cpu_percent) out of 25 probes."""
    return {"time": t, "node_rank": node, "host": f"h{node}", "interval": interval, "attempt": 0,
            "ranks": {str(r): {"busy": b, "waiting": w, "io": 0, "probes": 25, "cpu_percent": c} for r, (b, w, c) in ranks.items()}}


def series(node: int, ranks: dict[int, tuple[int, int, float]], seconds: int = 60) -> list[dict]:
    return [sample(node, 1000.0 + t, ranks) for t in range(0, seconds + 1, 5)]


def test_a_whole_slow_node_is_named_as_the_node():
    fast, slow = (6, 19, 20.0), (20, 5, 60.0)
    samples = series(0, {0: fast, 1: fast, 2: fast, 3: fast}) + series(1, {4: slow, 5: slow, 6: fast, 7: fast})
    # two slow ranks of a node with four: the ranks
    found = find(samples)
    assert found is not None and found.ranks == (4, 5) and not found.whole_node
    samples = series(0, {0: fast, 1: fast, 2: fast}) + series(1, {3: slow, 4: slow})
    found = find(samples)
    assert found is not None and found.whole_node and found.nodes == (1,)
    assert found.message().startswith("node 1 (h1) is ") and "its ranks 3, 4 keep busy" in found.message()


def test_what_is_not_a_straggler():
    even = (12, 13, 30.0)
    assert find(series(0, {r: even for r in range(4)})) is None  # all alike
    busy = (24, 1, 95.0)
    assert find(series(0, {0: busy, 1: busy, 2: (14, 1, 60.0), 3: busy})) is None  # nobody waits: no collective
    assert find(series(0, {0: (20, 5, 50.0), 1: (20, 5, 50.0), 2: (6, 19, 15.0), 3: (6, 19, 15.0), 4: (20, 5, 50.0)})) is None
    # the CPU says otherwise (a rank asleep in I/O counted as waiting elsewhere): no verdict
    assert find(series(0, {0: (20, 5, 30.0), 1: (6, 19, 30.0), 2: (6, 19, 30.0)})) is None
    # one half of the window only: a blip
    blip = series(0, {0: (6, 19, 20.0), 1: (6, 19, 20.0), 2: (6, 19, 20.0)}, 45) + \
        [sample(0, 1050.0, {0: (20, 5, 60.0), 1: (6, 19, 20.0), 2: (6, 19, 20.0)}),
         sample(0, 1055.0, {0: (20, 5, 60.0), 1: (6, 19, 20.0), 2: (6, 19, 20.0)})]
    assert find(blip) is None
    # start-up: the first WARMUP_S seconds do not count
    assert find(series(0, {0: (20, 5, 60.0), 1: (6, 19, 20.0), 2: (6, 19, 20.0)}, 20)) is None


def test_only_the_latest_attempt_counts():
    old = series(0, {0: (20, 5, 60.0), 1: (6, 19, 20.0), 2: (6, 19, 20.0)})
    new = [dict(s, attempt=1) for s in series(0, {r: (12, 13, 30.0) for r in range(3)})]
    assert find(old) is not None and find(old + new) is None


def test_rank_zero_is_named_with_a_word_on_why():
    found = find(series(0, {0: (20, 5, 60.0), 1: (6, 19, 20.0), 2: (6, 19, 20.0)}))
    assert found.ranks == (0,) and "rank 0 does work the others do not" in found.message()
    assert found.short() == f"rank 0 slow {found.factor:.1f}×"
    assert Straggler.from_dict(json.loads(json.dumps(found.to_dict()))) == found


def metrics(rank, steps_per_s, seconds=60, attempt=0):
    return [{"name": "loss", "value": 1.0, "rank": rank, "attempt": attempt, "step": int(t * steps_per_s), "time": 1000.0 + t}
            for t in range(0, seconds + 1, 5)]


def test_ranks_that_print_their_own_steps():
    records = metrics(0, 2.0) + metrics(1, 2.1) + metrics(2, 1.0) + metrics(3, 1.95)
    found = from_steps(records)
    assert found.ranks == (2,) and found.source == "steps" and found.factor == pytest.approx(2.0, abs=0.1)
    assert found.message().startswith("rank 2 is 2.0× slower per step than the median rank (its printed steps)")
    assert from_steps(metrics(0, 2.0) + metrics(1, 1.8)) is None  # 10% apart: jitter
    assert from_steps(metrics(0, 2.0)) is None  # one rank: nothing to compare
    assert from_steps(metrics(0, 0.05) + metrics(1, 2.0)) is None  # too few steps to judge rank 0
    assert find([], records) == found


def test_the_probe_reads_thread_states_of_real_processes():
    import os
    import subprocess
    import sys
    import time

    asleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    spinning = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        assert thread_state(asleep.pid) == b"S"
        probe = StateProbe(lambda: {0: asleep.pid, 1: spinning.pid}, hz=50)
        for _ in range(40):
            probe.probe({0: asleep.pid, 1: spinning.pid})
        counts = probe.take()
        assert counts[0]["waiting"] == 40 and counts[0]["busy"] == 0
        assert counts[1]["busy"] >= 10 and counts[1]["probes"] == 40  # runnable (the machine may be busy)
        assert probe.take() == {}  # counts start over
        assert thread_state(2**22 + 7) is None and os.getpid() > 0
    finally:
        for p in (asleep, spinning):
            p.kill()
            p.wait()


def test_where_the_others_wait_from_a_py_spy_dump():
    ddp = """Process 30515: python -u -m phalanx.launch.bootstrap
Python v3.11.7

Thread 30515 (idle): "MainThread"
    _engine_run_backward (torch/autograd/graph.py:979)
    backward (torch/autograd/__init__.py:395)
    Tensor.backward (torch/_tensor.py:623)
    <module> (train.py:16)
Thread 30600 (idle): "Thread-1"
    wait (threading.py:320)
"""
    explicit = """Thread 1 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2950)
    wrapper (torch/distributed/c10d_logger.py:81)
    <module> (train.py:20)
"""
    assert site_of(ddp) == "backward (DDP's gradient all_reduce)"
    assert site_of(explicit) == "all_reduce"
    assert site_of('Thread 1 (active): "MainThread"\n    <module> (train.py:3)\n') is None
