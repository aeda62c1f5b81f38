"""One view of a job, as data: what ``phalanx status`` prints and the dashboard's job page shows,
built once (here) and rendered twice (``cli/status.py``, the page's script). A view: it reads the
store and the job directory and writes nothing.

Everything in the view is JSON (a server sends it as it is): the record, the ranks of the latest
attempt, the attempts with their outcomes, where the supervisor and the scheduler's job are,
usage, the metric summary and hints (or why there are no metrics), the resources of a job too
short to chart in one row per node, the root cause with its rank and error and the ranks that only
lost their peer (``failure.py``), the tracker runs, and what the asker may do with the job.
"""

from __future__ import annotations

import json
import socket
from dataclasses import asdict
from typing import Any

from ..core.contracts import read_node_result
from ..core.identity import Principal
from ..core.paths import read_json
from ..core.state import RESUMABLE, is_terminal
from ..store import JobRecord, Store
from . import query

# The settings shown on a job's page when they differ from these defaults.
_SETTING_DEFAULTS: dict[str, Any] = {"max_retries": 0, "max_restarts": 0, "grace": 30.0, "framework": "torch"}
_SETTINGS = ("max_retries", "max_restarts", "grace", "stall_timeout", "state_uri", "output_uri", "notify", "framework",
             "workdir")


def actions(record: JobRecord, principal: Principal) -> list[str]:
    """What the asker may do with the job now: stop while it runs; resume, retry and delete once
    it ended (a sweep's trial: resume only). None of it for someone who may not act on it (a
    viewer of its project, a member on another's job)."""
    if not principal.may_act_on(record.user_name, record.project):
        return []
    if not is_terminal(record.state):
        return ["stop"]
    out = ["resume"] if record.state in RESUMABLE else []
    return [*out, "retry", "delete"] if record.sweep_id is None else out


def job_view(record: JobRecord, principal: Principal, store: Store | None = None) -> dict[str, Any]:
    """The whole view of ``record`` (as it stands now: ``query.get_job``'s) for ``principal``."""
    from ..monitor.accounting import job_usage
    from ..monitor.hints import hints
    from ..monitor.report import recent_metrics, resource_summary, status_summary_lines
    from ..monitor.resources import recent_resources
    from ..store.listing import tags_of
    from ..supervise import admission
    from ..supervise.liveness import elsewhere
    from .lists import short_command

    store = store or query.open_store()
    view = record.to_dict()
    view["world_size"] = record.nnodes * record.nproc_per_node
    view["duration"] = record.duration
    view["topology"] = record.topology
    view["command_short"] = short_command(record.command)
    view["terminal"] = is_terminal(record.state)
    view["ranks"] = [asdict(r) for r in query.rank_statuses(record)]
    view["attempt_history"] = query.attempt_history(record)
    view["attempts"] = timeline(record, view["attempt_history"])
    scheduled = query.scheduler_job(record)
    view["scheduler"] = scheduled.to_dict() if scheduled else None
    queued = scheduled.details.get("queued") if scheduled is not None and not view["terminal"] else None
    waiting = admission.waiting_line(store, record)  # its project's queue, before any scheduler's
    view["queued"] = f"QUEUED: {waiting}" if waiting else f"QUEUED: {queued}" if queued else None
    view["supervisor"] = _supervisor(record, elsewhere(record))
    view["left_running"] = query.left_running(record)
    view["platform_lines"] = query.platform_lines(record)
    spec = json.loads(record.spec_json or "{}")
    view["state_uri"] = spec.get("state_uri")
    view["usage"] = job_usage(record).to_dict()
    view["summary_lines"] = status_summary_lines(record)
    view["hints"] = hints(recent_resources(record.paths, record.attempt), recent_metrics(record.paths, record.attempt))
    view["tags"] = tags_of(store, [record.id]).get(record.id, {})
    view["settings"] = {k: spec.get(k) for k in _SETTINGS
                        if spec.get(k) not in (None, [], "") and spec.get(k) != _SETTING_DEFAULTS.get(k)}
    view["trackers"] = query.trackers(record)
    view["health"] = query.health(record)  # progress and ETA, the slow rank, the anomaly, the stop clocks
    view["actions"] = actions(record, principal)
    view.update(failure_facts(record, view["ranks"]))
    view["resources_summary"] = resource_summary(record.paths) if view["terminal"] else None  # a running job's charts fill in
    view["metrics_note"] = metrics_note(record, view["terminal"])
    if record.sweep_id:
        view["sweep"] = {"id": record.sweep_id, "trial": record.trial, "params": view.get("params")}
    return view


def failure_facts(record: JobRecord, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """How the latest attempt failed, for a reader (``failure.py``): the root-cause rank (the
    log panel opens on it), the ranks that only lost their peer (each marked in ``ranks`` and
    folded under one line), and the root cause's error as Python prints it (type and message)."""
    from ..supervise.outcome import error_text
    from .failure import failure

    failed = failure(record)
    cause = record.root_cause_dict()
    lost = {p.rank: p.to_dict() for p in failed.peer_lost} if failed is not None else {}
    for rank in ranks:
        rank["peer_lost"] = rank["rank"] in lost
    return {"root_cause_rank": failed.rank if failed is not None else None, "peer_lost": list(lost.values()),
            "root_cause_error": error_text(cause) if cause else None}


def metrics_note(record: JobRecord, ended: bool) -> str | None:
    """What to say where a job's metrics would be, when it has none (None when it has some)."""
    from ..monitor.readback import metric_file

    paths = record.paths
    if any(metric_file(paths, a, r) is not None for a in paths.attempts() for r in paths.ranks(a)):
        return None
    how = "print name=value pairs (loss=0.42) or declare one with --metric NAME=REGEX"
    return f"no metrics were reported: {how}" if ended else f"no metrics yet: {how}"


def _supervisor(record: JobRecord, away: bool) -> dict[str, Any] | None:
    """Where the job's supervisor runs (a pid here, or a pod in a cluster), and whether it still does."""
    if not record.supervisor_pid:
        return None
    alive = "running" if not is_terminal(record.state) else "ended"
    if away:  # k8s --in-cluster: a supervisor pod
        return {"where": "cluster", "detail": query.supervised_where(record), "alive": alive}
    return {"where": "pid", "pid": record.supervisor_pid, "host": record.supervisor_host or socket.gethostname(), "alive": alive}


def timeline(record: JobRecord, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per attempt: start, end (None while running), exit code, per-node results, and its
    outcome and retry decision as the supervisor recorded them (``history``: ``attempts.jsonl``)."""
    from ..monitor.resources import node_ranks

    paths = record.paths
    logged = {int(a["attempt"]): a for a in history if "attempt" in a}
    out = []
    for attempt in paths.attempts():
        nodes: list[dict[str, Any]] = []
        for node in node_ranks(paths, attempt):
            result = read_node_result(paths.node_result(attempt, node))
            if result is None:
                nodes.append({"node_rank": node, "host": None, "exitcode": None, "started": None, "finished": None})
            else:
                nodes.append({"node_rank": node, "host": result.host, "exitcode": result.exitcode,
                              "started": result.started, "finished": result.finished})
        starts = [n["started"] for n in nodes if n["started"]]
        for rank in paths.ranks(attempt):
            proc = read_json(paths.rank_proc(attempt, rank)) or {}
            if proc.get("started"):
                starts.append(proc["started"])
        ends: list[float] = [n["finished"] for n in nodes if n["finished"]]
        done = bool(nodes) and len(ends) == len(nodes)
        codes = [n["exitcode"] for n in nodes if n["exitcode"] not in (None, 0)]
        latest = attempt == record.attempt
        entry = logged.get(attempt, {})
        end = max(ends) if done else (record.ended_at if latest and is_terminal(record.state) else None)
        out.append({
            "attempt": attempt,
            "start": min(starts) if starts else entry.get("started") or (record.started_at if latest else None),
            "end": end if end is not None else entry.get("ended"),
            "exitcode": entry.get("exit_code", codes[0] if codes else (0 if done else None)),
            "outcome": entry.get("outcome") or ("running" if latest and not is_terminal(record.state) else None),
            "message": entry.get("message"),
            "retried": entry.get("retry"),
            "reason": entry.get("reason"),
            "nodes": nodes,
        })
    return out
