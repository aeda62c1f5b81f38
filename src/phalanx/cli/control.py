"""``phalanx ps | status | logs | wait | stop | resume``: look after jobs once they run. Thin:
parse, call the library (``phalanx.jobs`` to act, ``phalanx.query`` to look), render.

Registered on the main app by ``register(app)``; ``run`` shares ``event``, ``parse_ranks`` and
``report_end`` with ``resume``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Iterator, Optional

import typer

if TYPE_CHECKING:
    from ..store import JobRecord
    from ..store.sweeps import SweepRecord


def register(app: typer.Typer) -> None:
    app.command("ps")(ps_cmd)
    app.command("status")(status_cmd)
    app.command("logs")(logs_cmd)
    app.command("wait")(wait_cmd)
    app.command("stop")(stop_cmd)
    app.command("resume")(resume_cmd)


def event(text: str) -> None:
    sys.stderr.write(f"phalanx: {text}\n")
    sys.stderr.flush()


def parse_ranks(text: str | None) -> set[int] | None:
    from ..errors import UsageError

    if not text:
        return None
    try:
        return {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise UsageError(f"invalid --ranks '{text}'", "use rank numbers separated by commas, e.g. --ranks 0,1") from None


def report_end(record, shown: set[int] | None) -> None:  # type: ignore[no-untyped-def]
    from ..core.state import JobState

    err = sys.stderr
    if record.state is JobState.SUCCEEDED:
        return
    if record.state is JobState.CANCELLED:
        err.write(f"phalanx: job {record.id} cancelled\n")
        return
    if record.state is JobState.PREEMPTED:
        err.write(f"phalanx: job {record.id} preempted; continue it with: phalanx resume {record.id}\n")
        return
    cause = record.root_cause_dict() or {}
    where = []
    if "rank" in cause:
        where.append(f"rank {cause['rank']}")
    if cause.get("node_rank") is not None:
        where.append(f"node {cause['node_rank']}")
    how = f"killed by {cause['signal']}" if cause.get("signal") else f"exit code {cause.get('exitcode')}"
    msg = cause.get("message") or ""
    if cause.get("type"):
        msg = f"{cause['type']}: {msg}"
    msg = "" if msg in ("", how) else f": {msg}"  # a signal's message is only its name
    err.write(f"phalanx: job {record.id} {record.state.value.lower()}: {' on '.join(where) or 'job'} ({how}){msg}\n")
    if shown is not None and cause.get("rank") not in shown and cause.get("traceback"):
        err.write(cause["traceback"])
    rank = cause.get("rank")
    hint = f"phalanx logs {record.id}" + (f" --rank {rank}" if rank is not None else "")
    err.write(f"phalanx: see `{hint}` and `phalanx status {record.id}`\n")


def ps_cmd(
    all_jobs: bool = typer.Option(False, "-a", "--all", help="Show finished jobs too."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many jobs (default 50 with --all)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List jobs and sweeps: running ones, or all with --all (newest first). A sweep is one row."""
    import heapq
    import itertools

    from .. import config, query
    from ..store import JobRecord
    from .render import PS_HEADERS, dump_json_stream, job_rows, sweep_row, table

    if limit is None and all_jobs:
        limit = int(config.get("ps_limit"))
    store = query.open_store()
    records = query.iter_jobs(all_jobs=all_jobs, limit=limit, store=store)  # a page at a time
    sweeps = query.list_sweeps(all_sweeps=all_jobs, limit=limit, store=store)
    if as_json:
        rows = itertools.chain((r.to_dict() for r in records), ({**s.to_dict(), "kind": "sweep"} for s in sweeps))
        dump_json_stream(rows, sys.stdout)
        return
    def created(row: JobRecord | SweepRecord) -> float:
        return row.created_at

    newest: Iterator[JobRecord | SweepRecord] = heapq.merge(records, sweeps, key=created, reverse=True)  # both newest first
    shown = [job_rows([r])[0] if isinstance(r, JobRecord) else sweep_row(r) for r in itertools.islice(newest, limit)]
    if not shown:
        typer.echo("no running jobs (phalanx ps --all shows finished ones)" if not all_jobs else "no jobs yet")
        return
    table(shown, PS_HEADERS, sys.stdout)


def status_cmd(
    job: str = typer.Argument(..., help="Job id, id prefix or name."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Details of a job: state, per-rank exit codes and the root-cause error."""
    import socket
    from dataclasses import asdict

    from .. import query
    from ..core.state import is_terminal
    from .render import ago, dump_json, duration, table

    record = query.get_job(job)
    ranks = query.rank_statuses(record)
    if as_json:
        scheduler = query.scheduler_job(record)
        dump_json({**record.to_dict(), "ranks": [asdict(r) for r in ranks], "attempts": query.attempt_history(record),
                   "scheduler": scheduler.to_dict() if scheduler else None}, sys.stdout)
        return
    out = sys.stdout
    code = "" if record.exit_code is None else f"  (exit {record.exit_code})"
    out.write(f"job       {record.id}  {record.name}\n")
    out.write(f"state     {record.state.value}{code}\n")
    waiting = _queued(record) if not is_terminal(record.state) else None
    if waiting:
        out.write(f"queued    {waiting}\n")
    out.write(f"command   {record.command}\n")
    out.write(f"topology  {record.topology} on {record.backend}   attempt {record.attempt}\n")
    out.write(f"created   {ago(record.created_at)}   duration {duration(record.duration)}\n")
    out.write(f"dir       {record.job_dir}\n")
    if record.supervisor_pid:
        alive = "running" if not is_terminal(record.state) else "ended"
        out.write(f"supervisor pid {record.supervisor_pid} on {socket.gethostname()} ({alive})\n")
    scheduled = query.scheduler_job(record)
    if scheduled and scheduled.job_id:
        at = f" at {scheduled.address}" if scheduled.address else ""
        out.write(f"scheduler {scheduled.scheduler.upper()} job {scheduled.job_id}{at}\n")
    left = query.left_running(record)
    if left:
        out.write(f"left      {left} still runs without a supervisor: `phalanx resume {record.id}` watches it "
                  f"again, `phalanx stop {record.id}` stops it\n")
    out.writelines(line + "\n" for line in query.platform_lines(record))
    spec = query.read_spec(record)
    if spec.state_uri:
        synced = ago(record.state_synced_at) if record.state_synced_at else "never"
        out.write(f"state     {spec.state_uri}  (last upload: {synced})\n")
    attempts = query.attempt_history(record)
    if len(attempts) > 1 or record.retries:
        out.write("\nattempts:\n")
        for a in attempts:
            retry = "retried" if a["retry"] else a["reason"]
            code = "-" if a["exit_code"] is None else str(a["exit_code"])
            out.write(f"  {a['attempt']}  {a['outcome']:<9} exit {code:<4} {duration(a['ended'] - a['started']):>7}  {a['message'][:70]}  [{retry}]\n")
    if ranks:
        out.write("\n")
        rows = [
            (str(r.rank), "-" if r.node_rank is None else str(r.node_rank), r.host or "-", str(r.pid or "-"),
             "-" if r.exitcode is None else str(r.exitcode) + (f" ({r.signal})" if r.signal else ""), r.state)
            for r in ranks
        ]
        table(rows, ("RANK", "NODE", "HOST", "PID", "EXIT", "STATE"), out)
    from ..monitor.report import status_summary_lines

    summary = status_summary_lines(record)
    if summary:
        out.write("\n" + "\n".join(summary) + "\n")
    cause = record.root_cause_dict()
    if cause:
        where = f"rank {cause['rank']} on node {cause.get('node_rank')}" if "rank" in cause else f"node {cause.get('node_rank', '?')}"
        out.write(f"\nroot cause: {where}: {cause.get('message')}\n")
        if cause.get("host"):
            out.write(f"  host: {cause['host']}\n")
        detail = cause.get("traceback") or cause.get("log_tail")
        if detail:
            out.write("  " + detail.rstrip().replace("\n", "\n  ") + "\n")
        if cause.get("log"):
            out.write(f"log: {cause['log']}\n")


def _queued(record) -> str | None:  # type: ignore[no-untyped-def]
    """What a scheduler holds the current attempt back for (the backend's ``queued`` detail in
    the attempt's scheduler.json: Kubernetes' Unschedulable message, a Kueue queue), or None."""
    from .. import query

    scheduled = query.scheduler_job(record)
    note = scheduled.details.get("queued") if scheduled is not None else None
    return f"QUEUED: {note}" if note else None


def logs_cmd(
    job: str = typer.Argument(..., help="Job id, id prefix or name."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new output until the job ends."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Only this rank (raw, no prefix)."),
    attempt: Optional[int] = typer.Option(None, "--attempt", help="Attempt number (default: the latest)."),
) -> None:
    """Print a job's per-rank output (all ranks with a [rank] prefix, or one with --rank)."""
    from .. import query

    record = query.get_job(job)

    def emit(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    query.follow_logs(record, emit, attempt=attempt, rank=rank, follow=follow)


def wait_cmd(
    job: str = typer.Argument(..., help="Job id, id prefix or name."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Give up after this many seconds (exit 124)."),
) -> None:
    """Block until the job ends; exit with the job's exit code."""
    from .. import jobs

    record = jobs.wait(job, timeout=timeout)
    typer.echo(f"{record.id} {record.state.value}" + ("" if record.exit_code is None else f" (exit {record.exit_code})"), err=True)
    raise typer.Exit(record.exit_code if record.exit_code is not None else 1)


def stop_cmd(
    job: str = typer.Argument(..., help="Job id, id prefix or name."),
    timeout: Optional[float] = typer.Option(
        None, "--timeout", min=0, help="Seconds to wait for the ranks to stop (default: the job's grace + 15). "
        "The upload of outputs and state that follows is waited for in full."),
) -> None:
    """Stop a job gracefully (SIGTERM to every rank, its grace period, then SIGKILL), or a sweep
    with all its running trials."""
    from .. import jobs, query

    sweep = query.find_sweep(job)
    if sweep is not None:
        sweep = jobs.stop_sweep(sweep, timeout=timeout)
        typer.echo(f"{sweep.id} {sweep.state.value}")
        return
    record = jobs.stop(job, timeout=timeout, events=event)
    typer.echo(f"{record.id} {record.state.value}")


def resume_cmd(
    job: str = typer.Argument(..., help="Job id, id prefix or name."),
    detach: bool = typer.Option(False, "-d", "--detach", help="Resume in the background."),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="Only show the output of these ranks."),
) -> None:
    """Continue a failed, cancelled, preempted or lost job from its state directory (a new
    attempt), or a sweep: only the trials that did not finish run."""
    from .. import jobs, query

    sweep = query.find_sweep(job)
    if sweep is not None:
        sweep, code = jobs.resume_sweep(sweep, detach=detach, events=event)
        typer.echo(sweep.id if detach else f"phalanx: sweep {sweep.id} {sweep.state.value.lower()}: {sweep.progress} trials",
                   err=not detach)
        raise typer.Exit(code or 0)
    rank_filter = parse_ranks(ranks)
    record, code = jobs.resume(job, detach=detach, out=sys.stdout, ranks=rank_filter, events=event)
    if detach:
        typer.echo(record.id)
        return
    report_end(record, shown=rank_filter)
    raise typer.Exit(code if code is not None else 0)
