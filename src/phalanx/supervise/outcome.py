"""How an attempt ended, from its nodes' results: succeeded, failed (with the root cause),
stalled, stopped (cancelled, preempted, pruned), or taken by a scheduler.

The root cause is the first failure by timestamp across all ranks and nodes, enriched with the
rank's own exception record (``error.json``) and the end of its log.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.contracts import NodeResult, OutcomeKind, StopReason, read_rank_error
from ..core.paths import JobPaths
from ..errors import ContractError
from ..launch.procs import signal_name

LOG_TAIL_LINES = 20


@dataclass
class Outcome:
    kind: OutcomeKind
    exit_code: int
    cause: dict[str, Any] | None = None

    def short(self) -> str:
        """One line for ``attempts.jsonl`` and the supervisor's messages."""
        cause = self.cause or {}
        where = f"rank {cause['rank']}: " if "rank" in cause else ""
        return f"{where}{error_text(cause) or self.kind.value}"


def error_text(cause: dict[str, Any]) -> str:
    """``KeyError: 'batch_size'``: a root cause's exception type and message, as Python prints
    them (the message alone, such as a signal's, when there is no type)."""
    message = str(cause.get("message") or "").strip()
    kind = cause.get("type")
    return f"{kind}: {message}" if kind and message else str(kind or message)


def failed(message: str, attempt: int | None = None) -> Outcome:
    """A failure before or around the ranks (inputs, state, submission): exit code 1."""
    cause: dict[str, Any] = {"exitcode": 1, "message": message}
    if attempt is not None:
        cause["attempt"] = attempt
    return Outcome(OutcomeKind.FAILED, 1, cause)


def decide(paths: JobPaths, attempt: int, results: list[NodeResult], stop: StopReason | None, stop_signal: int,
           stalled_for: float | None, stall_timeout: float | None, failed_first: list[int] | None) -> Outcome:
    """The outcome of an attempt whose nodes have all ended (``results`` in node order)."""
    if stop is StopReason.CANCELLED and stop_signal == signal.SIGINT:
        return interrupted(results)
    if stop is StopReason.CANCELLED and stop_signal == signal.SIGPIPE:
        return output_closed()
    if stop is not None:
        return Outcome(stop.outcome, 128 + int(stop_signal))
    if stalled_for is not None:
        return Outcome(OutcomeKind.STALLED, 124, {
            "exitcode": 124,
            "message": f"no output from any rank for {stalled_for:.0f}s "
                       f"(--stall-timeout {stall_timeout or 0:g}); each rank's Python stacks were dumped to its log",
        })
    if all(r.exitcode == 0 for r in results):
        return Outcome(OutcomeKind.SUCCEEDED, 0)
    taken = taken_by_scheduler(results, failed_first)
    if taken is not None:
        return Outcome(OutcomeKind.PREEMPTED, taken, {"exitcode": taken, "requeue": True, "message":
                       "the nodes were stopped by a signal phalanx did not send (a scheduler's preemption or time limit)"})
    cause = root_cause(paths, attempt, results, failed_first)
    return Outcome(OutcomeKind.FAILED, int(cause.get("exitcode") or 1), cause)


def interrupted(results: list[NodeResult]) -> Outcome:
    """After Ctrl-C the outcome is the script's, as under python: one that caught the
    KeyboardInterrupt and exited 0 succeeded; otherwise the job is cancelled with the script's
    exit code (130 for an uncaught KeyboardInterrupt, its ``sys.exit`` code, 128+N for a
    signal), which ``phalanx run`` exits with. Never retried: a person asked it to stop."""
    codes = [r.exitcode for r in results]
    if all(code == 0 for code in codes):
        return Outcome(OutcomeKind.SUCCEEDED, 0, {"exitcode": 0, "message": "interrupted (Ctrl-C); the script exited 0"})
    code = next(code for code in codes if code != 0)
    how = f"killed by {signal_name(code)}" if signal_name(code) else f"exit {code}"
    return Outcome(OutcomeKind.CANCELLED, code, {"exitcode": code, "message": f"interrupted (Ctrl-C); {how}"})


def output_closed() -> Outcome:
    """The reader of the ranks' streamed output went away (``phalanx run -n 2 gen.py | head -1``)
    and the ranks were stopped: the job ends as python's does when its stdout's reader goes
    (BrokenPipeError, exit 1). Not retried: nobody reads a second attempt's output either."""
    return Outcome(OutcomeKind.FAILED, 1, {
        "exitcode": 1, "type": "BrokenPipeError", "output_closed": True,
        "message": "[Errno 32] Broken pipe: the reader of phalanx's output went away, and the ranks were stopped"})


def taken_by_scheduler(results: list[NodeResult], first: list[int] | None) -> int | None:
    """The exit code when the nodes that failed first (``first``, else all that failed) were
    stopped by a signal the supervisor did not send (a scheduler preempting the job, or its
    time limit coming): the job was taken, not broken. A node whose end was not seen as its
    agent reported it (a lost ssh link: 255) was not taken."""
    failed = [results[n] for n in (first if first is not None else range(len(results))) if results[n].exitcode]
    if failed and all(r.stopped_by and not r.failures for r in failed):
        return int(failed[0].exitcode or 1)
    return None


def rank_failures(paths: JobPaths, attempt: int, results: list[NodeResult]) -> list[dict[str, Any]]:
    """Every rank failure reported by the node agents, enriched with the rank's error.json."""
    failures = []
    for node_rank, result in enumerate(results):
        for failure in result.failures:
            entry = dict(failure.to_dict(), node_rank=node_rank, host=result.host)
            try:
                error = read_rank_error(paths.rank_error(attempt, failure.rank))
            except ContractError:
                error = None  # the agent's report stands on its own
            if error is not None:
                entry.update(timestamp=error.timestamp, type=error.type, message=error.message, traceback=error.traceback)
            failures.append(entry)
    return failures


def root_cause(paths: JobPaths, attempt: int, results: list[NodeResult],
               failed_first: list[int] | None = None) -> dict[str, Any]:
    """The first failure by timestamp; falls back to the first failed node agent: of the nodes
    that failed before the supervisor stopped the rest (``failed_first``), else in node order."""
    failures = rank_failures(paths, attempt, results)
    if failures:
        first = dict(min(failures, key=lambda f: f["timestamp"]))
        first["attempt"] = attempt
        first["log_tail"] = tail(paths.rank_log(attempt, first["rank"]))
        first["log"] = str(paths.rank_log(attempt, first["rank"]))
        if not first.get("message"):
            sig = first.get("signal")
            first["message"] = f"killed by {sig}" if sig else f"exited with code {first['exitcode']}"
        return first
    order = [*(failed_first or []), *range(len(results))]
    for node_rank in order:
        code = results[node_rank].exitcode
        health = results[node_rank].details.get("health")
        if code != 0 and isinstance(health, dict) and health.get("ok") is False:
            log = paths.agent_log(attempt, node_rank)
            where = results[node_rank].details.get("node_name") or results[node_rank].host
            return {"attempt": attempt, "node_rank": node_rank, "exitcode": code, "host": where,
                    "message": f"node {node_rank} ({where}) failed its health check: {health.get('reason')}",
                    "log": str(log), "log_tail": tail(log)}
        if code != 0:
            log = paths.agent_log(attempt, node_rank)
            sig = signal_name(code)
            return {
                "attempt": attempt,
                "node_rank": node_rank,
                "exitcode": code,
                "signal": sig,
                "message": f"node agent {node_rank} {'was killed by ' + sig if sig else f'exited with code {code}'}",
                "log": str(log),
                "log_tail": tail(log),
            }
    return {"attempt": attempt, "exitcode": 1, "message": "the job failed for an unknown reason"}


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log (read from its last 16 KiB)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
