"""``--on-nan-args "--lr {lr*0.5}"``: the script's arguments for a retry after divergence,
computed from the arguments it ran with.

Each ``{EXPRESSION}`` is arithmetic (``+ - * / // %``, parentheses, numbers) over names that
stand for the values of the script's own options: ``lr`` is the value of ``--lr`` (or
``--lr=...``; ``warmup_steps`` is also found as ``--warmup-steps``). The words that result
replace the options of the same name (``spec.merge_args``), so every retry halves ``--lr`` again.
Pure; a template that names an option the script does not have is refused before the job starts.
"""

from __future__ import annotations

import ast
import operator
import re
import shlex
from typing import Any, Callable, Sequence

from ..core.spec import merge_args
from ..errors import UsageError

_FIELD = re.compile(r"\{([^{}]+)\}")
_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.USub: operator.neg, ast.UAdd: operator.pos,
}


def option_value(args: Sequence[str], name: str) -> str | None:
    """The value of ``--name`` (also spelt with ``-`` for ``_``) in ``args``; the last one given."""
    flags = {f"--{name}", f"--{name.replace('_', '-')}", f"-{name}"}
    found = None
    for i, word in enumerate(args):
        flag, eq, value = word.partition("=")
        if flag in flags:
            if eq:
                found = value
            elif i + 1 < len(args):
                found = args[i + 1]
    return found


def names(template: str) -> list[str]:
    """The option names a template's expressions use."""
    out: list[str] = []
    for expression in _FIELD.findall(template):
        tree = _parse(expression, template)
        out += [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in out]
    return out


def check(template: str, args: Sequence[str]) -> None:
    """Refuse (UsageError) a template that does not parse or names an option ``args`` lacks."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise UsageError(f"invalid --on-nan-args '{template}': {exc}", "quote it like shell words") from None
    if not words:
        raise UsageError("--on-nan-args is empty", 'give the arguments to change, e.g. --on-nan-args "--lr {lr*0.5}"')
    for name in names(template):
        if option_value(args, name) is None:
            raise UsageError(f"--on-nan-args uses {{{name}}}, but the script's arguments have no --{name}",
                             f"pass --{name} to the script, or drop it from --on-nan-args")
    apply(template, args)  # every value a number


def apply(template: str, args: Sequence[str]) -> tuple[str, ...]:
    """``args`` with the template's words computed from them and merged over them."""
    def value(name: str) -> float:
        text = option_value(args, name)
        if text is None:
            raise UsageError(f"--on-nan-args uses {{{name}}}, but the script's arguments have no --{name}",
                             f"pass --{name} to the script, or drop it from --on-nan-args")
        try:
            return float(text)
        except ValueError:
            raise UsageError(f"--on-nan-args computes with --{name}, whose value '{text}' is not a number",
                             "use it only with numeric options") from None

    def field(match: re.Match[str]) -> str:
        result = _evaluate(_parse(match.group(1), template).body, value)
        return f"{result:.6g}" if isinstance(result, float) else str(result)

    words = tuple(shlex.split(_FIELD.sub(field, template)))  # expressions may hold spaces
    return merge_args(tuple(args), words)


def _parse(expression: str, template: str) -> ast.Expression:
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise UsageError(f"invalid --on-nan-args '{template}': '{{{expression}}}' is not arithmetic",
                         "use names of the script's options, numbers and + - * / ( ), e.g. {lr*0.5}") from None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Load, ast.Constant,
                                 *_OPS)) or (isinstance(node, ast.Constant) and not isinstance(node.value, (int, float))):
            raise UsageError(f"invalid --on-nan-args '{template}': '{{{expression}}}' is not arithmetic",
                             "use names of the script's options, numbers and + - * / ( ), e.g. {lr*0.5}")
    return tree


def _evaluate(node: ast.AST, value: Callable[[str], float]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return value(node.id)
    if isinstance(node, ast.UnaryOp):
        return _OPS[type(node.op)](_evaluate(node.operand, value))
    if isinstance(node, ast.BinOp):
        try:
            return _OPS[type(node.op)](_evaluate(node.left, value), _evaluate(node.right, value))
        except (ZeroDivisionError, OverflowError) as exc:
            raise UsageError(f"--on-nan-args: {exc}", "fix the expression") from None
    raise UsageError("--on-nan-args: not arithmetic", "use + - * / and numbers")
