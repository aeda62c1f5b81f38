"""``phalanx pool status|stop``: the warm interpreter pools of this user (docs/warm.md)."""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

import typer

from .render import dump_json, duration, table

pool_app = typer.Typer(help="See and stop the warm interpreter pools that local runs and sweep trials start from.",
                       no_args_is_help=True, add_completion=False, rich_markup_mode=None)


def _mib(pool: dict[str, Any], key: str) -> str:
    size = (pool.get("memory") or {}).get(key)
    return f"{size / (1 << 20):.0f}M" if size is not None else "-"


@pool_app.command("status")
def status_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """One line per pool: what it holds, what it runs, its memory (RSS; PSS counts pages shared
    with the processes it forked once per sharer), and when it exits if left idle."""
    from ..launch.warm import plan as warm

    pools = warm.pools()
    if as_json:
        dump_json(pools, sys.stdout)
        return
    if not pools:
        typer.echo("no warm pools (the next local run starts one)")
        return
    rows = []
    for p in pools:
        if p.get("dead") or p.get("busy"):
            rows.append((p["key"], "-", "dead (removed)" if p.get("dead") else "busy (importing)", "-", "-", "-", "-", "-"))
            continue
        state = "stopping" if p["stopping"] else "cannot fork: " + p["refusal"] if p["refusal"] else "ready"
        idle = "-" if p["children"] else duration(max(0.0, p["idle_exit"] - p["idle_for"]))
        rows.append((p["key"], str(p["pid"]), state, ",".join(p["preloaded"]), str(len(p["children"])),
                     f"{p['served']}/{p['fallbacks']}", f"{_mib(p, 'rss')}/{_mib(p, 'pss')}", idle))
    table(rows, ("POOL", "PID", "STATE", "HOLDS", "RUNNING", "FORKED/COLD", "RSS/PSS", "EXITS IN"), sys.stdout)
    for p in pools:
        if p.get("last_fallback"):
            typer.echo(f"{p['key']}: last cold start: {p['last_fallback']} (log: {p['log']})")


@pool_app.command("stop")
def stop_cmd(
    key: Optional[str] = typer.Argument(None, help="A pool (a prefix of its key); default: all of them."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the pools have exited."),
) -> None:
    """Stop pools: they take no more work and exit once the processes they forked have ended."""
    from ..errors import UsageError
    from ..launch.warm import plan as warm

    stopped = warm.stop(key=key)
    if key and not stopped:
        raise UsageError(f"no warm pool '{key}'", "see: phalanx pool status")
    for pool in stopped:
        running = pool.get("children") or []
        after = f"; it exits when its {len(running)} running process(es) end" if running else ""
        typer.echo(f"stopping pool {pool['key']} (pid {pool['pid']}){after}")
    if wait:
        _wait_gone([p["pid"] for p in stopped if not p.get("children")])


def _wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    import os

    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _alive(pid, os)]
        time.sleep(0.05)


def _alive(pid: int, os: Any) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
