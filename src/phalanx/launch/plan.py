"""The plan: exactly what runs on each node, as data. Pure; ``submit`` executes it.

A node runs one node agent (``python -m phalanx.launch.agent``). The agent either hands
the node to torchrun (``torchrun_argv``) or starts ``processes`` itself (single process,
``--spawn self``, TF and JAX jobs).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class ProcessPlan:
    local_rank: int
    rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # on top of the node's env


@dataclass(frozen=True)
class NodePlan:
    node_rank: int
    host: str
    agent_argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str = "."
    torchrun_argv: tuple[str, ...] | None = None
    worker_argv: tuple[str, ...] = ()  # with torchrun: what each worker runs
    processes: tuple[ProcessPlan, ...] = ()  # without torchrun

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NodePlan":
        procs = tuple(
            ProcessPlan(p["local_rank"], p["rank"], tuple(p["argv"]), dict(p["env"])) for p in data["processes"]
        )
        tr = data.get("torchrun_argv")
        return cls(
            node_rank=data["node_rank"],
            host=data["host"],
            agent_argv=tuple(data["agent_argv"]),
            env=dict(data["env"]),
            cwd=data.get("cwd", "."),
            torchrun_argv=tuple(tr) if tr is not None else None,
            worker_argv=tuple(data.get("worker_argv", ())),
            processes=procs,
        )


@dataclass(frozen=True)
class Plan:
    job_id: str
    attempt: int
    backend: str
    nodes: tuple[NodePlan, ...]
    grace: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "backend": self.backend,
            "grace": self.grace,
            "nodes": [n.to_dict() for n in self.nodes],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Plan":
        return cls(
            job_id=data["job_id"],
            attempt=data["attempt"],
            backend=data["backend"],
            grace=data["grace"],
            nodes=tuple(NodePlan.from_dict(n) for n in data["nodes"]),
        )

    def render(self, show_env: bool = True) -> str:
        """Human-readable: per node, the agent command, then what it starts, then the env."""
        lines = [f"# job {self.job_id}  attempt {self.attempt}  backend {self.backend}  nodes {len(self.nodes)}"]
        for node in self.nodes:
            lines.append(f"\n[node {node.node_rank} @ {node.host}]")
            lines.append(f"cwd:      {node.cwd}")
            lines.append(f"agent:    {shlex.join(node.agent_argv)}")
            if node.torchrun_argv is not None:
                lines.append(f"torchrun: torchrun {shlex.join([*node.torchrun_argv, *node.worker_argv])}")
            for proc in node.processes:
                extra = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(proc.env.items()))
                lines.append(f"rank {proc.rank}:   {extra} {shlex.join(proc.argv)}".rstrip())
            if show_env:
                lines.append("env:")
                lines.extend(f"  {k}={v}" for k, v in sorted(node.env.items()))
        return "\n".join(lines) + "\n"
