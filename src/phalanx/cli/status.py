"""``phalanx status``: one call on the face (the job's view, ``api/jobview.py``, or a sweep's),
rendered. The dashboard's job page renders the same view."""

from __future__ import annotations

import sys
from typing import Any, Optional, TextIO

import typer

from .args import PROJECT_HELP, job_ref, project_scope


def status_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Details of a job: state, per-rank exit codes and the root-cause error (or of a sweep:
    its progress and trial table)."""
    from .face import face
    from .render import dump_json

    found = face().status(job)
    if found["kind"] == "sweep":
        from .sweepcmds import render_sweep_status

        render_sweep_status(found, as_json)
        return
    if as_json:  # the view, with ``attempts`` the recorded history as before the view (its timeline: ``timeline``)
        dump_json({**{k: v for k, v in found.items() if k not in ("attempts", "attempt_history")},
                   "attempts": found["attempt_history"], "timeline": found["attempts"]}, sys.stdout)
        return
    render(found, sys.stdout)


def render(view: dict[str, Any], out: TextIO) -> None:
    from .manage import usage_text
    from .render import ago, duration, table

    code = "" if view["exit_code"] is None else f"  (exit {view['exit_code']})"
    out.write(f"job       {view['id']}  {view['name']}\n")
    out.write(f"state     {view['state']}{code}\n")
    if view.get("queued"):
        out.write(f"queued    {view['queued']}\n")
    out.write(f"command   {view['command']}\n")
    out.write(f"topology  {view['topology']} on {view['backend']}   attempt {view['attempt']}\n")
    out.write(f"created   {ago(view['created_at'])}   duration {duration(view['duration'])}\n")
    out.write(f"dir       {view['job_dir']}\n")
    out.write(usage_text(view["usage"]))
    supervisor = view.get("supervisor")
    if supervisor:
        if supervisor["where"] == "cluster":
            out.write(f"supervisor in the cluster ({supervisor['alive']}): {supervisor['detail']}\n")
        else:
            out.write(f"supervisor pid {supervisor['pid']} on {supervisor['host']} ({supervisor['alive']})\n")
    scheduled = view.get("scheduler")
    if scheduled and scheduled.get("job_id"):
        at = f" at {scheduled['address']}" if scheduled.get("address") else ""
        out.write(f"scheduler {scheduled['scheduler'].upper()} job {scheduled['job_id']}{at}\n")
    if view.get("left_running"):
        out.write(f"left      {view['left_running']} still runs without a supervisor: `phalanx resume {view['id']}` "
                  f"watches it again, `phalanx stop {view['id']}` stops it\n")
    out.writelines(line + "\n" for line in view["platform_lines"])
    if view.get("state_uri"):
        synced = ago(view["state_synced_at"]) if view.get("state_synced_at") else "never"
        out.write(f"state     {view['state_uri']}  (last upload: {synced})\n")
    for line in view["health"]["lines"]:  # progress and ETA, the slow rank, the stop clocks
        out.write(f"{line['label']:<9} {line['text']}\n")
    for tracker in view["trackers"]:
        out.write(f"{tracker['kind']:<9} {tracker['line']}\n")
    attempts = view["attempt_history"]
    if len(attempts) > 1 or view["retries"]:
        out.write("\nattempts:\n")
        for a in attempts:
            retry = ("retried" if a["reason"] in ("retryable", "") else a["reason"]) if a["retry"] else a["reason"]
            code = "-" if a["exit_code"] is None else str(a["exit_code"])
            out.write(f"  {a['attempt']}  {a['outcome']:<9} exit {code:<4} {duration(a['ended'] - a['started']):>7}  "
                      f"{a['message'][:70]}  [{retry}]\n")
    out.writelines(_left_out_lines(attempts))
    if view["ranks"]:
        out.write("\n")
        rows = [
            (str(r["rank"]), "-" if r["node_rank"] is None else str(r["node_rank"]), r["host"] or "-", str(r["pid"] or "-"),
             "-" if r["exitcode"] is None else str(r["exitcode"]) + (f" ({r['signal']})" if r["signal"] else ""),
             r["state"] + (" (root cause)" if r["rank"] == view.get("root_cause_rank") else
                           " (lost its peer)" if r.get("peer_lost") else ""))
            for r in view["ranks"]
        ]
        table(rows, ("RANK", "NODE", "HOST", "PID", "EXIT", "STATE"), out)
    lines = [*view["summary_lines"], *(f"resources {line}" for line in _resources(view.get("resources_summary")))]
    if view.get("metrics_note"):
        lines.insert(0, f"metrics   {view['metrics_note']}")
    if lines:
        out.write("\n" + "\n".join(lines) + "\n")
    _root_cause(view, out)


def _left_out_lines(attempts: list[dict[str, Any]]) -> list[str]:
    """Which nodes an attempt's end pointed at, why, and whether the next attempt left them out."""
    lines = [f"  {n['node']} after attempt {a['attempt']}: {n['why']} ({n.get('how', '')})\n"
             for a in attempts for n in a.get("left_out", ())]
    return ["\nnodes found bad:\n", *lines] if lines else []


def _resources(summary: dict[str, Any] | None) -> list[str]:
    from ..monitor.report import resource_summary_line

    return [resource_summary_line(row) for row in summary["nodes"]] if summary else []


def _root_cause(view: dict[str, Any], out: TextIO) -> None:
    cause = view.get("root_cause")
    if not cause:
        return
    where = f"rank {cause['rank']} on node {cause.get('node_rank')}: " if "rank" in cause else (
        f"node {cause['node_rank']}: " if cause.get("node_rank") is not None else "")
    out.write(f"\nroot cause: {where}{view.get('root_cause_error') or cause.get('message')}\n")
    if cause.get("host"):
        out.write(f"  host: {cause['host']}\n")
    detail = cause.get("traceback") or cause.get("log_tail")
    if detail:
        out.write("  " + detail.rstrip().replace("\n", "\n  ") + "\n")
    if cause.get("log"):
        out.write(f"log: {cause['log']}\n")
    for lost in view.get("peer_lost") or []:
        out.write(f"{lost['line']} ({lost['error']}; phalanx logs {view['id']} --rank {lost['rank']})\n")
