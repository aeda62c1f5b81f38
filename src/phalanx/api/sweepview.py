"""A sweep seen as a whole: its trial table, waiting for it, and its trials' logs. What
``phalanx sweep show``, ``status``/``logs``/``metrics``/``wait`` given a sweep, and the
dashboard's sweep page read. Read-only (waiting and following only watch).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable

from ..core.paths import JobPaths
from ..core.state import JobState, is_terminal
from ..store import JobRecord, Store


def param_order(sweep: Any) -> list[str]:
    """The sweep's parameters in the order the command line gives them."""
    return list(param_scales(sweep))


def param_scales(sweep: Any) -> dict[str, str]:
    """The sweep's parameters in command-line order, each with the scale of its axis on a plot
    (``sweeps.space.Param.scale``: log, categorical or linear)."""
    try:
        from ..sweeps.space import parse_space

        args = json.loads(sweep.spec_json)["entrypoint"]["args"]
        return {p.name: p.scale for p in parse_space(args).params}
    except Exception:  # noqa: BLE001 - a spec of another version: the trials' order will do
        return {}


def pruned_info(record: JobRecord) -> dict[str, Any] | None:
    """For a pruned trial: the step it was stopped at, its objective then, and why (the sweep
    runner records them)."""
    if record.state is not JobState.PRUNED:
        return None
    cause = record.root_cause_dict() or {}
    return {"step": cause.get("pruned_step"), "value": cause.get("value"),
            "reason": cause.get("message") or "pruned by the sweep's early stopping"}


def trial_table(store: Store, sweep: Any) -> dict[str, Any]:
    """One row per trial: trial number, job id, state, parameters, objective, the final value
    of every other metric, duration, usage, and for pruned trials the step and the reason;
    sorted by the objective (best first; trials without one last, in trial order)."""
    from ..store.listing import metrics_of
    from ..supervise.endings import metric_summary
    from ..supervise.liveness import effective

    trials = [effective(t) for t in store.trials(sweep.id)]  # a vanished runner's trials: LOST (not written)
    recorded = metrics_of(store, [t.id for t in trials])
    scales = param_scales(sweep)
    params: list[str] = list(scales)
    metrics: list[str] = []
    rows = []
    for t in trials:
        summary = recorded.get(t.id)
        if summary is None and (t.sweep_id is not None) and (not is_terminal(t.state) or t.gpu_hours is None):
            summary = metric_summary(t)
        summary = summary or {}
        values = json.loads(t.params_json or "{}")
        params.extend(k for k in values if k not in params)
        metrics.extend(k for k in summary if k not in metrics and k != sweep.objective)
        rows.append({
            "trial": t.trial, "id": t.id, "state": t.state.value, "params": values,
            "objective": t.objective if t.objective is not None else _live_objective(sweep, t, summary),
            "final": t.objective is not None,
            "metrics": {name: m.get("last") for name, m in summary.items()},
            "duration": t.duration, "gpu_hours": t.gpu_hours, "cpu_hours": t.cpu_hours, "cost": t.cost,
            "attempt": t.attempt, "exit_code": t.exit_code, "pruned": pruned_info(t),
            "last_value": _last_value(sweep, t, summary),
            "best": t.id == sweep.best_job,
        })
    sign = -1.0 if sweep.direction == "max" else 1.0
    rows.sort(key=lambda r: (r["objective"] is None or not math.isfinite(r["objective"]),
                             sign * (r["objective"] if r["objective"] is not None and math.isfinite(r["objective"]) else 0.0),
                             r["trial"] if r["trial"] is not None else 0))
    hidden = {"step", "epoch"}
    return {"params": params, "scales": {p: scales.get(p, "linear") for p in params},
            "metrics": [m for m in metrics if m not in hidden], "objective": sweep.objective,
            "direction": sweep.direction, "rows": rows}


def _last_value(sweep: Any, trial: JobRecord, summary: dict[str, Any]) -> float | None:
    """The objective's last value a trial reported (a pruned trial's value when it was stopped)."""
    if not sweep.objective:
        return None
    cause = trial.root_cause_dict() or {}
    if trial.state is JobState.PRUNED and isinstance(cause.get("value"), (int, float)):
        return float(cause["value"])
    value = (summary.get(sweep.objective) or {}).get("last")
    return float(value) if value is not None else None


def _live_objective(sweep: Any, trial: JobRecord, summary: dict[str, Any]) -> float | None:
    """A running trial's latest objective value (shown, not used to rank it as final)."""
    if not sweep.objective or trial.state is not JobState.RUNNING:
        return None
    value = (summary.get(sweep.objective) or {}).get("last")
    return float(value) if value is not None else None


def sweep_view(store: Store, sweep: Any) -> dict[str, Any]:
    """The sweep as ``sweep show`` and ``status SWEEP`` show it: its record, progress and usage
    (``lists.sweep_row``), the trial table and every trial's record."""
    from ..supervise.liveness import effective
    from .lists import sweep_row

    table = trial_table(store, sweep)
    trials = {t.id: effective(t) for t in store.trials(sweep.id)}  # LOST with their runner (computed, not written)
    from .query import sweep_tracker

    return {**sweep_row(store, sweep), "table": table, "param_order": param_order(sweep), "tracker": sweep_tracker(sweep),
            "trials": [trials[r["id"]].to_dict() for r in table["rows"] if r["id"] in trials]}


def trial_list(store: Store, sweep: Any) -> dict[str, Any]:
    """``ps --trials SWEEP``: the sweep's trials in trial order, each its record plus how a person
    reads its state (``PRUNED@120``, ``FAILED(1)``)."""
    from ..supervise.liveness import effective

    rows = []
    for trial in store.trials(sweep.id):
        trial = effective(trial)
        pruned = pruned_info(trial)
        if pruned is not None and pruned.get("step") is not None:
            shown = f"PRUNED@{pruned['step']}"
        else:
            shown = trial.state.value if trial.exit_code in (None, 0) else f"{trial.state.value}({trial.exit_code})"
        rows.append({**trial.to_dict(), "_state": shown, "_duration": trial.duration})
    return {"sweep": {"id": sweep.id, "objective": sweep.objective}, "param_order": param_order(sweep), "rows": rows}


def sweep_exit_code(sweep: Any) -> int:
    """``wait``'s exit code: 0 when the sweep succeeded with at least one successful trial, 1
    when it failed (or none of its trials succeeded), 128+signal style codes when stopped."""
    if sweep.state is JobState.SUCCEEDED:
        return 0 if sweep.finished > sweep.failed + sweep.pruned or sweep.best_job else 1
    if sweep.state is JobState.CANCELLED:
        return 130
    if sweep.state is JobState.PREEMPTED:
        return 143
    return 1


def follow_sweep_logs(store: Store, sweep_id: str, emit: Callable[[str], None], follow: bool, rank: int | None = 0,
                      trial: int | None = None, tail: int | None = None, poll: float = 0.5,
                      refresh: Callable[[str], Any] | None = None) -> None:
    """Every trial's output (rank 0 unless ``rank``), each line prefixed ``[trial N]``; with
    ``follow``, new lines as trials print them, until the sweep ends."""
    from ..monitor.logindex import tail_offset

    get = refresh or store.sweeps.get
    offsets: dict[tuple[str, int, int], int] = {}
    while True:
        sweep = get(sweep_id)
        ended = is_terminal(sweep.state)
        for record in store.trials(sweep_id):
            if trial is not None and record.trial != trial:
                continue
            paths = JobPaths(Path(record.job_dir))
            for attempt in paths.attempts():
                for r in paths.ranks(attempt):
                    if rank is not None and r != rank:
                        continue
                    key = (record.id, attempt, r)
                    log = paths.rank_log(attempt, r)
                    if key not in offsets:
                        offsets[key] = tail_offset(log, tail) if tail is not None else 0
                    offsets[key] = _emit_new(log, offsets[key], f"[trial {record.trial}" + (f" rank {r}" if rank is None else "") + "] ",
                                             emit, final=ended or not follow)
        if ended or not follow:
            return
        time.sleep(poll)


def _emit_new(log: Path, offset: int, prefix: str, emit: Callable[[str], None], final: bool) -> int:
    try:
        with open(log, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return offset
    if not final:
        data = data[: data.rfind(b"\n") + 1]
    if data:
        text = data.decode(errors="replace")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        emit("".join(f"{prefix}{line}\n" for line in lines))
    return offset + len(data)
