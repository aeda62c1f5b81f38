"""``phalanx ps | status | logs | wait | stop | resume``: look after jobs once they run. Thin:
parse, one call on the face (``cli/face.py``), render.

Registered on the main app by ``register(app)``; ``run`` shares ``event``, ``parse_ranks`` and
``report_end`` with ``resume``.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import typer

from .args import PROJECT_HELP, count, job_ref, project_scope, seconds


def register(app: typer.Typer) -> None:
    from .listing import ps_cmd
    from .status import status_cmd

    app.command("ps")(ps_cmd)
    app.command("status")(status_cmd)
    app.command("logs")(logs_cmd)
    app.command("wait")(wait_cmd)
    app.command("stop")(stop_cmd)
    app.command("resume")(resume_cmd)


def event(text: str) -> None:
    sys.stderr.write(f"phalanx: {text}\n")
    sys.stderr.flush()


def started_in_background(ref: str, sweep: bool = False) -> None:
    """``-d``: the id went to stdout; one line on stderr says how to follow and stop it."""
    event(f"{'sweep' if sweep else 'job'} {ref} runs in the background; follow it: phalanx logs -f {ref}; "
          f"stop it: phalanx stop {ref}")


def parse_ranks(text: str | None) -> set[int] | None:
    from ..errors import UsageError

    if not text:
        return None
    try:
        return {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise UsageError(f"invalid --ranks '{text}'", "use rank numbers separated by commas, e.g. --ranks 0,1") from None


def report_end(record: dict[str, Any], shown: set[int] | None) -> None:
    """The end line of a foreground run: succeeded in 1m32s / failed: where and why / cancelled."""
    from .render import duration

    err = sys.stderr
    took = duration(record["duration"])
    state = record["state"]
    if state == "SUCCEEDED":
        err.write(f"phalanx: job {record['id']} ({record['name']}) succeeded in {took}\n")
        return
    if state == "CANCELLED":
        err.write(f"phalanx: job {record['id']} ({record['name']}) cancelled after {took}\n")
        return
    if state == "PREEMPTED":
        err.write(f"phalanx: job {record['id']} preempted after {took}; continue it with: phalanx resume {record['id']}\n")
        return
    cause = record.get("root_cause") or {}
    if state == "TIMEOUT" or cause.get("anomaly"):
        what = "timed out" if state == "TIMEOUT" else "stopped"
        err.write(f"phalanx: job {record['id']} ({record['name']}) {what} after {took}: {cause.get('message')}; "
                  f"see `phalanx status {record['id']}`" + (f", continue it with: phalanx resume {record['id']}"
                                                              if state == "TIMEOUT" else "") + "\n")
        return
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
    hint = f"phalanx logs {record['id']}" + (f" --rank {rank}" if rank is not None else "")
    err.write(f"phalanx: job {record['id']} {state.lower()} after {took}: {' on '.join(where) or 'job'} "
              f"({how}){msg}; see `{hint}` and `phalanx status {record['id']}`\n")


def logs_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
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
    from .face import face

    def emit(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    face().logs(job, emit, follow=follow, rank=rank, attempt=attempt, tail=tail, since=since, trial=trial, events=event)


def wait_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name (or a sweep)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", callback=seconds, help="Give up after this many seconds (exit 124)."),
    progress: bool = typer.Option(False, "--progress", "-p", help="Say the job's progress and ETA on stderr as it goes."),
) -> None:
    """Block until the job ends; exit with the job's exit code. A sweep: 0 when it succeeded
    (with at least one trial that did), 1 when it failed."""
    from .face import face

    done = face().wait(job, timeout=timeout, progress=_progress_printer() if progress else None)
    if progress and sys.stderr.isatty():
        sys.stderr.write("\n")  # below the line redrawn in place
    if done["kind"] == "sweep":
        best = f", best {done['objective']}={done['best_value']:.6g}" if done["best_value"] is not None else ""
        reason = f"; {done['reason']}" if done.get("reason") else ""
        typer.echo(f"{done['id']} {done['state']}: {done['progress']} trials ({done['failed']} failed, "
                   f"{done['pruned']} pruned){best}{reason}", err=True)
    else:
        typer.echo(f"{done['id']} {done['state']}" + ("" if done["exit_code"] is None else f" (exit {done['exit_code']})"),
                   err=True)
    raise typer.Exit(done["wait_code"])


def _progress_printer() -> Any:
    """``wait --progress``: at a terminal one line redrawn in place; otherwise a line whenever the
    progress moved, at most every ``EVERY`` seconds."""
    import time

    every = 1.0 if sys.stderr.isatty() else 10.0
    last: dict[str, Any] = {"at": 0.0, "text": ""}

    def show(seen: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - float(last["at"]) < every:
            return
        last["at"] = now
        health = seen["health"]
        words = (health["progress"] or {}).get("words") or "no progress printed yet"
        if health["straggler"]:
            words += f"; {health['straggler']['short']}"
        text = f"{seen['id']} {seen['state']}: {words}"
        if text == last["text"]:
            return
        last["text"] = text
        sys.stderr.write(("\r\x1b[2K" + text) if sys.stderr.isatty() else text + "\n")
        sys.stderr.flush()

    return show


def stop_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name."),
    timeout: Optional[float] = typer.Option(
        None, "--timeout", callback=seconds, help="Seconds to wait for the ranks to stop (default: the job's grace + 15). "
        "The upload of outputs and state that follows is waited for in full."),
    now: bool = typer.Option(False, "--now", "--force", help="Skip the grace period (also of a stop under way): "
                             "SIGTERM, then SIGKILL at once."),
) -> None:
    """Stop a job gracefully (SIGTERM to every rank, its grace period, then SIGKILL), or a sweep
    with all its running trials. Stopping a job that is stopping already changes nothing
    (its ranks keep their grace period) unless --now."""
    from .face import face

    done = face().stop(job, timeout=timeout, events=event, now=now)
    typer.echo(f"{done['id']} {done['state']}")


def resume_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name."),
    detach: bool = typer.Option(False, "-d", "--detach", help="[default: as phalanx run started it] Resume in the background."),
    attach: bool = typer.Option(False, "--attach", help="[default: as phalanx run started it] Resume here, in the foreground."),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="Only show the output of these ranks."),
) -> None:
    """Continue a failed, cancelled, preempted or lost job from its state directory (a new
    attempt), or a sweep: only the trials that did not finish run. It runs as `phalanx run`
    started it (in the background after -d) unless -d or --attach says otherwise."""
    from ..errors import UsageError
    from .face import face

    if detach and attach:
        raise UsageError("-d and --attach both given", "pick one: -d resumes in the background, --attach here")
    rank_filter = parse_ranks(ranks)
    done, code = face().resume(job, detach=True if detach else False if attach else None, out=sys.stdout,
                               ranks=rank_filter, events=event)
    if done["detached"]:
        typer.echo(done["id"])
        started_in_background(done["id"], sweep=done["kind"] == "sweep")
        return
    if done["kind"] == "sweep":
        typer.echo(f"phalanx: sweep {done['id']} {done['state'].lower()}: {done['progress']} trials", err=True)
        raise typer.Exit(code or 0)
    report_end(done, shown=rank_filter)
    raise typer.Exit(code if code is not None else 0)
