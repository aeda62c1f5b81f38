"""A script's arguments: a job file's merged with the command line's, and the placeholders
phalanx fills in (``{node_rank}``-style ones where it starts each node's processes, a sweep
trial's ``{trial}``; ``{{node_rank}}`` is a literal ``{node_rank}``). Pure functions."""

from __future__ import annotations

import re
from typing import Any, Mapping

TEMPLATE_KEYS = (
    "node_rank",
    "num_nodes",
    "nproc_per_node",
    "master_addr",
    "master_port",
    "job_id",
    "state_dir",
    "output_dir",
)


def merge_args(base: tuple[str, ...], overrides: tuple[str, ...]) -> tuple[str, ...]:
    """Script args from a job file, with CLI args overriding flags of the same name.

    ``("--lr", "0.01", "--bs", "32") + ("--lr", "0.1")`` -> ``("--lr", "0.1", "--bs", "32")``.
    Flags not in ``base`` and positional words are appended in order.
    """
    result = list(base)
    i = 0
    while i < len(overrides):
        word = overrides[i]
        if word.startswith("--") and "=" in word:
            flag, value = word.split("=", 1)
            _set_flag(result, flag, value, inline=True)
            i += 1
        elif word.startswith("--") and i + 1 < len(overrides) and not overrides[i + 1].startswith("--"):
            _set_flag(result, word, overrides[i + 1], inline=False)
            i += 2
        else:
            result.append(word)
            i += 1
    return tuple(result)


def _set_flag(args: list[str], flag: str, value: str, inline: bool) -> None:
    for j, word in enumerate(args):
        if word == flag and j + 1 < len(args):
            args[j + 1] = value
            return
        if word.startswith(flag + "="):
            args[j] = f"{flag}={value}"
            return
    args.extend([f"{flag}={value}"] if inline else [flag, value])


_TEMPLATE = re.compile(r"\{\{(" + "|".join(TEMPLATE_KEYS) + r")\}\}|\{(" + "|".join(TEMPLATE_KEYS) + r")\}")


def render_template(args: tuple[str, ...], values: Mapping[str, Any]) -> tuple[str, ...]:
    """Substitute ``{node_rank}``-style placeholders; ``{{node_rank}}`` is the escape for the
    literal ``{node_rank}``. Other braces (JSON, ``{x}``, ``{{x}}``) are left alone."""

    def fill(match: re.Match[str]) -> str:
        escaped, key = match.groups()
        return "{" + escaped + "}" if escaped else str(values[key])

    return tuple(_TEMPLATE.sub(fill, a) for a in args)


TRIAL_KEYS = ("trial", "sweep_id")  # a sweep trial's own placeholders (sweeps/runner.py)
_TRIAL_TEMPLATE = re.compile(r"\{\{(" + "|".join(TRIAL_KEYS + TEMPLATE_KEYS) + r")\}\}|\{(" + "|".join(TRIAL_KEYS + TEMPLATE_KEYS) + r")\}")


def render_trial_template(args: tuple[str, ...], values: Mapping[str, Any]) -> tuple[str, ...]:
    """A sweep trial's arguments with ``{trial}``, ``{sweep_id}`` and those of ``values``'
    node-level keys filled in (``{job_id}``, ``{output_dir}``...: the rest stay for the nodes);
    ``{{trial}}`` is the literal ``{trial}``."""

    def fill(match: re.Match[str]) -> str:
        escaped, key = match.groups()
        if escaped:
            return "{" + escaped + "}" if escaped in values else match.group(0)
        return str(values[key]) if key in values else match.group(0)

    return tuple(_TRIAL_TEMPLATE.sub(fill, a) for a in args)


def has_template(args: tuple[str, ...]) -> bool:
    """Whether any argument holds a placeholder (or its ``{{...}}`` escape)."""
    return any(_TEMPLATE.search(a) for a in args)
