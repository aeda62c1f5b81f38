"""The slow rank named, from what phalanx already samples: no code in the script.

Data-parallel ranks meet at every step's collective, so a slow rank does not show as a slow
rate of steps (every rank makes the same number): it shows as the others *waiting*. Each node's
resource samples (``monitor/resources.py``) carry, per rank, how often its main thread was
runnable or asleep (``health/straggler_probe.py``) and its CPU use. A straggler is busy most of
the time while the others sleep in the collective; how much busier it is than the median rank is
how much more time it needs per step.

Where ranks print their own step numbers at their own pace (no collective between them), their
rates of steps are compared instead (``from_steps``).

False positives are worse than none, so a verdict needs all of:

- enough probes of every rank (``MIN_PROBES`` per half window), after the start-up (``WARMUP_S``:
  imports and rendezvous make early ranks wait for late ones);
- the slow ranks busy at least ``BUSY_MIN`` of the time, the others waiting at least
  ``WAIT_MIN`` of it, the slow ones ``RATIO`` times busier than the median of the others, and
  their CPU use (where sampled) ``CPU_RATIO`` times the others';
- at most half of the ranks slow (otherwise the "fast" ones are the odd ones, not the slow);
- the same ranks found in both halves of the window (``HALF_S`` each): one bad window is noise.

Pure: samples in, a ``Straggler`` or None out.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any, Iterable

WARMUP_S = 15.0  # samples this soon after a node's first one are start-up, not steps
HALF_S = 10.0  # each half of the window (at least two sample intervals)
MIN_PROBES = 20  # per rank and half window (HZ 5: four seconds' worth)
BUSY_MIN = 0.45  # the slow rank computes at least this share of the time...
WAIT_MIN = 0.30  # ...while the others sleep in the collective at least this share
RATIO = 1.5  # busy share of the slow rank over the median of the others'
CPU_RATIO = 1.25  # and its CPU use over theirs (where the samples have CPU use)
STEP_RATIO = 0.75  # from printed steps: a rate below 75% of the median rank's
MIN_STEPS = 5


@dataclass(frozen=True)
class Straggler:
    """Slow ranks (one, or all of one node's), how much slower per step, and where the others wait."""

    ranks: tuple[int, ...]
    nodes: tuple[int, ...]
    hosts: tuple[str, ...]
    factor: float  # time per step of the slow ranks over the median rank's (estimated)
    source: str  # "probes" (sampled thread states) or "steps" (printed step numbers)
    whole_node: bool = False  # every rank of the node is slow: the node, not a rank
    others_wait: float | None = None  # share of the time the other ranks spent waiting
    where: str | None = None  # where the others wait (a py-spy dump): "all_reduce"
    evidence: dict[str, Any] = field(default_factory=dict)

    def message(self) -> str:
        where = f" in {self.where}" if self.where else ""
        host = f" ({self.hosts[0]})" if self.hosts and self.hosts[0] else ""
        on = f" on node {self.nodes[0]}{host}" if self.nodes and self.nodes[0] >= 0 else ""
        if self.whole_node:
            return (f"node {self.nodes[0]}{host} is {self.factor:.1f}× slower per step than the others: its ranks "
                    f"{_ranks(self.ranks)} keep busy while the others wait for them{where}")
        if len(self.ranks) == 1:
            rank0 = " (rank 0 does work the others do not: evaluation, logging, checkpoints?)" if self.ranks[0] == 0 else ""
            if self.source == "steps":
                return (f"rank {self.ranks[0]}{on} is {self.factor:.1f}× slower per step than the median rank "
                        f"(its printed steps){rank0}")
            return (f"rank {self.ranks[0]}{on} is {self.factor:.1f}× slower per step than the median; the others "
                    f"wait for it{where}{rank0}")
        return (f"ranks {_ranks(self.ranks)} are {self.factor:.1f}× slower per step than the median; the others wait "
                f"for them{where}")

    def short(self) -> str:
        """For a column: ``rank 3 slow 2.8×``."""
        what = f"node {self.nodes[0]}" if self.whole_node else (
            f"rank {self.ranks[0]}" if len(self.ranks) == 1 else f"ranks {_ranks(self.ranks)}")
        return f"{what} slow {self.factor:.1f}×"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "message": self.message()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Straggler":
        keep = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        for key in ("ranks", "nodes", "hosts"):
            keep[key] = tuple(keep.get(key) or ())
        return cls(**keep)


def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


@dataclass
class _Share:
    busy: int = 0
    waiting: int = 0
    probes: int = 0
    cpu: list[float] = field(default_factory=list)
    node: int = 0
    host: str = ""


def find(samples: list[dict[str, Any]], records: Iterable[dict[str, Any]] = ()) -> Straggler | None:
    """The straggler of the latest attempt in ``samples`` (resource samples of every node, as
    ``recent_resources`` reads them) or, failing that, in ``records`` (metric records with steps
    of several ranks); None when the ranks keep pace or the data is too thin to say."""
    return from_probes(samples) or from_steps(records)


def from_probes(samples: list[dict[str, Any]]) -> Straggler | None:
    samples = _latest(samples)
    by_node: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        by_node[int(s.get("node_rank", 0))].append(s)
    halves: list[dict[int, _Share]] = [{}, {}]
    half = HALF_S
    for node_samples in by_node.values():
        interval = max(float(s.get("interval") or 0) for s in node_samples)
        half = max(half, 2 * interval)
    for node, node_samples in by_node.items():
        node_samples.sort(key=lambda s: s.get("time", 0.0))
        first, end = node_samples[0].get("time", 0.0), node_samples[-1].get("time", 0.0)
        for s in node_samples:
            t = s.get("time", 0.0)
            if t < first + WARMUP_S or t <= end - 2 * half:
                continue
            shares = halves[0 if t <= end - half else 1]
            for key, r in (s.get("ranks") or {}).items():
                if "probes" not in r:
                    continue
                share = shares.setdefault(int(key), _Share(node=node, host=str(s.get("host") or "")))
                share.busy += int(r.get("busy", 0))
                share.waiting += int(r.get("waiting", 0))
                share.probes += int(r["probes"])
                if "cpu_percent" in r:
                    share.cpu.append(float(r["cpu_percent"]))
    verdicts = [_judge(shares) for shares in halves]
    first_half, second_half = verdicts
    if first_half is None or second_half is None or first_half[0] != second_half[0]:
        return None
    slow, factor, wait, shares = second_half
    nodes = sorted({shares[r].node for r in slow})
    node_ranks = {r for r, s in shares.items() if s.node in nodes}
    whole = len(nodes) == 1 and len(slow) > 1 and set(slow) == node_ranks
    hosts = tuple(dict.fromkeys(shares[r].host for r in slow))
    evidence = {str(r): {"busy": round(s.busy / s.probes, 3), "waiting": round(s.waiting / s.probes, 3),
                         "cpu": round(sum(s.cpu) / len(s.cpu), 1) if s.cpu else None} for r, s in sorted(shares.items())}
    return Straggler(tuple(slow), tuple(nodes), hosts, round((first_half[1] + factor) / 2, 1), "probes", whole,
                     round(wait, 2), evidence=evidence)


def _judge(shares: dict[int, _Share]) -> tuple[tuple[int, ...], float, float, dict[int, _Share]] | None:
    """(slow ranks, busy ratio, others' waiting share, shares) of one half window, or None."""
    if len(shares) < 2 or any(s.probes < MIN_PROBES for s in shares.values()):
        return None
    busy = {r: s.busy / s.probes for r, s in shares.items()}
    ordered = sorted(busy.values())
    reference = median(ordered[:max(1, len(ordered) // 2)])  # the lower half: ranks that keep pace
    slow = tuple(sorted(r for r, b in busy.items() if b >= BUSY_MIN and b >= RATIO * max(reference, 1e-9)))
    if not slow or len(slow) > len(shares) / 2:
        return None
    others = [r for r in shares if r not in slow]
    wait = median(shares[r].waiting / shares[r].probes for r in others)
    if wait < WAIT_MIN:
        return None
    cpus = {r: sum(s.cpu) / len(s.cpu) for r, s in shares.items() if s.cpu}
    if len(cpus) == len(shares):
        others_cpu = median(cpus[r] for r in others)
        if any(cpus[r] < CPU_RATIO * others_cpu for r in slow):
            return None
    factor = median(busy[r] for r in slow) / max(median(busy[r] for r in others), 1e-9)
    return slow, factor, wait, shares


def from_steps(records: Iterable[dict[str, Any]]) -> Straggler | None:
    """Ranks that print their own step numbers: a rank whose steps per second are below
    ``STEP_RATIO`` of the median rank's (ranks not held in step by a collective)."""
    first: dict[int, tuple[float, int]] = {}
    last: dict[int, tuple[float, int]] = {}
    for r in _latest(list(records)):
        step, t, rank = r.get("step"), r.get("time"), r.get("rank")
        if not isinstance(step, int) or not isinstance(t, (int, float)) or not isinstance(rank, int):
            continue
        if rank not in first or t < first[rank][0]:
            first[rank] = (t, step)
        if rank not in last or (t, step) > last[rank]:
            last[rank] = (t, step)
    rates = {}
    for rank, (t0, s0) in first.items():
        t1, s1 = last[rank]
        if s1 - s0 >= MIN_STEPS and t1 > t0:
            rates[rank] = (s1 - s0) / (t1 - t0)
    if len(rates) < 2:
        return None
    mid = median(rates.values())
    slow = [r for r, rate in rates.items() if rate < STEP_RATIO * mid]
    if len(slow) != 1:
        return None
    rank = slow[0]
    return Straggler((rank,), (-1,), ("",), round(mid / max(rates[rank], 1e-9), 1), "steps",
                     evidence={str(r): {"steps_per_s": round(v, 3)} for r, v in sorted(rates.items())})


def _latest(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not items:
        return []
    latest = max(int(i.get("attempt", 0)) for i in items)
    return [i for i in items if int(i.get("attempt", 0)) == latest]
