"""The node's check before an attempt (``--health-check``, ``--health-check-cmd``): run by the
node agent before it starts any rank, so it works wherever agents run (every backend).

The check is a command of the plan (``NodePlan.health_check``): phalanx's own node checks
(``python -m phalanx.health.doctor_probe --node-only``) or the user's shell line. It runs with
the node's environment in the node's working directory; its output goes to the agent's log. A
check that exits 0 passes; any other exit, or no exit within ``TIMEOUT_S``, fails the node: the
agent then starts no rank and reports the attempt failed with ``health`` in its ``result.json``
(``{"ok": false, "reason": ...}``), which the supervisor reads as "leave this node out".

A stop signal during the check ends it (the attempt is stopped, not failed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from ..core.plan import NodePlan
from ..health.checks import FINDING_TAG, REPORT_TAG
from .procs import ChildWatcher, die_with_parent, signal_group

TIMEOUT_S = 300.0
FINDING = FINDING_TAG + "bad: "


@dataclass
class NodeCheck:
    ok: bool
    exitcode: int | None
    reason: str
    seconds: float
    stopped_by: int | None = None
    report: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # A check a stop signal ended said nothing about the node: neither passed nor failed.
        ok = None if self.stopped_by is not None else self.ok
        data: dict[str, Any] = {"ok": ok, "exitcode": self.exitcode, "seconds": round(self.seconds, 3)}
        if self.stopped_by is not None:
            data["stopped_by"] = signal.Signals(self.stopped_by).name
        elif not self.ok:
            data["reason"] = self.reason
        if self.report:
            data["report"] = self.report
        return data


def run_check(argv: tuple[str, ...], cwd: str, watcher: ChildWatcher, timeout: float = TIMEOUT_S) -> NodeCheck:
    """Run the check to its end (blocking, woken by the watcher's signals); its output is copied
    to this process's stdout (the agent's log) and read for phalanx's report and findings."""
    started = time.monotonic()
    print(f"phalanx: checking this node before the attempt: {' '.join(argv)}", flush=True)
    import ctypes  # noqa: F401 - die_with_parent's, imported before the fork and not in the child

    try:
        # Its own session (a stop kills its group: a shell line's children too), and it dies with
        # the agent, which a session of its own would otherwise let it outlive.
        proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(os.environ), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: die_with_parent(signal.SIGKILL))
    except OSError as exc:
        return NodeCheck(False, None, f"could not start {argv[0]}: {exc.strerror or exc}", time.monotonic() - started)
    lines: list[str] = []
    reader = threading.Thread(target=_copy, args=(proc, lines), daemon=True)
    reader.start()
    deadline = started + timeout
    while proc.poll() is None and not watcher.stop_requests and time.monotonic() < deadline:
        watcher.wait(min(0.5, max(0.0, deadline - time.monotonic())))
    timed_out = proc.poll() is None and not watcher.stop_requests
    if proc.poll() is None:  # stopped, or out of time: the check and what it started go
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
    reader.join(timeout=5)
    took = time.monotonic() - started
    report = _report(lines)
    if watcher.stop_requests:
        return NodeCheck(False, proc.returncode, "stopped", took, stopped_by=watcher.stop_requests[0], report=report)
    if timed_out:
        return NodeCheck(False, None, f"the check did not finish within {timeout:g}s", took, report=report)
    if proc.returncode == 0:
        print(f"phalanx: the node passed its check ({took:.1f}s)", flush=True)
        return NodeCheck(True, 0, "", took, report=report)
    return NodeCheck(False, proc.returncode, _reason(lines, proc.returncode), took, report=report)


def _copy(proc: subprocess.Popen[bytes], lines: list[str]) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode(errors="replace")
        lines.append(line.rstrip("\n"))
        sys.stdout.write(line)
        sys.stdout.flush()


def _report(lines: list[str]) -> dict[str, Any]:
    for line in reversed(lines):
        if line.startswith(REPORT_TAG):
            try:
                data = json.loads(line[len(REPORT_TAG):])
                return data if isinstance(data, dict) else {}
            except ValueError:
                return {}
    return {}


def _reason(lines: list[str], code: int) -> str:
    """phalanx's findings when the check is its own; else the last line the command printed."""
    findings = [line[len(FINDING):] for line in lines if line.startswith(FINDING)]
    if findings:
        return "; ".join(findings)
    said = [line.strip() for line in lines if line.strip() and not line.startswith(REPORT_TAG)]
    how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
    return f"{how}: {said[-1][:200]}" if said else how


def check_node(node: NodePlan, watcher: ChildWatcher | None) -> NodeCheck | None:
    """The node's check before the attempt (``NodePlan.health_check``), or None without one."""
    if not node.health_check:
        return None
    with ExitStack() as stack:
        if watcher is None:
            watcher = stack.enter_context(ChildWatcher())
        return run_check(node.health_check, node.cwd, watcher)


def unchecked_result(checked: NodeCheck) -> dict[str, Any]:
    """The attempt's result on a node whose check failed (or was stopped): no rank ran."""
    if checked.stopped_by is not None:
        signum = signal.Signals(checked.stopped_by)
        return {"exitcode": 128 + signum, "failures": [], "stopped_by": signum.name, "health": checked.to_dict()}
    return {"exitcode": 1, "failures": [], "error": f"the node failed its health check: {checked.reason}",
            "health": checked.to_dict()}
