"""The sweep runner: one process that packs trials onto the free slots and drives them.

Every trial is a full job (its own record, logs, metrics, state directory, retries) driven
by a :class:`~phalanx.launch.supervisor.JobRun` in this process's single event loop, so a
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
from pathlib import Path
from typing import Any, Callable

from ..core.paths import HomePaths, JobPaths
from ..core.spec import Entrypoint, JobSpec
from ..core.state import JobState, is_terminal
from ..errors import UsageError
from ..launch.procs import ChildWatcher
from ..launch.supervisor import JobRun
from ..store import JobRecord, Store
from ..store.sweeps import SweepRecord
from .space import Space, parse_space
from .strategies import Strategy

Events = Callable[[str], None]


@dataclass(frozen=True)
class SweepSettings:
    strategy: str = "grid"
    trials: int | None = None
    seed: int | None = None
    objective: str | None = None  # metric name
    direction: str = "min"
    early_stop: str | None = None
    parallel: int | None = None
    fail_fast: bool = False  # stop the sweep at the first failed trial

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SweepSettings":
        return cls(**data)


def parse_objective(text: str | None) -> tuple[str | None, str]:
    if not text:
        return None, "min"
    name, _, direction = text.partition(":")
    direction = direction or "min"
    if not name or direction not in ("min", "max"):
        raise UsageError(f"invalid --objective '{text}'", "use NAME:min or NAME:max, e.g. --objective val_loss:min")
    return name, direction


def check(spec: JobSpec, space: Space, settings: SweepSettings, state: Path | None = None) -> Strategy:
    """Validate a sweep before anything starts; returns its strategy (its sampler's state kept
    in ``state``)."""
    if settings.early_stop and not settings.objective:
        raise UsageError("--early-stop needs --objective", "e.g. --objective val_loss:min")
    if settings.strategy == "tpe" and not settings.objective:
        raise UsageError("--strategy tpe needs --objective", "e.g. --objective val_loss:min")
    if settings.parallel is not None and settings.parallel < 1:
        raise UsageError("--parallel must be at least 1", "e.g. --parallel 2")
    return Strategy(space, settings.strategy, settings.trials, settings.seed, settings.direction, settings.early_stop, state)


SCHEDULED_PARALLEL = 16  # trials at once on a scheduler, unless --parallel says otherwise


def slot_plan(spec: JobSpec, parallel: int | None) -> list[str | None]:
    """One entry per concurrent trial: its CUDA_VISIBLE_DEVICES, or None on CPU-only machines.

    A trial needs one device per process (GPU), or one core per process (CPU). On a backend
    whose scheduler places the trials (SLURM), only ``parallel`` (default SCHEDULED_PARALLEL) limits.
    """
    from ..backends.local import local_gpu_count
    from ..backends.registry import get_backend

    if not get_backend(spec.backend).local_slots:
        return [None] * (parallel or SCHEDULED_PARALLEL)
    per_trial = spec.resources.world_size if spec.spawn.value == "auto" else spec.resources.nnodes
    gpus = local_gpu_count()
    if gpus:
        fit = max(1, gpus // per_trial)
        count = min(fit, parallel) if parallel else fit
        return [",".join(str(g) for g in range(i * per_trial, (i + 1) * per_trial)) for i in range(count)]
    fit = max(1, (os.cpu_count() or 1) // per_trial)
    return [None] * (min(fit, parallel) if parallel else fit)


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
        self.spec = JobSpec.from_dict(json.loads(sweep.spec_json))
        self.settings = SweepSettings.from_dict(json.loads(sweep.settings_json))
        self.space = parse_space(self.spec.entrypoint.args)
        self.strategy = check(self.spec, self.space, self.settings, home.sweep_sampler(sweep.id))
        self.slots = slot_plan(self.spec, self.settings.parallel)
        self.best = sweep.best_value
        self.total = self.strategy.total

    def run(self) -> int:
        """Blocking; main thread. Returns 0 when every trial ended, else the stop's exit code."""
        import psutil

        identity = {"supervisor_pid": os.getpid(), "supervisor_started": psutil.Process().create_time()}
        todo = self._todo()
        free = list(range(len(self.slots)))
        running: dict[int, _Trial] = {}
        stop_kind: str | None = None
        stop_signal: int = signal.SIGTERM
        seen = 0
        with ChildWatcher() as watcher:
            if not self.store.sweeps.transition(self.sweep.id, JobState.RUNNING, **identity):
                return 1
            while True:
                if len(watcher.stop_requests) > seen:
                    stop_signal = watcher.stop_requests[seen]
                    seen = len(watcher.stop_requests)
                    if stop_kind is None:
                        stop_kind = self._stop_kind(stop_signal)
                    for trial in running.values():
                        trial.run.stop(stop_kind if stop_kind != "failed" else "cancelled", stop_signal)
                while stop_kind is None and free and todo:
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
                                other.run.stop("cancelled")
                if not running and (stop_kind is not None or not todo):
                    break
                if freed and todo and stop_kind is None:
                    continue  # a slot just freed up: fill it now, not after the next wake-up
                hints = [t.run.wait_hint() for t in running.values()] or [0.0]
                watcher.wait(min(hints))
        code = self._finish(stop_kind, stop_signal)
        from .. import endings

        endings.sweep_ended(self.store, self.sweep.id, self.say)  # notify
        return code

    def _todo(self) -> list[int]:
        """Trial numbers still to run: all of them, less those that ended in an earlier run."""
        finished = set()
        self._cut_off: dict[int, JobRecord] = {}  # trials an earlier run started but did not finish
        for record in self.store.trials(self.sweep.id):
            if record.trial is None:
                continue
            if record.state not in (JobState.SUCCEEDED, JobState.FAILED, JobState.PRUNED):
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

        paths = JobPaths(Path(record.job_dir))
        parts = [rank_series(paths, a, 0, [self.settings.objective]).get(self.settings.objective) for a in paths.attempts()]
        return {step: value for step, value in by_step_series(p for p in parts if p is not None) if step is not None}

    def _launch(self, number: int, slot: int, identity: dict[str, Any]) -> _Trial:
        from .. import jobs

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
        plan = jobs.plan_job(spec)
        record = jobs.create_job(self.store, spec, plan, sweep_id=self.sweep.id, trial=number,
                                 params_json=json.dumps(params, sort_keys=True), **identity)
        self.store.sweeps.count(self.sweep.id, "launched")
        run = JobRun(self.store, self.home, record, plan, self.say)
        run.start(identity)
        return _Trial(number, run, slot, params)

    def _resume_trial(self, record: JobRecord, number: int, slot: int, identity: dict[str, Any]) -> _Trial:
        """A trial cut off by a crash or a stop continues as a new attempt of the same job."""
        from ..backends.registry import get_backend

        if not is_terminal(record.state):
            self.store.transition(record.id, JobState.LOST)
        params = json.loads(record.params_json or "{}")
        self.strategy.start(number, params)
        spec = JobSpec.from_dict(json.loads(record.spec_json))
        paths = JobPaths(Path(record.job_dir))
        attempt = max([*paths.attempts(), record.attempt]) + 1
        plan = get_backend(spec.backend).plan(spec, record.id, attempt, self.home)
        self.store.reopen(record.id, attempt, **identity)
        run = JobRun(self.store, self.home, self.store.get(record.id), plan, self.say)
        run.start(identity)
        return _Trial(number, run, slot, params)

    def _follow_metrics(self, trial: _Trial) -> None:
        """Feed the objective's values by step to the pruner; stop the trial if it says so."""
        name = self.settings.objective
        if not name:
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
                trial.run.stop("pruned")
                break

    def _ended(self, trial: _Trial) -> str:
        outcome = trial.run.outcome.kind if trial.run.outcome else "failed"
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
        return "failed" if outcome in ("failed", "stalled") else outcome

    def _stop_kind(self, signum: int) -> str:
        if signum == signal.SIGINT or self.store.sweeps.get(self.sweep.id).state is JobState.STOPPING:
            return "cancelled"
        return "preempted"

    def _finish(self, stop_kind: str | None, stop_signal: int) -> int:
        sweep_id = self.sweep.id
        if stop_kind is None:
            self.store.sweeps.transition(sweep_id, JobState.SUCCEEDED)
            return 0
        code = 128 + int(stop_signal)
        if stop_kind == "failed":
            self.store.sweeps.transition(sweep_id, JobState.FAILED)
            return 1
        state = JobState.CANCELLED if stop_kind == "cancelled" else JobState.PREEMPTED
        if not self.store.sweeps.transition(sweep_id, state):
            self.store.sweeps.transition(sweep_id, JobState.FAILED)
        return code


def _fmt_params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def create_sweep(store: Store, home: HomePaths, spec: JobSpec, settings: SweepSettings) -> SweepRecord:
    """Record a sweep (PENDING); its trials are created as it runs."""
    from ..jobs import new_job_id

    space = parse_space(spec.entrypoint.args)
    strategy = check(spec, space, settings)
    sweep_id = new_job_id()
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
    )
    if spec.tags:
        from ..store.listing import set_tags

        set_tags(store, sweep_id, dict(spec.tags))
    return store.sweeps.get(sweep_id)


def main(argv: list[str] | None = None) -> None:
    """Detached entry point: ``python -m phalanx.sweeps.runner SWEEP_ID``."""
    from .. import config

    args = sys.argv[1:] if argv is None else argv
    home = HomePaths(config.home())
    store = Store(home.db)

    def say(text: str) -> None:
        print(f"phalanx: {text}", flush=True)

    code = SweepRunner(store, home, store.sweeps.get(args[0]), say).run()
    sys.stdout.flush()
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
