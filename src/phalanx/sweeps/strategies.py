"""Search strategies behind one ask/report/tell interface.

- ``grid``: the cartesian product, in order;
- ``random``: trial ``k``'s parameters depend only on (seed, k), so a resumed sweep
  re-asks exactly the same trials;
- ``tpe``: Optuna's TPE sampler.

With ``early_stop`` (``median`` or ``halving``), or with ``tpe``, an in-memory Optuna study
carries the trials and its pruner decides from the metrics reported by step; grid/random
parameters are enqueued into it so the pruner sees every trial. Optuna is imported only then.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

from ..errors import MissingDependency, UsageError
from .space import Param, Space

STRATEGIES = ("grid", "random", "tpe")
EARLY_STOP = ("median", "halving")


class Strategy:
    def __init__(self, space: Space, kind: str, trials: int | None, seed: int | None,
                 direction: str = "min", early_stop: str | None = None, state: Path | None = None) -> None:
        if kind not in STRATEGIES:
            raise UsageError(f"unknown --strategy '{kind}'", f"use one of: {', '.join(STRATEGIES)}")
        if early_stop is not None and early_stop not in EARLY_STOP:
            raise UsageError(f"unknown --early-stop '{early_stop}'", f"use one of: {', '.join(EARLY_STOP)}")
        if kind == "grid":
            space.require_grid(trials)
            size = space.grid_size()
            self.total = min(size, trials) if trials else size
        else:
            if not trials:
                raise UsageError(f"a {kind} search needs --trials N",
                                 "e.g. --trials 20; a grid needs finite values such as [a, b] or uniform(0, 1, 5)")
            self.total = trials
        self.space = space
        self.kind = kind
        self.seed = 0 if seed is None else seed
        self.direction = direction
        self._study: Any = None
        self._optuna_trials: dict[int, Any] = {}
        self.early_stop = early_stop
        # The sampler's own state (its random generator) lives in ``state`` between runs of the
        # sweep: a resumed TPE search goes on drawing where it stopped instead of starting its
        # random sequence over (which would repeat the first trials' parameters).
        self._state = state
        if kind == "tpe" or early_stop:
            self._study = _study(kind, self.seed, direction, early_stop, _load_sampler(state))

    def params_for(self, number: int) -> dict[str, Any]:
        """The parameters of trial ``number`` (grid/random: a pure function of the number)."""
        if self.kind == "grid":
            return _nth(self.space, number)
        if self.kind == "random":
            return self.space.sample(random.Random(f"{self.seed}:{number}"))
        optuna_trial = self._ask_optuna(number, None)
        return dict(optuna_trial.params)

    def start(self, number: int, params: dict[str, Any]) -> None:
        """Trial ``number`` starts with ``params``; the pruner (if any) follows it from now."""
        if self._study is not None and number not in self._optuna_trials:
            self._ask_optuna(number, params)

    def _ask_optuna(self, number: int, params: dict[str, Any] | None) -> Any:
        if params is not None:
            self._study.enqueue_trial(params, skip_if_exists=False)
        trial = self._study.ask()
        values = {}
        for p in self.space.params:
            values[p.name] = _suggest(trial, p)
        self._optuna_trials[number] = trial
        _save_sampler(self._state, self._study.sampler)
        return trial

    def report(self, number: int, step: int, value: float) -> bool:
        """A metric value of a running trial at ``step``; True when the trial should be pruned."""
        trial = self._optuna_trials.get(number)
        if trial is None or not math.isfinite(value):
            return False
        trial.report(value, step)
        return bool(trial.should_prune())

    def tell(self, number: int, value: float | None, state: str) -> None:
        """A trial ended: ``complete`` (with its objective value), ``pruned`` or ``fail``."""
        trial = self._optuna_trials.pop(number, None)
        if trial is None:
            return
        import optuna

        if state == "complete" and value is not None and math.isfinite(value):
            self._study.tell(trial, value)
        elif state == "pruned":
            self._study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self._study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def remember(self, params: dict[str, Any], value: float | None, state: str,
                 intermediate: dict[int, float] | None = None) -> None:
        """A trial finished before a resume: teach the study without running it again, with
        its objective by step (``intermediate``: what the pruner compares new trials with)."""
        if self._study is None:
            return
        import optuna

        dists = {p.name: _distribution(p) for p in self.space.params}
        steps = {int(k): float(v) for k, v in (intermediate or {}).items() if math.isfinite(v)}
        if state == "complete" and value is not None:
            frozen = optuna.trial.create_trial(params=params, distributions=dists, value=value, intermediate_values=steps)
        else:
            frozen = optuna.trial.create_trial(params=params, distributions=dists, intermediate_values=steps,
                                               state=optuna.trial.TrialState.PRUNED if state == "pruned" else optuna.trial.TrialState.FAIL)
        self._study.add_trial(frozen)

    def history(self) -> int:
        """How many finished trials the study knows (0 without a study)."""
        if self._study is None:
            return 0
        import optuna

        return len(self._study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                                   optuna.trial.TrialState.PRUNED)))

    def why_pruned(self, number: int, step: int, value: float) -> str:
        """Why the pruner stopped trial ``number`` at ``step`` (one line)."""
        if self.early_stop == "median" and self._study is not None:
            import statistics

            import optuna

            done = self._study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            seen = [t.intermediate_values[step] for t in done if step in t.intermediate_values]
            if seen:
                worse = "above" if self.direction == "min" else "below"
                return (f"median rule at step {step}: {value:.6g} is {worse} the median {statistics.median(seen):.6g} "
                        f"of {len(seen)} finished trial(s) at that step")
        if self.early_stop == "halving":
            return f"successive halving at step {step}: {value:.6g} is not among the best of the trials that reached it"
        return f"stopped early at step {step} ({value:.6g})"


def _nth(space: Space, number: int) -> dict[str, Any]:
    """The ``number``-th grid point (last parameter varies fastest), without enumerating."""
    out = {}
    for p in reversed(space.params):
        number, index = divmod(number, len(p.values))
        out[p.name] = p.values[index]
    return {p.name: out[p.name] for p in space.params}


def _load_sampler(path: Path | None) -> Any:
    if path is None or not path.is_file():
        return None
    import pickle

    try:
        return pickle.loads(path.read_bytes())  # noqa: S301 - written by this sweep's runner, in the user's home
    except Exception:  # noqa: BLE001 - an unreadable state: start the sampler afresh
        return None


def _save_sampler(path: Path | None, sampler: Any) -> None:
    """Pickled, as Optuna documents for resuming a sampler; written atomically."""
    if path is None:
        return
    import os
    import pickle

    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(pickle.dumps(sampler))
    os.replace(tmp, path)


def _study(kind: str, seed: int, direction: str, early_stop: str | None, sampler: Any = None) -> Any:
    try:
        import optuna
    except ImportError:
        raise MissingDependency("optuna", "sweeps") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if sampler is None:
        sampler = optuna.samplers.TPESampler(seed=seed) if kind == "tpe" else optuna.samplers.RandomSampler(seed=seed)
    if early_stop == "median":
        # Compare from the first reported step once two trials have finished: sweeps here are
        # short, and a late start would let hopeless trials run to the end.
        pruner: Any = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    elif early_stop == "halving":
        pruner = optuna.pruners.SuccessiveHalvingPruner()
    else:
        pruner = optuna.pruners.NopPruner()
    return optuna.create_study(direction="minimize" if direction == "min" else "maximize", sampler=sampler, pruner=pruner)


def _distribution(p: Param) -> Any:
    import optuna

    if p.values:
        return optuna.distributions.CategoricalDistribution(list(p.values))
    return optuna.distributions.FloatDistribution(p.low, p.high, log=p.kind == "loguniform")


def _suggest(trial: Any, p: Param) -> Any:
    if p.values:
        return trial.suggest_categorical(p.name, list(p.values))
    return trial.suggest_float(p.name, p.low, p.high, log=p.kind == "loguniform")
