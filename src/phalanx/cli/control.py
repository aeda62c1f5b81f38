"""``phalanx ps | status | logs | wait | stop | resume``: look after jobs once they run. Thin:
parse, call the library (``phalanx.jobs`` to act, ``phalanx.query`` to look), render.

Registered on the main app by ``register(app)``; ``run`` shares ``event``, ``parse_ranks`` and
``report_end`` with ``resume``.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from .args import count, job_ref, seconds


def register(app: typer.Typer) -> None:
    from .listing import ps_cmd

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
    """The end line of a foreground run: succeeded in 1m32s / failed: where and why / cancelled."""
    from ..core.state import JobState
    from .render import duration

    err = sys.stderr
    took = duration(record.duration)
    if record.state is JobState.SUCCEEDED:
        err.write(f"phalanx: job {record.id} ({record.name}) succeeded in {took}\n")
        return
    if record.state is JobState.CANCELLED:
        err.write(f"phalanx: job {record.id} ({record.name}) cancelled after {took}\n")
        return
    if record.state is JobState.PREEMPTED:
        err.write(f"phalanx: job {record.id} preempted after {took}; continue it with: phalanx resume {record.id}\n")
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
    if shown is not None and cause.get("rank") not in shown and cause.get("traceback"):
        err.write(cause["traceback"])
    rank = cause.get("rank")
    hint = f"phalanx logs {record.id}" + (f" --rank {rank}" if rank is not None else "")
    err.write(f"phalanx: job {record.id} {record.state.value.lower()} after {took}: {' on '.join(where) or 'job'} "
              f"({how}){msg}; see `{hint}` and `phalanx status {record.id}`\n")


def status_cmd(
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Details of a job: state, per-rank exit codes and the root-cause error (or of a sweep:
    its progress and trial table)."""
    import socket
    from dataclasses import asdict

    from .. import query
    from . import sweepcmds

    sweep = sweepcmds.sweep_named(job)
    if sweep is not None:
        sweepcmds.status(sweep, as_json)
        return
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
    from .manage import usage_line

    out.write(usage_line(record))
    if record.supervisor_pid:
        alive = "running" if not is_terminal(record.state) else "ended"
        from ..supervise.liveness import elsewhere

        if elsewhere(record):  # k8s --in-cluster: a supervisor pod
            out.write(f"supervisor in the cluster ({alive}): {query.supervised_where(record)}\n")
        else:
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
    out.writelines(_left_out_lines(attempts))
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


def _left_out_lines(attempts: list[dict]) -> list[str]:  # type: ignore[type-arg]
    """Which nodes an attempt's end pointed at, why, and whether the next attempt left them out."""
    lines = [f"  {n['node']} after attempt {a['attempt']}: {n['why']} ({n.get('how', '')})\n"
             for a in attempts for n in a.get("left_out", ())]
    return ["\nnodes found bad:\n", *lines] if lines else []


def _queued(record) -> str | None:  # type: ignore[no-untyped-def]
    """What a scheduler holds the current attempt back for (the backend's ``queued`` detail in
    the attempt's scheduler.json: Kubernetes' Unschedulable message, a Kueue queue), or None."""
    from .. import query

    scheduled = query.scheduler_job(record)
    note = scheduled.details.get("queued") if scheduled is not None else None
    return f"QUEUED: {note}" if note else None


def logs_cmd(
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name (or a sweep: its trials' logs)."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new output until the job ends."),
    rank: Optional[int] = typer.Option(None, "--rank", callback=count, help="Only this rank (raw, no prefix)."),
    attempt: Optional[int] = typer.Option(None, "--attempt", callback=count, help="Attempt number (default: the latest)."),
    tail: Optional[int] = typer.Option(None, "--tail", "-n", help="Only the last N lines of each rank (then follow, with -f)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only what was printed since: 10m, 2h, 2025-03-01T14:30."),
    trial: Optional[int] = typer.Option(None, "--trial", callback=count, help="A sweep: only this trial."),
) -> None:
    """Print a job's per-rank output (all ranks with a [rank] prefix, or one with --rank); a
    sweep's: every trial's rank 0, prefixed [trial N]."""
    from .. import query
    from . import sweepcmds
    from .manage import log_offsets

    if tail is not None and tail < 0:
        from ..errors import UsageError

        raise UsageError(f"invalid --tail {tail}", "give a number of lines, e.g. --tail 20")
    sweep = sweepcmds.sweep_named(job)
    if sweep is not None:
        sweepcmds.logs(sweep, follow, rank, trial, tail)
        return
    record = query.get_job(job)

    def emit(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    offsets = log_offsets(record, attempt, rank, tail, since, event) if (tail is not None or since) else None
    query.follow_logs(record, emit, attempt=attempt, rank=rank, follow=follow, offsets=offsets)


def wait_cmd(
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name (or a sweep)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", callback=seconds, help="Give up after this many seconds (exit 124)."),
) -> None:
    """Block until the job ends; exit with the job's exit code. A sweep: 0 when it succeeded
    (with at least one trial that did), 1 when it failed."""
    from .. import jobs
    from . import sweepcmds

    sweep = sweepcmds.sweep_named(job)
    if sweep is not None:
        sweepcmds.wait(sweep, timeout)

    record = jobs.wait(job, timeout=timeout)
    typer.echo(f"{record.id} {record.state.value}" + ("" if record.exit_code is None else f" (exit {record.exit_code})"), err=True)
    raise typer.Exit(record.exit_code if record.exit_code is not None else 1)


def stop_cmd(
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name."),
    timeout: Optional[float] = typer.Option(
        None, "--timeout", callback=seconds, help="Seconds to wait for the ranks to stop (default: the job's grace + 15). "
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
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name."),
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
