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
    """One line per pool of this user: its environment (the Python it serves), what it holds,
    what it runs, its memory (RSS; PSS counts pages shared with the processes it forked once per
    sharer), and when it exits if left idle."""
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
            rows.append((p["key"], "-", "dead (removed)" if p.get("dead") else "busy (importing)", "-", "-", "-", "-", "-",
                         "-"))
            continue
        state = "stopping" if p["stopping"] else "cannot fork: " + p["refusal"] if p["refusal"] else "ready"
        idle = "-" if p["children"] else duration(max(0.0, p["idle_exit"] - p["idle_for"]))
        python = _home(p.get("executable") or "?") + ("" if p.get("here") else " (other)")
        rows.append((p["key"], str(p["pid"]), state, python, ",".join(p["preloaded"]), str(len(p["children"])),
                     f"{p['served']}/{p['fallbacks']}", f"{_mib(p, 'rss')}/{_mib(p, 'pss')}", idle))
    table(rows, ("POOL", "PID", "STATE", "PYTHON", "HOLDS", "RUNNING", "FORKED/COLD", "RSS/PSS", "EXITS IN"), sys.stdout)
    for p in pools:
        if p.get("last_fallback"):
            typer.echo(f"{p['key']}: last cold start: {p['last_fallback']} (log: {p['log']})")
    others = sum(1 for p in pools if "here" in p and not p["here"])
    if others:
        typer.echo(f"{others} pool(s) serve another Python ((other)): phalanx pool stop leaves them, --all stops them too")


def _home(path: str) -> str:
    import os

    home = os.path.expanduser("~")
    return "~" + path[len(home):] if home != "/" and path.startswith(home + os.sep) else path


@pool_app.command("stop")
def stop_cmd(
    key: Optional[str] = typer.Argument(None, help="A pool (a prefix of its key)."),
    everywhere: bool = typer.Option(False, "--all", help="Every pool of this user, whatever Python it serves."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="[default: --wait] Wait until the pools have exited."),
) -> None:
    """Stop pools: they take no more work and exit once the processes they forked have ended.
    [default: the pools of this Python (this environment), not those of other environments]"""
    from ..errors import UsageError
    from ..launch.warm import plan as warm

    if key and everywhere:
        raise UsageError("a pool's key and --all both given", "pick one")
    stopped = warm.stop(key=key, everywhere=everywhere)
    if key and not stopped:
        raise UsageError(f"no warm pool '{key}'", "see: phalanx pool status")
    for pool in stopped:
        running = pool.get("children") or 0
        count = running if isinstance(running, int) else len(running)
        after = f"; it exits when its {count} running process(es) end" if count else ""
        typer.echo(f"stopping pool {pool['key']} (pid {pool['pid']}, {_home(pool.get('executable') or '?')}){after}")
    if not stopped:
        typer.echo(f"no warm pool of {_home(sys.executable)} (phalanx pool stop --all: every pool of this user)")
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
