import math
import statistics

import pytest

from phalanx.sweeps.space import parse_space
from phalanx.sweeps.strategies import Strategy

pytest.importorskip("optuna")


def _objective(p):
    # a narrow valley in log-space: random search rarely lands close, TPE homes in
    return (math.log10(p["lr"]) + 2.7) ** 2 + (p["wd"] - 0.3) ** 2


def _best(kind, seed, trials=30):
    space = parse_space(["--lr", "loguniform(1e-5, 1e-1)", "--wd", "uniform(0, 1)"])
    strategy = Strategy(space, kind, trials, seed, "min")
    best = math.inf
    for n in range(trials):
        params = strategy.params_for(n)
        value = _objective(params)
        strategy.tell(n, value, "complete")
        best = min(best, value)
    return best


def test_tpe_beats_random_over_seeds():
    tpe = [_best("tpe", seed) for seed in range(5)]
    rnd = [_best("random", seed) for seed in range(5)]
    assert statistics.median(tpe) < statistics.median(rnd)
    assert sum(t < r for t, r in zip(tpe, rnd)) >= 3


def test_random_params_depend_only_on_seed_and_number():
    space = parse_space(["--lr", "loguniform(1e-5, 1e-1)"])
    a, b = Strategy(space, "random", 10, 7), Strategy(space, "random", 10, 7)
    assert [a.params_for(n) for n in range(10)] == [b.params_for(n) for n in reversed(range(10))][::-1]
    assert Strategy(space, "random", 10, 8).params_for(0) != a.params_for(0)


def test_median_pruner_prunes_a_clearly_worse_curve():
    space = parse_space(["--lr", "[1, 2, 3]"])
    strategy = Strategy(space, "grid", None, None, "min", early_stop="median")
    for n in range(2):
        strategy.start(n, strategy.params_for(n))
        for step in range(1, 6):
            assert not strategy.report(n, step, 1.0 / step)
        strategy.tell(n, 0.2, "complete")
    strategy.start(2, strategy.params_for(2))
    assert strategy.report(2, 1, 50.0)  # far worse than the median at the same step
