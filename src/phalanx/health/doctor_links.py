"""The doctor's links phase, on every node after its own checks: each node's clock against node
0's, and an all-reduce between every pair of nodes alone (latency and bandwidth), so that a slow
NIC, cable or switch port shows as the pairs of one node being slow.

One process per node (the doctor's job starts the probe with ``--spawn self``: ``RANK`` is the
node's rank, ``WORLD_SIZE`` the number of nodes, ``MASTER_ADDR:MASTER_PORT`` node 0's). The
links run over NCCL between the nodes' first GPUs, over gloo without GPUs (or when nodes on one
machine would share one GPU); the clocks are compared over gloo. Pairs run one at a time, the other nodes waiting at a barrier, so they do
not share the network. With more than ``ALL_PAIRS_UP_TO`` nodes, each node is paired with its
next and its opposite node only (2 pairs per node instead of N-1).

Node 0 prints one line, ``PHALANX_DOCTOR_LINKS {json}``: ``{"backend", "skews": {rank: s},
"links": [checks.LinkReport...]}``; a node that cannot join prints the same line with ``error``.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import time
from typing import Any

from .checks import LINKS_TAG, NodeReport

ALL_PAIRS_UP_TO = 8
LATENCY_ROUNDS = 20
BANDWIDTH_ROUNDS = 5
CLOCK_ROUNDS = 5


def pairs(n: int) -> list[tuple[int, int]]:
    if n <= ALL_PAIRS_UP_TO:
        return list(itertools.combinations(range(n), 2))
    chosen = {tuple(sorted((i, (i + step) % n))) for i in range(n) for step in (1, n // 2)}
    return sorted((a, b) for a, b in chosen if a != b)


def run_links(report: NodeReport, link_mb: float, timeout: float) -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = report.device_kind == "cuda" and dist.is_nccl_available()
    try:
        # One group for both: CPU tensors (the clocks, the bookkeeping) go over gloo, GPU tensors
        # over NCCL, whose communicators are made at the first GPU collective, after the device
        # is chosen below.
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout))
    except Exception as exc:  # noqa: BLE001 - a node that cannot join is the finding
        _say({"backend": "nccl" if cuda else "gloo", "node_rank": rank, "error": f"could not join the other nodes: {exc}"})
        return
    try:
        device = _device(report, cuda, rank, world, dist, torch)
        backend = "nccl" if device.type == "cuda" else "gloo"
        size_mb = link_mb or (64.0 if device.type == "cuda" else 8.0)
        chosen = pairs(world)
        groups = {pair: dist.new_group(list(pair)) for pair in chosen}
        clock_pairs = {other: groups.get((0, other)) or dist.new_group([0, other]) for other in range(1, world)}
        skews = {str(other): _skew(rank, other, clock_pairs[other], dist, torch) for other in range(1, world)}
        links = []
        for a, b in chosen:
            dist.barrier()
            if rank in (a, b):
                links.append(_link(a, b, groups[(a, b)], device, size_mb, dist, torch))
        found: list[Any] = [None] * world
        dist.all_gather_object(found, links)
        if rank == 0:
            every = [link for per in found for link in per or () if link["a"] == link.get("measured_by")]
            skews["0"] = 0.0
            _say({"backend": backend, "node_rank": 0, "skews": skews, "links": every, "size_mb": size_mb})
    except Exception as exc:  # noqa: BLE001
        _say({"backend": "nccl" if cuda else "gloo", "node_rank": rank, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def _device(report: NodeReport, cuda: bool, rank: int, world: int, dist: Any, torch: Any) -> Any:
    """The device this node's links run from: its first GPU, or (several nodes on one machine, as
    the local backend runs them) the GPU of its place among them; the CPU when they would share one
    GPU (NCCL refuses two ranks on one device) or there is none."""
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, report.hostname)
    place = [r for r in range(world) if hosts[r] == report.hostname].index(rank)
    sharing = hosts.count(report.hostname)
    if not cuda or sharing > report.gpus_visible:
        return torch.device("cpu")
    torch.cuda.set_device(place)
    return torch.device("cuda", place)


def _skew(rank: int, other: int, group: Any, dist: Any, torch: Any) -> float | None:
    """``other``'s clock minus node 0's, from round trips (node 0 pings, ``other`` answers with
    its time): the offset of the round with the shortest trip, off by at most half of it."""
    if rank not in (0, other):
        return None
    best: tuple[float, float] | None = None
    for _ in range(CLOCK_ROUNDS):
        ping = torch.zeros(1, dtype=torch.float64)
        sent = time.time()
        dist.broadcast(ping, src=0, group=group)
        answer = torch.tensor([time.time()], dtype=torch.float64)
        dist.broadcast(answer, src=other, group=group)
        back = time.time()
        if rank == 0:
            trip = back - sent
            offset = float(answer[0]) - (sent + back) / 2
            if best is None or trip < best[0]:
                best = (trip, offset)
    return best[1] if best is not None else None


def _link(a: int, b: int, group: Any, device: Any, size_mb: float, dist: Any, torch: Any) -> dict[str, Any]:
    rank = dist.get_rank()
    try:
        small = torch.ones(1, device=device)
        large = torch.ones(max(1, int(size_mb * 1024 * 1024 / 4)), device=device)
        for tensor in (small, small, large):  # warm up: connections, buffers
            dist.all_reduce(tensor, group=group)
        _sync(device, torch)
        started = time.perf_counter()
        for _ in range(LATENCY_ROUNDS):
            dist.all_reduce(small, group=group)
        _sync(device, torch)
        latency = (time.perf_counter() - started) / LATENCY_ROUNDS
        started = time.perf_counter()
        for _ in range(BANDWIDTH_ROUNDS):
            dist.all_reduce(large, group=group)
        _sync(device, torch)
        took = (time.perf_counter() - started) / BANDWIDTH_ROUNDS
        return {"a": a, "b": b, "measured_by": rank, "latency": latency, "bandwidth": large.numel() * 4 / took}
    except Exception as exc:  # noqa: BLE001
        return {"a": a, "b": b, "measured_by": rank, "error": f"{type(exc).__name__}: {exc}"}


def _sync(device: Any, torch: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _say(data: dict[str, Any]) -> None:
    print(LINKS_TAG + json.dumps(data, sort_keys=True), flush=True)
