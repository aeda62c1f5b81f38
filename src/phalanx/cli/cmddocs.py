"""The command reference (``docs/commands.md``), generated from the click command tree so it
cannot drift from ``phalanx --help``: every command and subcommand, its usage, its help and its
options, in the order ``phalanx --help`` lists them. A test compares the file with ``render()``;
regenerate it with::

    python -m phalanx.cli.cmddocs > docs/commands.md

``phalanx run`` takes its options from the option table: they are the option reference
(``docs/options.md``, ``cli/optdocs.py``), and this page links there instead of repeating them.
"""

from __future__ import annotations

import inspect
import re

import click

HEADER = """# Commands

Generated from the command line itself (`python -m phalanx.cli.cmddocs > docs/commands.md`); a
test fails when this page is stale. `phalanx help COMMAND` (or `phalanx COMMAND --help`) prints
the same at the terminal.

A command that names a job takes an id, a unique prefix of one, or a name (the newest job with
that name); a sweep's id or name works wherever a command says so. Errors are one line on stderr
with what to do next, and exit 2 for bad usage; `--debug` (or `PHALANX_DEBUG=1`) shows the
traceback.
"""

RUN_OPTIONS = ("Every option of `phalanx run`, with its job-file key, its default and the backends that "
               "honour it, is in [the option reference](options.md).")


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _help(command: click.Command) -> list[str]:
    """The command's help as Markdown: prose as it is, indented example lines as a code block."""
    lines: list[str] = []
    block = False
    for line in inspect.cleandoc(command.help or "").splitlines():
        if line.strip() == "\b":  # click's mark for a paragraph it must not rewrap
            continue
        example = line.startswith("  ")
        if example != block:
            lines += ["", "```"] if example else ["```", ""]
            block = example
        lines.append(line[2:] if example else line)
    return lines + (["```"] if block else []) + [""]


def _options(command: click.Command, ctx: click.Context) -> list[str]:
    rows = []
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            record = param.get_help_record(ctx)
            if record is not None:
                rows.append(f"| `{_cell(record[0])}` | {_cell(record[1])} |")
    rows.append("| `-h, --help` | Show this message and exit. |")
    return ["| option | meaning |", "|---|---|", *rows, ""]


def _section(command: click.Command, path: list[str]) -> list[str]:
    name = " ".join(path)
    ctx = click.Context(command, info_name=name, parent=None)
    usage = " ".join([name, *command.collect_usage_pieces(ctx)])
    lines = [f"{'#' * len(path)} `{name}`", "", "```", usage, "```", "", *_help(command)]
    if path[1:] == ["run"]:
        lines += [RUN_OPTIONS, ""]
    else:
        lines += _options(command, ctx)
    if isinstance(command, click.Group):
        for sub in command.list_commands(ctx):
            child = command.get_command(ctx, sub)
            if child is not None and not child.hidden:
                lines += _section(child, [*path, sub])
    return lines


def render() -> str:
    from .main import _command

    root = _command()
    ctx = click.Context(root, info_name="phalanx")
    lines = [HEADER]
    assert isinstance(root, click.Group)
    names = [n for n in root.list_commands(ctx) if not root.get_command(ctx, n).hidden]  # type: ignore[union-attr]
    lines += ["| command | what it does |", "|---|---|"]
    for name in names:
        summary = root.get_command(ctx, name).get_short_help_str(limit=120)  # type: ignore[union-attr]
        lines.append(f"| [`phalanx {name}`](#phalanx-{name}) | {_cell(summary)} |")
    lines += ["", "Options of `phalanx` itself, before the command:", ""]
    lines += _options(root, ctx)
    for name in names:
        lines += _section(root.get_command(ctx, name), ["phalanx", name])  # type: ignore[arg-type]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).rstrip() + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(render())
