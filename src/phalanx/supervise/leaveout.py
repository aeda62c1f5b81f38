"""Nodes left out of the next attempt: the ones an attempt's end points at
(``health/checks_cause.py``: a failed health check, a SIGBUS, an ECC, Xid or NIC error, a lost
host), named as the backend knows them, and whether the backend can avoid them
(``Backend.avoids``). Pure; ``JobRun`` records the result in ``attempts.jsonl`` and plans the
next attempt with ``JobSpec.left_out``.

An attempt that ended only because nodes failed their check before any rank ran (nothing of
the job ran) is run again on other nodes without using up a ``--max-retries`` retry, at most
``FREE_RERUNS`` times: each such rerun leaves at least one more node out, so it ends when the
spare nodes do. Any other failure is retried only as ``--max-retries`` allows, and the retry
avoids the nodes it pointed at.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from ..core.contracts import NodeResult
from ..health.checks_cause import pointed

FREE_RERUNS = 5

HOW = {"exclude": "left out of the next attempt", "new": "the next attempt gets new machines",
       "": "cannot be left out by this backend"}


@dataclass(frozen=True)
class LeaveOut:
    entries: tuple[dict[str, Any], ...] = ()  # for attempts.jsonl: node, node_rank, why, left_out, how
    names: tuple[str, ...] = ()  # newly left out (the backend can avoid them)
    check_only: bool = False  # the attempt ended because nodes failed their check; no rank ran

    def kept(self, why: str) -> "LeaveOut":
        """The same nodes, which could not be left out after all (``why``): the retry keeps them."""
        entries = tuple({**e, "left_out": False, "how": f"kept: {why}"} if e["node"] in self.names else e
                        for e in self.entries)
        return replace(self, entries=entries, names=())

    def words(self) -> str:
        """``node2 (failed its health check: ...)``, for the supervisor's message."""
        return "; ".join(f"{e['node']} ({e['why']})" for e in self.entries)


def node_name(result: NodeResult) -> str:
    """The node as its backend knows it: the scheduler's name (SLURM, Kubernetes), else its host."""
    return str(result.details.get("node_name") or result.host or "")


def decide(leaves_out: str, cause: dict[str, Any] | None, results: Sequence[NodeResult],
           already: Sequence[str] = (), first: Sequence[int] | None = None) -> LeaveOut:
    """What the attempt ending with ``cause`` (its root cause) and ``results`` (in node order)
    points at; ``leaves_out``: ``Backend.avoids(spec)``; ``already``: nodes an
    earlier attempt left out; ``first``: the nodes that had failed when the supervisor stopped
    the others (``AttemptRun.failed_first``; the others' ends are its stop's)."""
    entries, names = [], []
    for found in pointed(cause, results):
        name = node_name(results[found.node_rank])
        avoidable = leaves_out == "exclude" and bool(name)
        entries.append({"node": name or f"node {found.node_rank}", "node_rank": found.node_rank, "why": found.why,
                        "left_out": avoidable, "how": HOW.get(leaves_out if name else "", HOW[""])})
        if avoidable and name not in already and name not in names:
            names.append(name)
    failed = [results[n] for n in first if n < len(results)] if first else \
        [r for r in results if r.exitcode != 0 and not r.stopped_by]
    check_only = bool(failed) and all(_failed_check(r) for r in failed) and not any(r.failures for r in results)
    return LeaveOut(tuple(entries), tuple(names), check_only)


def unusable(leaves_out: str, nodes: dict[str, str], already: Sequence[str] = ()) -> LeaveOut:
    """Hosts the backend could not use at all (``errors.NodesUnusable``: no answer, no phalanx):
    left out like nodes that failed their check."""
    entries = tuple({"node": name, "why": why, "left_out": leaves_out == "exclude",
                     "how": HOW.get(leaves_out, HOW[""])} for name, why in sorted(nodes.items()))
    names = tuple(n for n in sorted(nodes) if leaves_out == "exclude" and n not in already)
    return LeaveOut(entries, names, check_only=True)


def _failed_check(result: NodeResult) -> bool:
    health = result.details.get("health")
    return isinstance(health, dict) and health.get("ok") is False
