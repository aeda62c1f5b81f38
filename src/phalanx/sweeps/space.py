"""Search spaces written where the value goes: ``--lr "[0.001, 0.01]"``, ``--lr "loguniform(1e-5, 1e-1)"``.

Recognised (as the whole argument value): ``[a, b, ...]``, ``choice(a, b, ...)``,
``range(start, stop[, step])``, ``uniform(lo, hi[, n])``, ``loguniform(lo, hi[, n])``.
With ``n``, uniform/loguniform are ``n`` evenly spaced (log-spaced) values, usable in a grid.
A search expression preceded by a backslash is passed literally without it:
``"\\[1, 2]"`` -> ``[1, 2]``; any other value, backslashes included, is passed unchanged.
Pure functions; no I/O.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ..errors import UsageError

_CALL = re.compile(r"^\s*(choice|range|uniform|loguniform)\s*\((.*)\)\s*$", re.S)
_KINDS = ("choice", "range", "uniform", "loguniform")


@dataclass(frozen=True)
class Param:
    """One searched argument: where it sits in the argv and what values it may take."""

    name: str
    index: int  # position in the entrypoint args
    kind: str  # choice | range | uniform | loguniform
    values: tuple[Any, ...] = ()  # discrete values (choice, range, or uniform/loguniform with n)
    low: float = 0.0
    high: float = 0.0
    inline_flag: str | None = None  # "--lr" when written as --lr=[...]

    @property
    def discrete(self) -> bool:
        return bool(self.values)

    def sample(self, rng: random.Random) -> Any:
        if self.values:
            return rng.choice(self.values)
        if self.kind == "loguniform":
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return rng.uniform(self.low, self.high)

    def render(self, value: Any) -> str:
        text = _format(value)
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
        self.require_grid()
        names = [p.name for p in self.params]
        for combo in itertools.product(*(p.values for p in self.params)):
            yield dict(zip(names, combo))

    def require_grid(self) -> None:
        if not self.all_discrete:
            continuous = ", ".join(p.name for p in self.params if not p.discrete)
            raise UsageError(
                f"a grid needs finite values, but {continuous} {'is' if ',' not in continuous else 'are'} continuous",
                "give uniform/loguniform a count, e.g. uniform(0, 1, 5), or use --strategy random/tpe with --trials",
            )

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
        if value.startswith("\\") and _is_expression(value[1:]):
            out[i] = (f"{flag}=" if flag else "") + value[1:]
            continue
        parsed = _parse_value(value)
        if parsed is None:
            continue
        name = (flag or (args[i - 1] if i > 0 and args[i - 1].startswith("-") else f"arg{i}")).lstrip("-")
        if name in seen:
            raise UsageError(f"parameter '{name}' is searched twice", "give each searched argument once")
        seen.add(name)
        kind, values, low, high = parsed
        params.append(Param(name, i, kind, values, low, high, flag))
    return Space(tuple(out), tuple(params))


def _is_expression(text: str) -> bool:
    """Would ``text`` be read as a search space? (Then a leading backslash escapes it.)"""
    try:
        return _parse_value(text) is not None
    except UsageError:
        return True


def _parse_value(text: str) -> tuple[str, tuple[Any, ...], float, float] | None:
    stripped = text.strip()
    if stripped.startswith("[") and stripped.endswith("]"):
        values = _items(stripped[1:-1], text)
        return "choice", values, 0.0, 0.0
    match = _CALL.match(stripped)
    if not match:
        return None
    kind, body = match.group(1), match.group(2)
    items = _items(body, text)
    if kind == "choice":
        return kind, items, 0.0, 0.0
    numbers = [_number(v, text) for v in items]
    if kind == "range":
        if not 1 <= len(numbers) <= 3:
            raise UsageError(f"bad search expression '{text}'", "use range(stop), range(start, stop) or range(start, stop, step)")
        start, stop, step = (0, numbers[0], 1) if len(numbers) == 1 else (numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else 1)
        if step == 0:
            raise UsageError(f"bad search expression '{text}': step is 0", "use a non-zero step")
        steps = _arange(start, stop, step)
        if not steps:
            raise UsageError(f"bad search expression '{text}': it is empty", "check start, stop and step")
        return kind, tuple(steps), 0.0, 0.0
    if len(numbers) not in (2, 3):
        raise UsageError(f"bad search expression '{text}'", f"use {kind}(low, high) or {kind}(low, high, count)")
    low, high = float(numbers[0]), float(numbers[1])
    if not low < high:
        raise UsageError(f"bad search expression '{text}': low must be below high", f"e.g. {kind}(0.001, 0.1)")
    if kind == "loguniform" and low <= 0:
        raise UsageError(f"bad search expression '{text}': loguniform needs low > 0", "e.g. loguniform(1e-5, 1e-1)")
    if len(numbers) == 3:
        count = numbers[2]
        if not isinstance(count, int) or count < 2:
            raise UsageError(f"bad search expression '{text}': the count must be an integer of at least 2", f"e.g. {kind}({low:g}, {high:g}, 5)")
        if kind == "loguniform":
            a, b = math.log(low), math.log(high)
            return kind, tuple(_round(math.exp(a + (b - a) * k / (count - 1))) for k in range(count)), low, high
        return kind, tuple(_round(low + (high - low) * k / (count - 1)) for k in range(count)), low, high
    return kind, (), low, high


def _items(body: str, text: str) -> tuple[Any, ...]:
    import yaml

    if not body.strip():
        raise UsageError(f"bad search expression '{text}': no values", "give at least one value, e.g. [0.1, 0.2]")
    try:
        values = yaml.safe_load(f"[{body}]")
    except yaml.YAMLError:
        raise UsageError(f"bad search expression '{text}'", "separate values with commas; quote values that contain commas") from None
    if any(isinstance(v, (list, dict)) for v in values):
        raise UsageError(f"bad search expression '{text}': nested lists are not values", "write plain numbers or words")
    return tuple(_numeric(v) for v in values)


def _numeric(value: Any) -> Any:
    """YAML reads 1e-4 as a string; a search value that looks like a number is one."""
    if isinstance(value, str):
        for cast in (int, float):
            try:
                return cast(value)
            except ValueError:
                pass
    return value


def _number(value: Any, text: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"bad search expression '{text}': '{value}' is not a number", "use numbers, e.g. uniform(0.1, 0.9)")
    return value


def _arange(start: float, stop: float, step: float) -> list[int | float]:
    if all(isinstance(v, int) for v in (start, stop, step)):
        return list(range(int(start), int(stop), int(step)))
    count = max(0, math.ceil((stop - start) / step))
    return [_round(start + k * step) for k in range(count)]


def _round(value: float) -> float:
    return float(f"{value:.12g}")


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.10g}"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
