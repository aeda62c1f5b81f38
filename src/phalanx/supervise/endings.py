"""What happens when an attempt, a job or a sweep ends: the job's final state (``record_end``); its usage
(GPU-/CPU-hours, cost) and metric summary are recorded in the store, and its outcome is sent
where ``--notify`` says. Called by ``JobRun`` (job.py) and the sweep runner (one line each).

Nothing here may fail a job: every step is guarded, and a problem is one warning line.
A sweep's trials notify nobody on their own (a 64-trial sweep would send 64 messages); the
sweep's end does, with its best trial and counts.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any, Callable

from ..core.contracts import OutcomeKind
from ..core.state import JobState
from ..launch.procs import signal_name
from ..store import JobRecord, Store
from .notify import Event, send
from .outcome import Outcome

if TYPE_CHECKING:
    from ..monitor.accounting import Usage

Say = Callable[[str], None]
_pending: list[threading.Thread] = []  # notifications of retries still being sent
_lock = threading.Lock()


def attempt_over(run: Any, attempt: int, outcome: Outcome, retry: bool, reason: str) -> None:
    """A ``JobRun``'s attempt ended; with ``retry`` another one starts now (``run.retries``
    not yet counting it). ``run`` is typed Any: job.py imports this module."""
    try:
        from ..monitor import logindex

        logindex.note(run.paths, attempt)
        spec, record = run.spec, run.record
        if not retry or not spec.notify or record.sweep_id is not None:
            return
        kind = outcome.kind.value
        why = {"stalled": "stalled", "preempted": "was preempted"}.get(kind, kind)
        rolled = f"; {reason}" if kind == "diverged" else f"; retrying ({run.retries + 1}/{spec.max_retries})"
        title = f"job {record.id} '{record.name}': attempt {attempt} {why} (exit {outcome.exit_code}){rolled}"
        event = Event("retried", title, record.id, record.name, "RUNNING", _cause_text(outcome.cause),
                      fields={"attempt": attempt, "outcome": kind, "exit_code": outcome.exit_code})
        thread = threading.Thread(target=send, args=(spec.notify, event, run.say), daemon=True)
        thread.start()
        with _lock:
            _pending.append(thread)
    except Exception as exc:  # noqa: BLE001
        run.say(f"warning: after attempt {attempt}: {exc}")


def job_ended(run: Any, outcome: Outcome) -> None:
    """A ``JobRun`` has recorded its final state: record usage and metrics, send the outcome
    (waits for the sending, a few seconds at most: a detached supervisor exits right after)."""
    say: Say = run.say
    try:
        record = run.store.get(run.record.id)
        from . import tracking

        tracking.ended(run.paths, run.spec, record.state.value, record.exit_code,
                       _cause_text(record.root_cause_dict()).split("\n", 1)[0])
        record_usage(run.store, record)
        metrics = record_metrics(run.store, record)
        from ..monitor import logindex

        logindex.forget(run.paths)
        if run.spec.notify and record.sweep_id is None:
            event = job_event(record, outcome.kind.value, summary(record, metrics))
            if event is not None:
                send(run.spec.notify, event, say)
    except Exception as exc:  # noqa: BLE001
        say(f"warning: after the job ended: {exc}")
    finally:
        _flush()


def _flush(timeout: float = 15.0) -> None:
    with _lock:
        threads, _pending[:] = list(_pending), []
    for thread in threads:
        thread.join(timeout)


def record_usage(store: Store, record: JobRecord) -> Usage:
    from ..monitor.accounting import job_usage

    usage = job_usage(record)
    store.update(record.id, gpu_hours=usage.gpu_hours, cpu_hours=usage.cpu_hours, cost=usage.cost)
    return usage


def metric_summary(record: JobRecord) -> dict[str, dict[str, Any]]:
    """Last/min/max/count of every metric of the job's rank 0 (or lowest rank with metrics),
    over all its attempts: what ``phalanx metrics`` shows."""
    from ..monitor.readback import rank_series, summarize_series
    from ..monitor.report import default_rank

    paths = record.paths
    attempts = paths.attempts()
    rank = default_rank(paths, attempts)
    return summarize_series([rank_series(paths, a, rank) for a in attempts]) if rank is not None else {}


def record_metrics(store: Store, record: JobRecord) -> dict[str, dict[str, Any]]:
    from ..store.listing import save_metrics

    metrics = metric_summary(record)
    save_metrics(store, record.id, metrics)
    return metrics


def summary(record: JobRecord, metrics: dict[str, dict[str, Any]]) -> str:
    """One line: how far it got, in how long, the final metrics: ``step 1000/1000 (100%) in
    3h02m; loss=0.123 acc=0.91``."""
    from ..health.progress_file import read

    progress = read(record.paths.health).progress
    parts = [f"{progress.text}" + (f" ({100 * progress.fraction:.0f}%)" if progress.fraction is not None else "")
             if progress else ""]
    if record.duration is not None:
        parts.append(f"in {_took(record.duration)}")
    head = " ".join(p for p in parts if p)
    shown = [f"{name}={m['last']:.4g}" for name, m in list(metrics.items())[:6] if m.get("last") is not None]
    return "; ".join(p for p in (head, " ".join(shown)) if p)


def _cause_text(cause: dict[str, Any] | None) -> str:
    if not cause:
        return ""
    where = f"rank {cause['rank']} on node {cause.get('node_rank')}: " if "rank" in cause else ""
    kind = f"{cause['type']}: " if cause.get("type") else ""
    head = f"{where}{kind}{cause.get('message') or ''}"
    detail = cause.get("traceback") or cause.get("log_tail") or ""
    return head + ("\n" + detail.rstrip() if detail else "")


def job_event(record: JobRecord, kind: str, done: str = "") -> Event | None:
    """The notification of a job's final state (None for the ones nobody needs told:
    cancelled by the user, pruned by its sweep). ``done``: the ``summary`` line (progress,
    time, final metrics), the first line of every event's detail."""
    label = f"job {record.id} '{record.name}'"
    took = f"in {_took(record.duration)}" if record.duration is not None else ""
    fields = {"exit_code": record.exit_code, "topology": record.topology, "backend": record.backend,
              "gpu_hours": record.gpu_hours, "cpu_hours": record.cpu_hours, "cost": record.cost, "summary": done or None}
    cause = record.root_cause_dict() or {}

    def detail(more: str = "") -> str:
        return "\n".join(p for p in (done, more) if p)

    if kind == "succeeded":
        return Event("succeeded", f"{label} succeeded {took}".rstrip(), record.id, record.name, record.state.value,
                     detail(), fields=fields)
    if kind == "stalled":
        return Event("stalled", f"{label} stalled: {cause.get('message', 'no output')}", record.id, record.name,
                     record.state.value, detail(_log_tail(cause)), fields=fields)
    if kind == "preempted":
        return Event("preempted", f"{label} was preempted; continue it with: phalanx resume {record.id}", record.id,
                     record.name, record.state.value, detail(), fields=fields)
    if kind == "timeout":
        return Event("timeout", f"{label} timed out: {cause.get('message', 'a time limit')}; continue it with: "
                     f"phalanx resume {record.id}", record.id, record.name, record.state.value, detail(),
                     fields={**fields, "root_cause": cause or None})
    if kind in ("failed", "diverged"):
        first = _cause_text(cause).split("\n", 1)
        rest = first[1] if len(first) > 1 else ""
        what = "failed" if kind == "failed" else "stopped"
        return Event(kind, f"{label} {what}: {first[0] or 'see phalanx status ' + record.id}", record.id, record.name,
                     record.state.value, detail(rest), fields={**fields, "root_cause": cause or None})
    return None


def _took(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


def _log_tail(cause: dict[str, Any]) -> str:
    return str(cause.get("log_tail") or "")


def sweep_ended(store: Store, sweep_id: str, say: Say) -> None:
    """A sweep's runner has recorded its final state: send its outcome."""
    try:
        import json

        sweep = store.sweeps.get(sweep_id)
        spec = json.loads(sweep.spec_json)
        if spec.get("track"):
            from pathlib import Path

            from ..core.paths import HomePaths
            from . import tracking

            tracking.sweep_ended(HomePaths(Path(sweep.sweep_dir).parent.parent), sweep, spec, say)
        targets = tuple(spec.get("notify") or ())
        if not targets:
            return
        from ..store.listing import usage_sum

        used = usage_sum(store, sweep_id=sweep_id)
        best = ""
        if sweep.best_value is not None:
            best = f"; best {sweep.objective}={sweep.best_value:.6g} (job {sweep.best_job}, {sweep.best_params})"
        title = (f"sweep {sweep.id} '{sweep.name}' {sweep.state.value.lower()}: {sweep.finished}/{sweep.total} trials "
                 f"({sweep.failed} failed, {sweep.pruned} pruned){best}")
        kind = "succeeded" if sweep.state.value == "SUCCEEDED" else "failed" if sweep.state.value == "FAILED" else "sweep"
        send(targets, Event(kind, title, sweep.id, sweep.name, sweep.state.value,
                            fields={"sweep": True, "best_value": sweep.best_value, "best_job": sweep.best_job, **used}), say)
    except Exception as exc:  # noqa: BLE001
        say(f"warning: after the sweep ended: {exc}")


def record_end(store: Store, record: JobRecord, outcome: Outcome) -> int:
    """The job's final state from its last outcome; returns its exit code."""
    code = outcome.exit_code
    kind = outcome.kind
    if kind is OutcomeKind.SUCCEEDED:
        store.transition(record.id, JobState.SUCCEEDED, exit_code=0)
    elif kind is OutcomeKind.CANCELLED:
        if not store.transition(record.id, JobState.CANCELLED, exit_code=code):
            store.transition(record.id, JobState.FAILED, exit_code=code)
    elif kind is OutcomeKind.PRUNED:
        store.transition(record.id, JobState.PRUNED, exit_code=code)
    elif kind is OutcomeKind.TIMEOUT:
        store.transition(record.id, JobState.TIMEOUT, exit_code=code, root_cause=json.dumps(outcome.cause or {}, sort_keys=True))
    elif kind is OutcomeKind.PREEMPTED:
        cause = {"exitcode": code, "message": f"preempted ({signal_name(code)}); continue with: phalanx resume {record.id}"}
        store.transition(record.id, JobState.PREEMPTED, exit_code=code, root_cause=json.dumps(cause, sort_keys=True))
    else:
        store.transition(record.id, JobState.FAILED, exit_code=code, root_cause=json.dumps(outcome.cause, sort_keys=True))
    return code


def watched_objective(store: Store, record: JobRecord) -> str | None:
    """A sweep trial's objective metric (watched for divergence with the losses)."""
    if record.sweep_id is None:
        return None
    try:
        objective = store.sweeps.get(record.sweep_id).objective
    except Exception:  # noqa: BLE001 - a sweep row written by an older phalanx: no objective to watch
        return None
    return str(objective).partition(":")[0] if objective else None
