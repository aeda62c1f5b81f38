"""The sweep runner: one process that packs trials onto the free slots and drives them.

Every trial is a full job (its own record, logs, metrics, state directory, retries) driven
by a :class:`~phalanx.supervise.job.JobRun` in this process's single event loop, so a
trial costs no extra supervisor interpreter. Work per event is constant: counters and the
best trial live in the sweep row, nothing is recomputed over the trials done so far.

Runs in the ``phalanx run`` process for foreground sweeps, and as
``python -m phalanx.sweeps.runner SWEEP_ID`` for detached ones.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from dataclasses import asdict, dataclass
from typing import Any, Callable

from .. import config
from ..backends.registry import get_backend
from ..core.contracts import OutcomeKind, StopReason
from ..core.identity import DEFAULT_PROJECT
from ..core.paths import HomePaths
from ..core.spec import Entrypoint, JobSpec
from ..core.state import JobState, is_terminal
from ..launch.procs import ChildWatcher
from ..store import JobRecord, Store, open_store
from ..store.sweeps import SweepRecord
from ..supervise import endings, leasing, liveness
from ..supervise.job import JobRun
from ..supervise.relay import SelfLease, StopRelay, lease_ttl
from ..supervise.submit import create_job, new_job_id, plan_attempt, plan_job
from .collisions import Collisions
from .settings import SCHEDULED_PARALLEL, SweepSettings, check, parse_objective, slot_plan
from .space import parse_space

__all__ = ["SCHEDULED_PARALLEL", "SweepRunner", "SweepSettings", "check", "create_sweep", "parse_objective", "slot_plan"]

Events = Callable[[str], None]


@dataclass
class _Trial:
    number: int
    run: JobRun
    slot: int
    params: dict[str, Any]
    offset: int = 0
    attempt: int = 0
    last_value: float | None = None


class SweepRunner:
    def __init__(self, store: Store, home: HomePaths, sweep: SweepRecord, events: Events | None = None) -> None:
        self.store = store
        self.home = home
        self.sweep = sweep
        self.say = events or (lambda text: None)
        self.spec = sweep.spec
        self.settings = SweepSettings.from_dict(json.loads(sweep.settings_json))
        self.space = parse_space(self.spec.entrypoint.args)
        self.strategy = check(self.spec, self.space, self.settings, home.sweep_sampler(sweep.id))
        self.slots = slot_plan(self.spec, self.settings.parallel)
        self.best = sweep.best_value
        self.total = self.strategy.total
        # Trials whose processes run here: whether two of them write one file is seen as they run.
        self.collisions = Collisions(self.say) if get_backend(self.spec.backend).local_slots else None
        self.over_budget = ""  # why no more trials start: the project's budget is spent

    def run(self, lease_ttl: float | None = None) -> int:
        """Blocking; main thread. Returns 0 when every trial ended, else the stop's exit code.
        ``lease_ttl``: a team server's replica started this runner, which keeps the sweep's lease
        itself and stamps it on its trials (``supervise/relay.py``)."""
        identity = liveness.identity()
        todo = self._todo()
        free = list(range(len(self.slots)))
        running: dict[int, _Trial] = {}
        stop_kind: StopReason | str | None = None  # or "failed": a trial failed with --fail-fast
        stop_signal: int = signal.SIGTERM
        seen = 0
        asked_elsewhere = StopRelay(self.home.sweep_stop_request(self.sweep.id))
        own_lease = SelfLease(lambda: open_store(self.home.db), self.sweep.id, lease_ttl, liveness.HOST, table="sweeps")
        with ChildWatcher() as watcher, own_lease:
            if not self.store.sweeps.transition(self.sweep.id, JobState.RUNNING, **identity):
                return 1
            while True:
                if asked_elsewhere.due() is not None:  # a stop asked on another machine: as its SIGTERM
                    watcher.stop_requests.append(signal.SIGTERM)
                if own_lease.taken is not None:
                    why = (f"sweep {self.sweep.id} was taken over by replica {own_lease.taken}: this machine lost the "
                           "job store for longer than its lease; ending this copy of its trials, recording nothing")
                    for trial in running.values():
                        trial.run.abandon(why)
                    self.say(why)
                    return 1
                if len(watcher.stop_requests) > seen:
                    stop_signal = watcher.stop_requests[seen]
                    seen = len(watcher.stop_requests)
                    if stop_kind is None:
                        stop_kind = self._stop_kind(stop_signal)
                    for trial in running.values():
                        trial.run.stop(stop_kind if isinstance(stop_kind, StopReason) else StopReason.CANCELLED, stop_signal)
                # Trial by trial: while one waits in its project's queue no other is started (a quota
                # of 4 GPUs runs a 32-trial sweep 4 at a time), and none once the budget is spent.
                while stop_kind is None and free and todo and not self.over_budget and \
                        not any(t.run.queued for t in running.values()):
                    if self._over_budget():
                        break
                    number = todo.pop(0)
                    slot = free.pop(0)
                    running[number] = self._launch(number, slot, identity)
                freed = False
                for number, trial in list(running.items()):
                    trial.run.tick()
                    self._follow_metrics(trial)
                    if trial.run.done:
                        del running[number]
                        free.append(trial.slot)
                        freed = True
                        if self._ended(trial) == "failed" and self.settings.fail_fast and stop_kind is None:
                            stop_kind = "failed"
                            for other in running.values():
                                other.run.stop(StopReason.CANCELLED)
                if not running and (stop_kind is not None or not todo or self.over_budget):
                    break
                self._look_for_collisions(running)
                if freed and todo and stop_kind is None:
                    continue  # a slot just freed up: fill it now, not after the next wake-up
                hints = [t.run.wait_hint() for t in running.values()] or [0.0]
                watcher.wait(min(hints))
        if self.over_budget and todo and stop_kind is None:
            stop_kind = "failed"  # trials it could not start: the sweep did not finish
        code = self._finish(stop_kind, stop_signal)
        endings.sweep_ended(self.store, self.sweep.id, self.say)  # notify
        return code

    def _over_budget(self) -> bool:
        """The next trial would cross its project's budget: no more start (those running finish)."""
        from ..errors import OverBudget
        from ..supervise.budget import check_job

        try:
            check_job(self.store, self.spec)
        except OverBudget as exc:
            self.over_budget = str(exc)
            self.say(f"no more trials start: {exc}")
            return True
        return False

    def _todo(self) -> list[int]:
        """Trial numbers still to run: all of them, less those that ended in an earlier run."""
        finished = set()
        self._cut_off: dict[int, JobRecord] = {}  # trials an earlier run started but did not finish
        for record in self.store.trials(self.sweep.id):
            if record.trial is None:
                continue
            if record.state not in (JobState.SUCCEEDED, JobState.FAILED, JobState.PRUNED, JobState.TIMEOUT):
                self._cut_off[record.trial] = record
                continue
            finished.add(record.trial)
            params = json.loads(record.params_json or "{}")
            state = {"SUCCEEDED": "complete", "PRUNED": "pruned"}.get(record.state.value, "fail")
            self.strategy.remember(params, record.objective, state, self._by_step(record))
        return [n for n in range(self.total) if n not in finished]

    def _by_step(self, record: JobRecord) -> dict[int, float]:
        """A finished trial's objective by step (for the pruner of a resumed sweep)."""
        if not self.settings.objective or not self.settings.early_stop:
            return {}
        from ..monitor.readback import by_step_series, rank_series

        paths = record.paths
        parts = [rank_series(paths, a, 0, [self.settings.objective]).get(self.settings.objective) for a in paths.attempts()]
        return {step: value for step, value in by_step_series(p for p in parts if p is not None) if step is not None}

    def _launch(self, number: int, slot: int, identity: dict[str, Any]) -> _Trial:
        if number in self._cut_off:  # cut off by a crash or a stop: it continues where it was
            return self._resume_trial(self._cut_off.pop(number), number, slot, identity)
        params = self.strategy.params_for(number)
        self.strategy.start(number, params)
        env = {
            **self.spec.env,
            "PHALANX_SWEEP_ID": self.sweep.id,
            "PHALANX_TRIAL_ID": str(number),
            "PHALANX_PARAMS": json.dumps(params, sort_keys=True),
        }
        if self.slots[slot] is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.slots[slot])
        ep = self.spec.entrypoint
        spec = self.spec.with_(
            entrypoint=Entrypoint(ep.kind, ep.target, self.space.apply(params), ep.typed),
            name=f"{self.sweep.name}-{number}", env=env,
            # A named sweep's trial N shares state with trial N of its earlier runs; otherwise each its own.
            state_name=f"{self.spec.state_name}-{number}" if self.spec.state_name else "",
        )
        job_id = new_job_id(self.home)
        spec = trial_arguments(spec, self.home, self.sweep.id, number, job_id)
        plan = plan_job(spec, self.home, job_id)
        record = create_job(self.store, self.home, spec, plan, sweep_id=self.sweep.id, trial=number,
                            params_json=json.dumps(params, sort_keys=True), user_name=self.sweep.user_name or config.user(),
                            project=self.sweep.project, **identity)
        self.store.sweeps.count(self.sweep.id, "launched")
        run = JobRun(self.store, self.home, record, plan, self.say)
        run.start(identity)
        return _Trial(number, run, slot, params)

    def _look_for_collisions(self, running: dict[int, _Trial]) -> None:
        if self.collisions is None or len(running) < 2:
            return
        from ..monitor.resources import rank_pids

        self.collisions.look({n: rank_pids(t.run.paths, t.run.plan.attempt).values() for n, t in running.items()})

    def _resume_trial(self, record: JobRecord, number: int, slot: int, identity: dict[str, Any]) -> _Trial:
        """A trial cut off by a crash or a stop continues as a new attempt of the same job."""
        if not is_terminal(record.state):  # its runner (an earlier one) is gone: record it
            self.store.transition(record.id, JobState.LOST, root_cause=liveness.lost_cause(record))
        params = json.loads(record.params_json or "{}")
        self.strategy.start(number, params)
        spec = record.spec
        attempt = max([*record.paths.attempts(), record.attempt]) + 1
        plan = plan_attempt(get_backend(spec.backend), spec, record.id, attempt, self.home)
        self.store.reopen(record.id, attempt, **identity)
        run = JobRun(self.store, self.home, self.store.get(record.id), plan, self.say)
        run.start(identity)
        return _Trial(number, run, slot, params)

    def _follow_metrics(self, trial: _Trial) -> None:
        """Feed the objective's values by step to the pruner; stop the trial if it says so."""
        name = self.settings.objective
        if not name or trial.run.queued is not None:
            return
        from ..monitor.readback import read_since

        attempt = trial.run.plan.attempt
        if attempt != trial.attempt:
            trial.attempt, trial.offset = attempt, 0
        records, trial.offset = read_since(trial.run.paths, attempt, 0, trial.offset, [name])
        for rec in records:
            if rec.get("name") != name:
                continue
            trial.last_value = float(rec["value"])
            step = rec.get("step")
            if step is not None and not trial.run.done and self.strategy.report(trial.number, int(step), trial.last_value):
                why = self.strategy.why_pruned(trial.number, int(step), trial.last_value)
                self.say(f"trial {trial.number} pruned at step {step} ({name}={trial.last_value:g}): {why}")
                # sweep show and the dashboard say at which step and why
                self.store.update(trial.run.record.id, root_cause=json.dumps(
                    {"message": f"pruned: {why}", "pruned_step": int(step), "value": trial.last_value, "exitcode": None}))
                trial.run.stop(StopReason.PRUNED)
                break

    def _ended(self, trial: _Trial) -> str:
        outcome = trial.run.outcome.kind.value if trial.run.outcome else OutcomeKind.FAILED.value
        value = trial.last_value if outcome == "succeeded" else None
        state = {"succeeded": "complete", "pruned": "pruned"}.get(outcome, "fail")
        if outcome in ("cancelled", "preempted"):
            return outcome
        self.strategy.tell(trial.number, value, state)
        self.store.update(trial.run.record.id, objective=value)
        self.store.sweeps.count(self.sweep.id, "finished")
        if outcome == "pruned":
            self.store.sweeps.count(self.sweep.id, "pruned")
        elif outcome != "succeeded":
            self.store.sweeps.count(self.sweep.id, "failed")
        better = value is not None and math.isfinite(value) and (
            self.best is None or (value < self.best if self.settings.direction == "min" else value > self.best)
        )
        if better:
            self.best = value
            self.store.sweeps.update(self.sweep.id, best_job=trial.run.record.id, best_value=value,
                                     best_params=json.dumps(trial.params, sort_keys=True))
        shown = f" {self.settings.objective}={value:g}" if value is not None else ""
        self.say(f"trial {trial.number} {_fmt_params(trial.params)}: {outcome}{shown}{' (best so far)' if better else ''}")
        return "failed" if outcome in ("failed", "stalled", "diverged", "timeout") else outcome

    def _stop_kind(self, signum: int) -> StopReason:
        if signum == signal.SIGINT or self.store.sweeps.get(self.sweep.id).state is JobState.STOPPING:
            return StopReason.CANCELLED
        return StopReason.PREEMPTED

    def _finish(self, stop_kind: StopReason | str | None, stop_signal: int) -> int:
        sweep_id = self.sweep.id
        if stop_kind is None:
            unreported = self._unreported()
            if unreported is not None:  # every trial ran and none said how it did: nothing was found
                from ..core.paths import write_json

                write_json(self.home.sweep_outcome(sweep_id), {"reason": unreported})  # ps, show, wait say it
                self.store.sweeps.transition(sweep_id, JobState.FAILED)
                return 1
            self.store.sweeps.transition(sweep_id, JobState.SUCCEEDED)
            return 0
        code = 128 + int(stop_signal)
        if stop_kind == "failed":
            self.store.sweeps.transition(sweep_id, JobState.FAILED)
            return 1
        state = JobState.CANCELLED if stop_kind is StopReason.CANCELLED else JobState.PREEMPTED
        if not self.store.sweeps.transition(sweep_id, state):
            self.store.sweeps.transition(sweep_id, JobState.FAILED)
        return code

    def _unreported(self) -> str | None:
        """Why the sweep found nothing when it has an objective no trial reported, else None."""
        objective = self.settings.objective
        if not objective or self.best is not None:
            return None
        from ..store.listing import metrics_of

        trials = self.store.trials(self.sweep.id)
        if any(t.objective is not None for t in trials):
            return None
        seen: dict[str, None] = {}
        params = {p.name.lstrip("-").replace("-", "_") for p in self.space.params}  # printed back: not news
        for summary in metrics_of(self.store, [t.id for t in trials]).values():
            if objective in summary:
                return None  # reported (a pruned or failed trial's value), just never as a final one
            seen.update(dict.fromkeys(n for n in summary if n.replace("-", "_") not in params))
        return (f"no trial reported '{objective}'; metrics seen: {', '.join(seen) or 'none'} "
                f"(check --objective, or declare it: --metric {objective}=REGEX)")


def trial_arguments(spec: JobSpec, home: HomePaths, sweep_id: str, number: int, job_id: str) -> JobSpec:
    """The trial's arguments with its placeholders filled in, so that trials running side by side
    write to places of their own: ``{trial}``, ``{sweep_id}``, and for a trial that is one plain
    process (whose nodes fill in nothing) ``{job_id}``, ``{state_dir}``, ``{output_dir}``."""
    from ..core.env import fills_templates
    from ..core.arguments import render_trial_template
    from ..storage.statedir import for_job

    values: dict[str, Any] = {"trial": number, "sweep_id": sweep_id}
    if not fills_templates(spec):
        paths = home.job(job_id)
        values.update(job_id=job_id, state_dir=home.state_dir(for_job(spec, job_id).state_key),
                      output_dir=paths.output_dir)
    ep = spec.entrypoint
    return spec.with_(entrypoint=Entrypoint(ep.kind, ep.target, render_trial_template(ep.args, values), ep.typed))


def _fmt_params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def create_sweep(store: Store, home: HomePaths, spec: JobSpec, settings: SweepSettings, user: str | None = None,
                 sweep_id: str | None = None) -> SweepRecord:
    """Record a sweep (PENDING); its trials are created as it runs. ``user``: who submits it
    (default: this process's user); ``sweep_id``: an id drawn already (``new_job_id``)."""
    space = parse_space(spec.entrypoint.args)
    strategy = check(spec, space, settings)
    sweep_id = sweep_id or new_job_id(home)
    sweep_dir = home.sweep_dir(sweep_id)
    sweep_dir.mkdir(parents=True)
    command = spec.entrypoint.display()
    if spec.snapshot:
        # One snapshot for the whole sweep: every trial runs the same code, and copying the
        # working directory per trial would cost more than a short trial itself.
        from ..core.spec import in_snapshot
        from ..storage.snapshot import freeze

        code, manifest = home.sweep_code(sweep_id)
        freeze(spec, home.root, code, manifest)
        spec = in_snapshot(spec, str(code)).with_(snapshot=False)
    store.sweeps.insert(
        id=sweep_id, name=spec.name, strategy=settings.strategy, objective=settings.objective,
        direction=settings.direction, total=strategy.total, command=command,
        topology=spec.resources.display(), spec_json=json.dumps(spec.to_dict(), sort_keys=True),
        settings_json=json.dumps(asdict(settings), sort_keys=True), sweep_dir=str(sweep_dir),
        user_name=user or config.user(), project=spec.project or DEFAULT_PROJECT, priority=spec.priority,
        **leasing.columns(),
    )
    if spec.tags:
        from ..store.listing import set_tags

        set_tags(store, sweep_id, dict(spec.tags))
    return store.sweeps.get(sweep_id)


def main(argv: list[str] | None = None) -> None:
    """Detached entry point: ``python -m phalanx.sweeps.runner SWEEP_ID``."""
    args = sys.argv[1:] if argv is None else argv
    ttl = lease_ttl()  # out of the environment before any trial's rank starts
    home = HomePaths(config.home())
    store = open_store(home.db)

    def say(text: str) -> None:
        print(f"phalanx: {text}", flush=True)

    code = SweepRunner(store, home, store.sweeps.get(args[0]), say).run(lease_ttl=ttl)
    sys.stdout.flush()
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
