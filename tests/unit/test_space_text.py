"""Sweep values are the user's text; malformed spaces are errors; huge grids cost nothing."""

import random
import tracemalloc

import pytest

from phalanx.errors import UsageError
from phalanx.sweeps.space import MAX_GRID, parse_space
from phalanx.sweeps.strategies import Strategy


@pytest.mark.parametrize("typed", ["010", "1:30", "yes", "1e-5", "0x10", "+3", "1_000", "007.50", "on", "null", "~"])
def test_a_list_passes_each_value_as_typed(typed):
    space = parse_space(["--x", f"[{typed}, other]"])
    (param,) = space.params
    assert [space.apply({"x": v})[1] for v in param.values] == [typed, "other"]


def test_repeats_are_kept_and_equal_numbers_keep_their_spelling():
    space = parse_space(["--lr", "[0.1, 0.1, 1, 1.0, 100]"])
    (param,) = space.params
    assert space.grid_size() == 5
    assert [space.apply(space.point(n))[1] for n in range(5)] == ["0.1", "0.1", "1", "1.0", "100"]
    assert param.values == (0.1, 0.1, "1", "1.0", 100)


def test_plain_numbers_are_numbers_in_params_and_text_in_argv():
    space = parse_space(["--lr", "[0.01, 1e-5, 32, '7']"])
    assert space.params[0].values == (0.01, 1e-5, 32, "7")
    assert [space.apply({"lr": v})[1] for v in space.params[0].values] == ["0.01", "1e-5", "32", "7"]


@pytest.mark.parametrize("value,fragment", [
    ("[0.1, 0.01", "not closed with ]"),
    ("logunifrom(1e-4, 1e-1)", "did you mean loguniform?"),
    ("unifrom(0, 1)", "did you mean uniform?"),
    ("choice(a, b", "not closed with )"),
    ("[a, {b: 1}]", "nested"),
    ("[0.1, 0.2] x", "valid search space"),
])
def test_malformed_spaces_name_the_argument_and_the_escape(value, fragment):
    with pytest.raises(UsageError) as err:
        parse_space(["--lr", value])
    message = str(err.value)
    assert message.startswith(f"--lr '{value}'") and fragment in message
    assert f"'\\{value}'" in message  # the escape, spelled out
    escaped = parse_space(["--lr", "\\" + value])
    assert not escaped.is_sweep and escaped.args == ("--lr", value)


@pytest.mark.parametrize("value", ["max(1, 2)", "f(x)", "data[1].csv", "a,b", "(1, 2)"])
def test_other_values_are_literals(value):
    space = parse_space(["--v", value])
    assert not space.is_sweep and space.args == ("--v", value)


def test_huge_ranges_are_never_materialised():
    tracemalloc.start()
    try:
        space = parse_space(["--x", "range(1e8)", "--y", "uniform(0, 1, 50000000)"])
        strategy = Strategy(space, "grid", trials=5, seed=None)
        last = strategy.params_for(4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20, f"{peak} bytes"
    assert space.grid_size() == 10**8 * 50_000_000 and strategy.total == 5
    assert last == {"x": 0, "y": pytest.approx(4 / 49_999_999)}
    assert space.apply(space.point(10**8 * 50_000_000 - 1)) == ("--x", "99999999", "--y", "1")
    sample = space.sample(random.Random(0))
    assert 0 <= sample["x"] < 10**8


def test_a_grid_beyond_the_bound_is_refused_unless_capped():
    space = parse_space(["--x", f"range({MAX_GRID + 1})"])
    with pytest.raises(UsageError, match=r"the grid has 100,001 trials.*--trials N"):
        Strategy(space, "grid", trials=None, seed=None)
    assert Strategy(space, "grid", trials=10, seed=None).total == 10
