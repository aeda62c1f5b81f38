"""Search spaces written where the value goes: ``--lr "[0.001, 0.01]"``, ``--lr "loguniform(1e-5, 1e-1)"``.

Recognised (as the whole argument value): ``[a, b, ...]``, ``choice(a, b, ...)``,
``range(start, stop[, step])``, ``uniform(lo, hi[, n])``, ``loguniform(lo, hi[, n])``.
With ``n``, uniform/loguniform are ``n`` evenly spaced (log-spaced) values, usable in a grid.

The values of a list are the user's text: ``[010, 1:30, yes]`` passes ``010``, ``1:30`` and
``yes`` to the script, exactly as typed (a value that is a plain number, such as ``0.01`` or
``32``, is also that number in ``PHALANX_PARAMS``). A value that starts like a search
expression (``[``, or a call of one of the functions above or a misspelling of one) but does
not parse is an error naming the argument and the escape: a leading backslash passes a value
literally, without the backslash (``"\\[1, 2]"`` -> ``[1, 2]``); any other value, backslashes
included, is passed unchanged.

Ranges and spaced values are computed on demand, never materialised: ``range(1e8)`` costs
nothing until a trial asks for its value, and a grid of more than ``MAX_GRID`` trials is refused
unless ``--trials`` caps it. Pure functions; no I/O.
"""

from __future__ import annotations

import difflib
import math
import random
import re
from dataclasses import dataclass
from typing import Any, Iterator, Sequence, overload

from ..errors import UsageError

_CALL = re.compile(r"^\s*([A-Za-z_]\w*)\s*\(")
_KINDS = ("choice", "range", "uniform", "loguniform")
_INT = re.compile(r"[+-]?(0|[1-9]\d*)")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
MAX_GRID = 100_000  # trials in a grid that --trials does not cap
_EAGER = 10_000  # spaced values up to this many are a tuple; beyond, computed on demand


class _Spaced(Sequence[Any]):
    """``count`` values from ``start``: ``start + k*step`` (or log-spaced), computed on demand."""

    def __init__(self, start: float, step: float, count: int, log: bool = False, ints: bool = False) -> None:
        self.start, self.step, self.size, self.log, self.ints = start, step, count, log, ints

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(self.size)))
        if index < 0:
            index += self.size
        if not 0 <= index < self.size:
            raise IndexError(index)
        if self.ints:
            return int(self.start) + index * int(self.step)
        value = self.start + index * self.step
        return _round(math.exp(value) if self.log else value)


def _spaced(start: float, step: float, count: int, log: bool = False, ints: bool = False) -> Sequence[Any]:
    values = _Spaced(start, step, count, log, ints)
    return tuple(values) if count <= _EAGER else values


@dataclass(frozen=True)
class Param:
    """One searched argument: where it sits in the argv and what values it may take."""

    name: str
    index: int  # position in the entrypoint args
    kind: str  # choice | range | uniform | loguniform
    values: Sequence[Any] = ()  # discrete values (choice, range, or uniform/loguniform with n)
    low: float = 0.0
    high: float = 0.0
    inline_flag: str | None = None  # "--lr" when written as --lr=[...]
    texts: tuple[str, ...] = ()  # a choice's values as the user typed them

    @property
    def discrete(self) -> bool:
        return bool(len(self.values))

    @property
    def scale(self) -> str:
        """How a plot's axis for this parameter is drawn: ``log`` (loguniform, spaced or not),
        ``categorical`` (a list or choice: each value a tick of its own) or ``linear``."""
        return "log" if self.kind == "loguniform" else "categorical" if self.kind == "choice" else "linear"

    def sample(self, rng: random.Random) -> Any:
        if len(self.values):
            return rng.choice(self.values)
        if self.kind == "loguniform":
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return rng.uniform(self.low, self.high)

    def render(self, value: Any) -> str:
        text = self.texts[list(self.values).index(value)] if self.texts and value in self.values else _format(value)
        return f"{self.inline_flag}={text}" if self.inline_flag else text


@dataclass(frozen=True)
class Space:
    args: tuple[str, ...]  # the script args with searched values still in place
    params: tuple[Param, ...]

    @property
    def is_sweep(self) -> bool:
        return bool(self.params)

    @property
    def all_discrete(self) -> bool:
        return all(p.discrete for p in self.params)

    def grid(self) -> Iterator[dict[str, Any]]:
        """Every grid point in order (last parameter fastest), one at a time."""
        self.require_grid()
        return (self.point(n) for n in range(self.grid_size()))

    def point(self, number: int) -> dict[str, Any]:
        """The ``number``-th grid point, without enumerating the ones before."""
        out = {}
        for p in reversed(self.params):
            number, index = divmod(number, len(p.values))
            out[p.name] = p.values[index]
        return {p.name: out[p.name] for p in self.params}

    def require_grid(self, trials: int | None = None) -> None:
        if not self.all_discrete:
            continuous = ", ".join(p.name for p in self.params if not p.discrete)
            raise UsageError(
                f"a grid needs finite values, but {continuous} {'is' if ',' not in continuous else 'are'} continuous",
                "give uniform/loguniform a count, e.g. uniform(0, 1, 5), or use --strategy random/tpe with --trials",
            )
        size = self.grid_size()
        if size > MAX_GRID and not trials:
            raise UsageError(f"the grid has {size:,} trials, more than the {MAX_GRID:,} a sweep may run",
                             "cap it with --trials N (the first N), sample it with --strategy random --trials N, "
                             "or give fewer values")

    def grid_size(self) -> int:
        return math.prod(len(p.values) for p in self.params) if self.all_discrete else 0

    def sample(self, rng: random.Random) -> dict[str, Any]:
        return {p.name: p.sample(rng) for p in self.params}

    def apply(self, params: dict[str, Any]) -> tuple[str, ...]:
        """The script args for one trial."""
        args = list(self.args)
        for p in self.params:
            args[p.index] = p.render(params[p.name])
        return tuple(args)


def parse_space(args: Sequence[str]) -> Space:
    """Find searched values in script args; literal values lose their escaping backslash."""
    out = list(args)
    params: list[Param] = []
    seen: set[str] = set()
    for i, word in enumerate(args):
        flag, value = None, word
        if word.startswith("--") and "=" in word:
            flag, value = word.split("=", 1)
        name = (flag or (args[i - 1] if i > 0 and args[i - 1].startswith("-") else f"arg{i}")).lstrip("-")
        if value.startswith("\\") and _looks_like(value[1:]):
            out[i] = (f"{flag}=" if flag else "") + value[1:]
            continue
        if not _looks_like(value):
            continue
        kind, values, low, high, texts = _parse_value(value, _where(flag, args, i))
        if name in seen:
            raise UsageError(f"parameter '{name}' is searched twice", "give each searched argument once")
        seen.add(name)
        params.append(Param(name, i, kind, values, low, high, flag, texts))
    return Space(tuple(out), tuple(params))


def _where(flag: str | None, args: Sequence[str], i: int) -> str:
    if flag:
        return flag
    return args[i - 1] if i > 0 and args[i - 1].startswith("-") else f"argument {i + 1}"


def _looks_like(text: str) -> bool:
    """Would ``text`` be read as a search space (then it must parse, or be escaped)?"""
    stripped = text.strip()
    if stripped.startswith("["):
        return True
    match = _CALL.match(stripped)
    if match is None:
        return False
    return match.group(1) in _KINDS or bool(difflib.get_close_matches(match.group(1), _KINDS, 1, 0.75))


def _fail(where: str, text: str, problem: str) -> UsageError:
    return UsageError(f"{where} '{text}' is not a valid search space: {problem}",
                      f"fix it, or pass the value literally with a backslash: '\\{text}'")


_Parsed = tuple[str, Sequence[Any], float, float, tuple[str, ...]]


def _parse_value(text: str, where: str) -> _Parsed:
    stripped = text.strip()
    if stripped.startswith("["):
        if not stripped.endswith("]"):
            raise _fail(where, text, "the list is not closed with ]")
        values, texts = _items(stripped, where, text)
        return "choice", values, 0.0, 0.0, texts
    match = _CALL.match(stripped)
    assert match is not None
    kind = match.group(1)
    if kind not in _KINDS:
        close = difflib.get_close_matches(kind, _KINDS, 1, 0.75)
        raise _fail(where, text, f"unknown function {kind}(); did you mean {close[0]}?")
    if not stripped.endswith(")"):
        raise _fail(where, text, f"{kind}( is not closed with )")
    body = stripped[match.end():-1]
    if kind == "choice":
        values, texts = _items(f"[{body}]", where, text)
        return kind, values, 0.0, 0.0, texts
    _, words = _items(f"[{body}]", where, text)
    numbers = [_number(w, where, text) for w in words]
    if kind == "range":
        return _range(numbers, where, text)
    return _uniform(kind, numbers, where, text)


def _range(numbers: list[int | float], where: str, text: str) -> _Parsed:
    if not 1 <= len(numbers) <= 3:
        raise _fail(where, text, "use range(stop), range(start, stop) or range(start, stop, step)")
    start, stop, step = (0, numbers[0], 1) if len(numbers) == 1 else (numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else 1)
    if step == 0:
        raise _fail(where, text, "step is 0")
    ints = all(isinstance(v, int) for v in (start, stop, step))
    count = len(range(int(start), int(stop), int(step))) if ints else max(0, math.ceil((stop - start) / step))
    if not count:
        raise _fail(where, text, "it is empty; check start, stop and step")
    return "range", _spaced(start, step, count, ints=ints), 0.0, 0.0, ()


def _uniform(kind: str, numbers: list[int | float], where: str, text: str) -> _Parsed:
    if len(numbers) not in (2, 3):
        raise _fail(where, text, f"use {kind}(low, high) or {kind}(low, high, count)")
    low, high = float(numbers[0]), float(numbers[1])
    if not low < high:
        raise _fail(where, text, f"low must be below high, e.g. {kind}(0.001, 0.1)")
    if kind == "loguniform" and low <= 0:
        raise _fail(where, text, "loguniform needs low > 0, e.g. loguniform(1e-5, 1e-1)")
    if len(numbers) == 2:
        return kind, (), low, high, ()
    count = numbers[2]
    if not isinstance(count, int) or count < 2:
        raise _fail(where, text, f"the count must be an integer of at least 2, e.g. {kind}({low:g}, {high:g}, 5)")
    if kind == "loguniform":
        a, b = math.log(low), math.log(high)
        return kind, _spaced(a, (b - a) / (count - 1), count, log=True), low, high, ()
    return kind, _spaced(low, (high - low) / (count - 1), count), low, high, ()


def _items(flow: str, where: str, text: str) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """The values of a YAML flow list, each as typed (a plain number also as that number).
    Repeats are kept (a configuration run twice); numbers equal but written differently (``1``
    and ``1.0``) stay text, so each reaches the script as typed."""
    import yaml

    try:
        node = yaml.compose(flow, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        problem = " ".join(str(getattr(exc, "problem", "") or "").split()) or "it does not parse"
        raise _fail(where, text, f"{problem}; separate values with commas, quote values with commas in them") from None
    if not isinstance(node, yaml.SequenceNode):
        raise _fail(where, text, "expected a list of values such as [0.1, 0.2]")
    if not node.value:
        raise _fail(where, text, "no values; give at least one, e.g. [0.1, 0.2]")
    if any(not isinstance(item, yaml.ScalarNode) for item in node.value):
        raise _fail(where, text, "nested lists are not values; write plain numbers or words")
    texts = tuple(item.value for item in node.value)
    typed = [_typed(item.value) if item.style is None else item.value for item in node.value]
    values = tuple(t if any(v == w and t != u for w, u in zip(typed, texts)) else v for v, t in zip(typed, texts))
    return values, texts


def _typed(text: str) -> Any:
    """A plain value that is a number as written (``32``, ``0.01``, ``1e-5``) is that number;
    anything else (``010``, ``1:30``, ``yes``) stays the text."""
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


def _number(text: str, where: str, whole: str) -> int | float:
    value = _typed(text)
    if isinstance(value, str):
        raise _fail(where, whole, f"'{text}' is not a number; use numbers, e.g. uniform(0.1, 0.9)")
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53 and "e" in text.lower():
        return int(value)  # range(1e8): a count written the short way
    return value


def _round(value: float) -> float:
    return float(f"{value:.12g}")


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.10g}"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
