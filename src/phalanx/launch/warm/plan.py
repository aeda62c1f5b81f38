"""Warm starts, seen from the supervisor: which processes of a plan start from the warm pool, what
the pool keeps imported for them, and the pools of this user (``phalanx pool status|stop``).

A warm process is started as ``python -m phalanx.launch.warm.standin [options] -- MODULE ARGS`` where
the cold plan has ``python -m MODULE ARGS``: the node agent (``phalanx.launch.agent``), the single
process of a one-process job, and every worker (``phalanx.launch.bootstrap``), torchrun's included:
torchrun's own ``--module`` becomes ``phalanx.launch.warm.standin``, so torchrun still starts, watches,
signals and restarts every worker, and sets their environment itself (``warm_exec`` passes on
exactly the environment torchrun gave it). Commands (``phalanx run -- CMD``) stay cold: they
``exec`` another program, for which nothing is kept imported.

See ``warm_proto`` (pools and keys), ``warm_exec`` (the client), ``warm_pool`` (the server),
``warm_child`` and ``warm_imports`` (how a forked child becomes a cold start).
"""

from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...core.spec import EntrypointKind, JobSpec
from . import proto as warm_proto
from ...core.plan import NodePlan, Plan

WARM_EXEC = "phalanx.launch.warm.standin"
BOOTSTRAP = "phalanx.launch.bootstrap"
AGENT = "phalanx.launch.agent"
# What a node agent imports before it starts the workers.
AGENT_PRELOAD = ("phalanx.launch.agent", "phalanx.monitor.resources")
TORCHRUN_PRELOAD = ("torch.distributed.run", "torch.distributed.launcher.api",
                    "torch.distributed.elastic.multiprocessing.errors")
SCAN_LIMIT = 32  # local modules followed when looking for what a script imports


@dataclass(frozen=True)
class WarmFacts:
    """Where this machine's pools live and how long an idle one waits: facts of the host, looked
    up once per submission (``facts``), so that ``apply`` stays a function of its arguments."""

    directory: str
    idle_s: float
    max_pools: int = 0  # 0: no limit


def facts() -> WarmFacts:
    """The pool directory (``warm_proto.pool_dir``) and the ``warm_idle`` and ``warm_max_pools``
    settings. Impure."""
    from ... import config

    return WarmFacts(os.path.abspath(warm_proto.pool_dir(os.environ)), 60.0 * float(config.get("warm_idle")),
                     int(config.get("warm_max_pools")))


def apply(plan: Plan, spec: JobSpec, host: WarmFacts) -> Plan:
    """``plan`` with its Python processes started warm. Reads the script (to see whether it
    imports torch), nothing else."""
    if spec.entrypoint.kind is EntrypointKind.COMMAND or not sys.platform.startswith("linux"):
        return plan  # commands exec another program; the pool needs Linux (/proc, prctl, SCM_RIGHTS)
    common = ("--dir", host.directory, "--idle", f"{host.idle_s:g}",
              *(("--max-pools", str(host.max_pools)) if host.max_pools > 0 else ()))
    worker = _options(common, script_preloads(spec))
    return replace(plan, nodes=tuple(_node(node, common, worker) for node in plan.nodes))


def _options(common: tuple[str, ...], preload: tuple[str, ...]) -> tuple[str, ...]:
    return (*common, "--preload", ",".join(preload)) if preload else common


def _node(node: NodePlan, common: tuple[str, ...], worker: tuple[str, ...]) -> NodePlan:
    agent_preload = AGENT_PRELOAD + (TORCHRUN_PRELOAD if node.torchrun_argv is not None else ())
    agent = wrap(node.agent_argv, AGENT, _options(common, agent_preload))
    if node.torchrun_argv is not None:
        torchrun = list(node.torchrun_argv)
        at = torchrun.index("--module") + 1
        if torchrun[at] != BOOTSTRAP:
            return node
        torchrun[at] = WARM_EXEC
        return replace(node, agent_argv=agent, torchrun_argv=tuple(torchrun),
                       worker_argv=(*worker, "--", BOOTSTRAP, *node.worker_argv))
    processes = tuple(replace(p, argv=wrap(p.argv, BOOTSTRAP, worker)) for p in node.processes)
    return replace(node, agent_argv=agent, processes=processes)


def wrap(argv: tuple[str, ...], module: str, options: tuple[str, ...]) -> tuple[str, ...]:
    """``python [flags] -m MODULE ARGS`` as its warm start; anything else unchanged."""
    for i in range(1, len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == module:
            return (*argv[:i], "-m", WARM_EXEC, *options, "--", module, *argv[i + 2:])
    return argv


def script_preloads(spec: JobSpec) -> tuple[str, ...]:
    """The heavy modules (``warm_proto.PRELOADABLE``) the job's script imports, directly or through
    modules next to it; a pool keeps them imported. A script this cannot read imports nothing."""
    entry = spec.entrypoint
    workdir = Path(spec.workdir)
    if entry.kind is EntrypointKind.SCRIPT:
        start = workdir / entry.target
    else:
        start = workdir.joinpath(*entry.target.split(".")).with_suffix(".py")
        if not start.is_file():
            start = workdir.joinpath(*entry.target.split("."), "__main__.py")
    found: set[str] = set()
    todo, seen = [start], set[Path]()
    while todo and len(seen) < SCAN_LIMIT:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            top = name.partition(".")[0]
            if top in warm_proto.PRELOADABLE:
                found.add(top)
            local = path.parent.joinpath(*name.split(".")).with_suffix(".py")
            package = path.parent.joinpath(*name.split("."), "__init__.py")
            todo += [p for p in (local, package) if p.is_file()]
    return tuple(m for m in warm_proto.PRELOADABLE if m in found)


def _imports(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


# -- the pools of this user -------------------------------------------------------------------


def pools(directory: str | None = None) -> list[dict[str, Any]]:
    """Every pool in ``directory`` (default: this user's), as it describes itself, with ``here``:
    whether it serves this interpreter (``executable``: the environment's Python); a socket nobody
    answers on is reported ``"dead"`` and removed."""
    directory = directory or warm_proto.pool_dir(os.environ)
    found = []
    for sock_path in sorted(Path(directory).glob("*.sock")) if Path(directory).is_dir() else []:
        answer = warm_proto.ask(str(sock_path), {"op": "status"})
        key = sock_path.stem
        if answer is None:
            sock_path.unlink(missing_ok=True)  # nobody listens: a pool that was killed
            found.append({"key": key, "dead": True})
        elif "busy" in answer:
            found.append({"key": key, "busy": True})
        else:
            found.append({"key": key, **answer, "here": answer.get("executable") == sys.executable,
                          "log": str(sock_path.with_suffix(".log"))})
    return found


def stop(directory: str | None = None, key: str | None = None, everywhere: bool = False) -> list[dict[str, Any]]:
    """Ask pools to stop: the one whose key starts with ``key``; else this interpreter's (another
    environment's pools serve other jobs), or with ``everywhere`` every one of this user. Each
    takes no more requests and exits when the processes it forked have ended. Returns what each
    answered."""
    directory = directory or warm_proto.pool_dir(os.environ)
    stopped = []
    for pool in pools(directory):
        if pool.get("dead") or pool.get("busy"):
            continue
        if key and not pool["key"].startswith(key) or not key and not everywhere and not pool["here"]:
            continue
        answer = warm_proto.ask(os.path.join(directory, f"{pool['key']}.sock"), {"op": "stop"})
        stopped.append({**pool, **(answer or {"stopping": True, "children": []})})
    return stopped
