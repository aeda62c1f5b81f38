"""``phalanx metrics | top | ui``: watch what a job is doing. Thin: parse, call, render.

Registered on the main app by ``register(app)``; imports of the monitor (and of the web stack,
for ``ui``) happen inside the commands so ``phalanx --help`` stays fast.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

import typer

from .args import PROJECT_HELP, count, job_ref, positive_seconds, project_scope


def register(app: typer.Typer) -> None:
    app.command("metrics")(metrics_cmd)
    app.command("top")(top_cmd)
    app.command("ui")(ui_cmd)


def metrics_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name."),
    attempt: Optional[int] = typer.Option(None, "--attempt", callback=count, help="Only this attempt (default: all, a later attempt's value wins at a step)."),
    rank: Optional[int] = typer.Option(None, "--rank", callback=count, help="Rank whose metrics to show (default: 0, or the lowest rank that has any)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    jsonl: bool = typer.Option(False, "--jsonl", help="Every record as a JSON line (name, value, step, epoch, rank, "
                               "attempt, time), all ranks unless --rank: the export of the compact metrics files."),
) -> None:
    """Metrics of a job: last / min / max / count per metric, and a sparkline by step (a
    sweep: every trial's final values)."""
    from .face import face
    from .render import dump_json

    if jsonl:
        face().metric_records(job, _write_out, attempt=attempt, rank=rank)
        return
    report = face().metrics(job, attempt=attempt, rank=rank)
    if report["kind"] == "sweep":
        from .sweepcmds import render_metrics

        render_metrics(report, as_json)
        return
    report.pop("kind")
    ended = report.pop("ended")
    if as_json:
        dump_json(report, sys.stdout)
        return
    out = sys.stdout
    if not report["metrics"]:
        out.write(f"no metrics were reported by job {report['job']} ({report['where']})\n" if ended else
                  f"no metrics for job {report['job']} yet ({report['where']})\n")
        out.write("print name=value numbers, pass --metric NAME=REGEX, or write JSON lines to $PHALANX_METRICS_FILE\n")
        return
    from .render import table

    out.write(f"job {report['job']}  {report['where']}\n\n")
    rows = []
    for name, m in report["metrics"].items():
        step = "-" if m["last_step"] is None else str(m["last_step"])
        rows.append((name, _num(m["last"]), _num(m["min"]), _num(m["max"]), str(m["count"]), step, m["sparkline"]))
    table(rows, ("METRIC", "LAST", "MIN", "MAX", "COUNT", "STEP", "BY STEP"), out)


def _write_out(text: str) -> None:
    sys.stdout.write(text)


def _num(value: float) -> str:
    return f"{value:.6g}"


def top_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name."),
    interval: float = typer.Option(2.0, "--interval", callback=positive_seconds, help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once", help="Print one frame and exit (what it does anyway when not on a terminal)."),
) -> None:
    """Live CPU, RAM, GPU use per node and rank of a job (from its resource samples)."""
    from .face import face

    if interval <= 0:
        from ..errors import UsageError

        raise UsageError(f"invalid --interval {interval:g}", "use a number of seconds above 0, e.g. --interval 2")
    frame = face().top(job)
    if once or frame["terminal"] or not sys.stdout.isatty():  # piped or logged: one snapshot
        _render_top(frame, sys.stdout)
        return
    from rich.console import Console
    from rich.live import Live

    console = Console()
    with Live(_top_renderable(frame), console=console, refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(interval)
            frame = face().top(frame["id"])
            live.update(_top_renderable(frame))
            if frame["terminal"]:
                return


def _top_rows(frame: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for node in frame["nodes"]:
        gpus = node.get("gpus") or []
        gpu = ", ".join(f"{g.get('util', '-')}%" for g in gpus) or "-"
        gmem = ", ".join(_mem(g.get("mem_used"), g.get("mem_total")) for g in gpus) or "-"
        rows.append((f"node {node['node_rank']}", node.get("host", "-"), f"{node.get('cpu_percent', 0):.0f}%",
                     _mem(node.get("mem_used"), node.get("mem_total")), gpu, gmem, _age(node.get("age"))))
        for rank, r in sorted(node.get("ranks", {}).items(), key=lambda kv: int(kv[0])):
            gm = "-" if r.get("gpu_mem") is None else _bytes(r["gpu_mem"])
            rows.append((f"  rank {rank}", f"pid {r.get('pid')}" + (f" +{r['procs'] - 1} children" if r.get("procs", 1) > 1 else ""), f"{r.get('cpu_percent', 0):.0f}%",
                         _bytes(r.get("rss")), "", gm, ""))
    return rows


TOP_HEADERS = ("WHERE", "HOST / PROCESS", "CPU", "MEMORY", "GPU UTIL", "GPU MEMORY", "SAMPLED")


def _render_top(frame: dict[str, Any], out: Any) -> None:
    from .render import table

    out.write(_top_title(frame) + "\n\n")
    if not frame["nodes"]:
        out.write("no resource samples yet\n")
    else:
        table(_top_rows(frame), TOP_HEADERS, out)
    for hint in frame["hints"]:
        out.write(f"hint: {hint}\n")


def _top_renderable(frame: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(*TOP_HEADERS, box=None, pad_edge=False)
    for row in _top_rows(frame):
        table.add_row(*row)
    parts: list[Any] = [Text(_top_title(frame)), table if frame["nodes"] else Text("no resource samples yet")]
    parts.extend(Text(f"hint: {h}", style="yellow") for h in frame["hints"])
    return Group(*parts)


def _top_title(frame: dict[str, Any]) -> str:
    return f"job {frame['job']}  {frame['state']}  attempt {frame['attempt']}  {time.strftime('%H:%M:%S')}"


def _bytes(value: Any) -> str:
    if value is None:
        return "-"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "-"


def _mem(used: Any, total: Any) -> str:
    if used is None or not total:
        return "-"
    return f"{_bytes(used)} / {_bytes(total)} ({100 * used / total:.0f}%)"


def _age(seconds: Any) -> str:
    return "-" if seconds is None else f"{seconds:.0f}s ago"


def ui_cmd(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; any other than loopback is served with a token (made for you)."),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="Port (default 0: a free one)."),
    token: Optional[str] = typer.Option(None, "--token", help="Require this token (16+ characters; default: a strong one is made when not on loopback)."),
) -> None:
    """Serve the dashboard (jobs and sweeps: filter, compare, stop, resume, delete; logs, metric
    and resource charts, artifacts) until Ctrl-C."""
    from ..web.server import serve  # without the web extra: main's one line naming it (EXTRAS)

    def announce(url: str) -> None:
        typer.echo(f"phalanx ui: {url}  (Ctrl-C stops)")
        sys.stdout.flush()

    def warn(text: str) -> None:
        typer.echo(text, err=True)

    serve(host=host, port=port, token=token, announce=announce, warn=warn)
