import random

import pytest

from phalanx.errors import UsageError
from phalanx.sweeps.space import parse_space


def test_grid_is_the_cartesian_product_and_args_are_substituted():
    space = parse_space(["--lr", "[0.001, 0.002, 0.01, 0.02]", "--bs", "[32, 64]", "--epochs", "3"])
    assert [p.name for p in space.params] == ["lr", "bs"]
    trials = list(space.grid())
    assert len(trials) == space.grid_size() == 8
    assert trials[0] == {"lr": 0.001, "bs": 32} and trials[-1] == {"lr": 0.02, "bs": 64}
    assert space.apply(trials[1]) == ("--lr", "0.001", "--bs", "64", "--epochs", "3")


def test_expressions():
    space = parse_space(["--depth", "range(2, 10, 2)", "--opt", "choice(adam, sgd)", "--x=uniform(0, 1, 3)",
                         "--lr", "loguniform(1e-4, 1e-2, 3)", "--w", "range(3)"])
    by = {p.name: p for p in space.params}
    assert by["depth"].values == (2, 4, 6, 8)
    assert by["opt"].values == ("adam", "sgd")
    assert by["x"].values == (0.0, 0.5, 1.0) and by["x"].inline_flag == "--x"
    assert by["lr"].values == pytest.approx((1e-4, 1e-3, 1e-2))
    assert by["w"].values == (0, 1, 2)
    assert space.apply({"depth": 4, "opt": "sgd", "x": 0.5, "lr": 0.001, "w": 1})[4] == "--x=0.5"


def test_random_sampling_is_reproducible_and_in_range():
    space = parse_space(["--lr", "loguniform(1e-5, 1e-1)", "--depth", "range(2, 10, 2)"])
    assert not space.all_discrete
    a = [space.sample(random.Random(0)) for _ in range(3)]
    b = [space.sample(random.Random(0)) for _ in range(3)]
    assert a == b
    rng = random.Random(1)
    for _ in range(200):
        s = space.sample(rng)
        assert 1e-5 <= s["lr"] <= 1e-1 and s["depth"] in (2, 4, 6, 8)


def test_literal_escape_and_plain_args_untouched():
    space = parse_space(["--tags", "\\[a, b]", "--name=\\range(3)", "--lr", "0.1", "data[1].csv", "\\", "C:\\x"])
    assert not space.is_sweep
    assert space.args == ("--tags", "[a, b]", "--name=range(3)", "--lr", "0.1", "data[1].csv", "\\", "C:\\x")


@pytest.mark.parametrize(
    "value,match",
    [
        ("uniform(1, 0)", "low must be below high"),
        ("loguniform(0, 1)", "loguniform needs low > 0"),
        ("range(0, 10, 0)", "step is 0"),
        ("range(5, 1)", "empty"),
        ("uniform(a, b)", "is not a number"),
        ("uniform(0, 1, 1)", "count must be an integer of at least 2"),
        ("[]", "no values"),
        ("[1, [2, 3]]", "nested"),
        ("uniform(0)", r"uniform\(low, high\)"),
    ],
)
def test_bad_expressions(value, match):
    with pytest.raises(UsageError, match=match):
        parse_space(["--p", value])


def test_grid_refuses_continuous():
    with pytest.raises(UsageError, match="continuous"):
        list(parse_space(["--lr", "uniform(0, 1)"]).grid())
