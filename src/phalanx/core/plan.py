"""The plan: exactly what runs on each node, as data. Pure; ``submit`` executes it.

A node runs one node agent (``python -m phalanx.launch.agent``). The agent either hands
the node to torchrun (``torchrun_argv``) or starts ``processes`` itself (single process,
``--spawn self``, TF and JAX jobs).

When a scheduler decides where the nodes are (SLURM), their addresses are unknown at plan
time: the plan holds placeholders ``@NODE_ADDR_<i>@`` (node i's address, node 0 hosts the
rendezvous) and each agent fills them in at start from ``PHALANX_NODE_ADDRS`` (``bind_addresses``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from .rawtext import shell_join, shell_quote

_LATE_ADDR = re.compile(r"@NODE_ADDR_(\d+)@")
SECRET_SHOWN = "<secret>"  # a secret's value where a plan is shown (--dry-run): never the value


def late_addresses(nnodes: int) -> tuple[str, ...]:
    """Placeholders for node addresses that only the running job knows (see ``bind_addresses``)."""
    return tuple(f"@NODE_ADDR_{i}@" for i in range(nnodes))


def is_late(address: str) -> bool:
    return bool(_LATE_ADDR.fullmatch(address))


def quote_user_text(text: str) -> str:
    """User text (script arguments, env values) in a plan with late addresses, so that a
    placeholder the user typed is neither replaced nor an error: ``bind_addresses`` undoes it."""
    return text.replace("@NODE_ADDR_", "@NODE_ADDR_@")


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
    # --secret: variable -> secret name. Names only: the backend that starts the node puts the
    # values into its environment at start (``Backend.secret_env``); ``env`` never holds them.
    secrets: Mapping[str, str] = field(default_factory=dict)
    # Run on the node before any rank starts (``--health-check``); the node fails the attempt
    # when it exits non-zero (``launch/nodecheck.py``). Empty: no check.
    health_check: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.secrets:
            del data["secrets"]  # launch files of jobs without secrets stay as they were
        if not self.health_check:  # plans without a check read as they always did
            del data["health_check"]
        return data

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
            secrets=dict(data.get("secrets") or {}),
            health_check=tuple(data.get("health_check", ())),
        )


def bind_addresses(node: NodePlan, addrs: Sequence[str]) -> NodePlan:
    """``node`` with its ``@NODE_ADDR_<i>@`` placeholders replaced by ``addrs[i]``. Pure.
    Only a plan made with late addresses (its host is one) is bound; the user's text in it was
    quoted (``quote_user_text``) and comes back as typed.

    Raises ValueError when the plan needs more addresses than ``addrs`` holds.
    """
    if not is_late(node.host):
        return node
    text = json.dumps(node.to_dict())

    def address(match: re.Match[str]) -> str:
        index = int(match.group(1))
        if index >= len(addrs) or not addrs[index]:
            raise ValueError(f"the plan needs the address of node {index}, but only {len(addrs)} address(es) were given")
        return json.dumps(addrs[index])[1:-1]

    return NodePlan.from_dict(json.loads(_LATE_ADDR.sub(address, text).replace("@NODE_ADDR_@", "@NODE_ADDR_")))


@dataclass(frozen=True)
class Plan:
    job_id: str
    attempt: int
    backend: str
    nodes: tuple[NodePlan, ...]
    grace: float
    # What is handed to a scheduler that then starts the node agents itself (SLURM's batch
    # script, a manifest); empty for backends that start the agents directly.
    submission: str = ""
    # What the script will see, in words (launch/explain.py): printed above the plan.
    notes: tuple[str, ...] = ()
    # What ``Backend.start`` needs beyond the nodes and the submission, decided at plan time
    # (JSON-able, owned by the backend: the ssh backend's hosts and what it ships to them).
    context: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "backend": self.backend,
            "grace": self.grace,
            "nodes": [n.to_dict() for n in self.nodes],
        }
        if self.submission:
            data["submission"] = self.submission
        if self.notes:
            data["notes"] = list(self.notes)
        if self.context:
            data["context"] = dict(self.context)
        return data

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
            submission=data.get("submission", ""),
            notes=tuple(data.get("notes", ())),
            context=dict(data.get("context") or {}),
        )

    def render(self, show_env: bool = True) -> str:
        """Human-readable: per node, the agent command, then what it starts, then the env.
        With a submission (a batch script), that first and the per-node part as comments."""
        notes = "".join(f"# {note}\n" for note in self.notes)
        if self.submission:
            nodes = Plan(self.job_id, self.attempt, self.backend, self.nodes, self.grace).render(show_env)
            # The script first: what --dry-run prints can be handed to the scheduler as it is.
            return self.submission + "\n" + notes + "# Each node's part (node_<n>/launch.json):\n" + "".join(
                f"#   {line}\n" if line else "#\n" for line in nodes.splitlines()
            )
        lines = [f"# job {self.job_id}  attempt {self.attempt}  backend {self.backend}  nodes {len(self.nodes)}"]
        lines += [f"# {note}" for note in self.notes]
        for node in self.nodes:
            lines.append(f"\n[node {node.node_rank} @ {node.host}]")
            lines.append(f"cwd:      {node.cwd}")
            lines.append(f"agent:    {shell_join(node.agent_argv)}")
            if node.health_check:
                lines.append(f"check:    {shell_join(node.health_check)}")
            if node.torchrun_argv is not None:
                lines.append(f"torchrun: torchrun {shell_join([*node.torchrun_argv, *node.worker_argv])}")
            for proc in node.processes:
                extra = " ".join(f"{k}={shell_quote(v)}" for k, v in sorted(proc.env.items()))
                lines.append(f"rank {proc.rank}:   {extra} {shell_join(proc.argv)}".rstrip())
            if show_env:
                lines.append("env:")
                shown = {**node.env, **{name: SECRET_SHOWN for name in node.secrets}}
                lines.extend(f"  {k}={v}" for k, v in sorted(shown.items()))
        return "\n".join(lines) + "\n"
