"""``phalanx run``: its flags generated from the option table (``core/options.py``) and every
backend's declared options, so a new option or backend needs no edit here.

Everything after the script (or after ``-m MODULE``, or after ``--``) belongs to the script,
even words that look like phalanx's options: the command line is split there before click sees
it (``split_argv``), which click alone cannot do for an option that takes a value (``-m``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from typer.core import TyperCommand

from ..errors import UsageError

if TYPE_CHECKING:
    from ..core.options import Option

RUN_HELP = """Run SCRIPT (or -m MODULE, or any COMMAND) like `python SCRIPT ARGS`, distributed.

\b
  phalanx run train.py --lr 0.01          one process, like python train.py
  phalanx run -n 4 train.py               1 node x 4 processes (torchrun)
  phalanx run -n 2x2 train.py             2 nodes x 2 processes
  phalanx run --nproc-per-node 4 train.py torchrun's spelling: every torchrun command line works
  phalanx run -m my_pkg.train --epochs 3  a module
  phalanx run -- bash -c 'echo $RANK'     any command
  phalanx run -f job.yaml --lr 0.1        a job file; CLI arguments override it

Everything after the script (or -m MODULE) is passed to it unchanged, even options phalanx
also has. Every option and job-file key: docs/options.md."""

_MODULE_FLAGS = ("-m", "--module")


def run_options() -> tuple[Option, ...]:
    from ..jobfile.values import all_options

    return tuple(o for o in all_options() if o.flags)


def split_argv(args: list[str], options: tuple[Option, ...]) -> list[str]:
    """``args`` with ``--`` inserted where the script's part begins: at the first word that is not
    one of phalanx's options or their values, or right after ``-m MODULE``. An unknown option
    before the script is an error with a suggestion (after ``-f FILE`` it starts the script
    arguments that override the file's)."""
    flags = {flag: o for o in options for flag in o.flags}
    out: list[str] = []
    job_file = False
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            return out + args[i:]
        if not word.startswith("-") or word == "-":
            return out + ["--", *args[i:]]
        name, eq, _ = word.partition("=")
        option = flags.get(name if word.startswith("--") else word)
        if option is None and word in ("-h", "--help"):
            out.append(word)
            i += 1
            continue
        if word == "--debug":  # phalanx's own (main() has seen it), wherever before the script
            i += 1
            continue
        if option is None and not word.startswith("--") and word[:2] in flags and flags[word[:2]].takes_value:
            option, eq = flags[word[:2]], "="  # -n4, -n2x2: the value is attached
        if option is None:
            if job_file:
                return out + ["--", *args[i:]]
            raise UsageError(f"no such option: {word}", _suggest(name, flags) + "; script arguments go after the script")
        taken = 1 if eq or not option.takes_value else 2
        out.extend(args[i:i + taken])
        i += taken
        job_file = job_file or option.name == "job_file"
        if option.name == "module":
            return out + ["--", *args[i:]]
    return out


def _suggest(word: str, flags: dict[str, Option]) -> str:
    import difflib

    close = difflib.get_close_matches(word, [f for f in flags if f.startswith("--")], n=1, cutoff=0.6)
    return f"did you mean {close[0]}?" if close else "see: phalanx run --help"


def _param(option: Option) -> click.Option:
    default = option.default_text()
    help_text = option.help + (f" [default: {default}]" if default and not option.is_flag else "")
    if option.group == "backend" and not help_text.startswith(f"{option.backends[0]}: "):  # shared: says each
        help_text = f"{', '.join(option.backends)}: {help_text}"
    if option.is_flag:
        return click.Option([*option.flags, option.name], is_flag=True, flag_value=option.flag_value, default=None,
                            help=help_text)
    return click.Option([*option.flags, option.name], type=click.UNPROCESSED, multiple=option.repeatable,
                        default=None, metavar=option.shown_metavar, help=help_text)


class RunCommand(TyperCommand):
    """The ``run`` command, its parameters from the option table (``typer`` registers it). They are
    built on first use, so ``phalanx --help`` and the other commands never read the table."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._table: tuple[Option, ...] | None = None
        self._params: list[click.Parameter] | None = None
        kwargs["callback"] = _callback
        kwargs["help"] = RUN_HELP
        super().__init__(*args, **kwargs)

    @property
    def table(self) -> tuple[Option, ...]:
        if self._table is None:
            self._table = self.options_table()
        return self._table

    def options_table(self) -> tuple[Option, ...]:
        """The options this command offers (``doctor`` offers a part of them)."""
        return run_options()

    @property  # type: ignore[override]
    def params(self) -> list[click.Parameter]:
        if self._params is None:
            self._params = [
                click.Argument(["words"], nargs=-1, type=click.UNPROCESSED, metavar="[SCRIPT|COMMAND] [ARGS]..."),
                *(_param(o) for o in self.table),
            ]
        return self._params

    @params.setter
    def params(self, value: list[click.Parameter]) -> None:
        """typer's (none: the function takes no arguments) are replaced by the table's."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, split_argv(list(args), self.table))

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from ..core.options import GROUPS

        records = {p.name: p.get_help_record(ctx) for p in self.get_params(ctx)}
        help_option = self.get_help_option(ctx)
        for group, title in GROUPS.items():
            rows = [records[o.name] for o in self.table if o.group == group and records.get(o.name)]
            if group == "what" and help_option is not None:
                rows.append(help_option.get_help_record(ctx))
            if rows:
                with formatter.section(title):
                    formatter.write_dl([r for r in rows if r is not None])


def _callback(words: tuple[str, ...], **given: Any) -> None:
    from .runflow import run_from_cli

    run_from_cli(list(words), given)
