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

RUN_HELP = """Run SCRIPT (or -m MODULE, or a COMMAND) like python, distributed; the words after
SCRIPT are its own, even options phalanx also has.

\b
  phalanx run train.py --lr 0.01             one process, like python train.py
  phalanx run -n 2x4 train.py                2 nodes x 4 processes (torchrun)
  phalanx run train.py --lr "[0.001, 0.01]"  a sweep: one trial per value"""

HELP_ALL = "--help-all"

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
        if option is None and word in ("-h", "--help", HELP_ALL):
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


def installed_backends() -> list[str]:
    """Every backend this installation can run (the built-ins and the entry points), without
    importing any of them."""
    from ..backends.builtin import BACKENDS
    from ..backends.options import installed_entry_points

    return sorted({**installed_entry_points("phalanx.backends"), **BACKENDS})


def option_help(option: Option, backends: list[str], brief: bool = False) -> str:
    """An option's help line: its default first (``[default: X]``), then, for an option some
    backends share, whose it is, then what it does."""
    text = option.described(backends, brief=brief)
    if option.group == "backend" and not option.help.startswith(f"{option.backends[0]}: "):  # shared: says each
        default, sep, rest = text.partition("] ") if text.startswith("[default: ") else ("", "", text)
        text = f"{default}{sep}{', '.join(option.backends)}: {rest}"
    return text


def _param(option: Option, backends: list[str]) -> click.Option:
    help_text = option_help(option, backends)
    if option.is_flag:
        return click.Option([*option.flags, option.name], is_flag=True, flag_value=option.flag_value, default=None,
                            help=help_text)
    return click.Option([*option.flags, option.name], type=click.UNPROCESSED, multiple=option.repeatable,
                        default=None, metavar=option.shown_metavar, help=help_text)


def _help_all(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    ctx.meta[HELP_ALL] = True
    click.echo(ctx.get_help(), color=ctx.color)
    ctx.exit()


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
            backends = installed_backends()
            self._params = [
                click.Argument(["words"], nargs=-1, type=click.UNPROCESSED, metavar="[SCRIPT|COMMAND] [ARGS]..."),
                *(_param(o, backends) for o in self.table),
                click.Option([HELP_ALL], is_flag=True, expose_value=False, is_eager=True, callback=_help_all,
                             help="Show every option: torchrun's, retries, data, sweeps, each backend's."),
            ]
        return self._params

    @params.setter
    def params(self, value: list[click.Parameter]) -> None:
        """typer's (none: the function takes no arguments) are replaced by the table's."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, split_argv(list(args), self.table))

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The common options (``Option.brief``), or with ``--help-all`` every option by group."""
        from ..core.options import GROUPS

        help_option = self.get_help_option(ctx)
        record = help_option.get_help_record(ctx) if help_option else None
        extra = [record] if record is not None else []
        if not ctx.meta.get(HELP_ALL):
            backends = installed_backends()
            rows = [(_flags_text(o), option_help(o, backends, brief=True)) for o in self.table if o.common]
            with formatter.section("Common options"):
                formatter.write_dl([*rows, *extra, (HELP_ALL, "Every option (phalanx help BACKEND: a backend's).")])
            return
        records = {p.name: p.get_help_record(ctx) for p in self.get_params(ctx)}
        for group, title in GROUPS.items():
            shown = [r for r in (records.get(o.name) for o in self.table if o.group == group) if r is not None]
            if group == "what":
                shown += extra
            if shown:
                with formatter.section(title):
                    formatter.write_dl(shown)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if ctx.meta.get(HELP_ALL):
            return
        hidden = sum(1 for o in self.table if o.flags and not o.common)
        formatter.write_paragraph()
        formatter.write_text(f"{hidden} more (torchrun's, state, data, sweeps, backends'): phalanx run {HELP_ALL}; "
                             "one backend's: phalanx help BACKEND.")


def _flags_text(option: Option) -> str:
    """``-n, --n TOPOLOGY``: the spellings (torchrun's underscore twins left out) and the metavar."""
    flags = [f for f in option.flags if "_" not in f]
    return ", ".join(flags) + (f" {option.shown_metavar}" if option.takes_value and option.shown_metavar else "")


def backend_help(name: str) -> str:
    """``phalanx help BACKEND``: the options only that backend takes (its own, as it declares
    them, and for local torchrun's rendezvous settings), each with its default first, and its
    job-file sections."""
    from ..backends.options import declared, declared_sections
    from ..errors import UsageError

    backends = installed_backends()
    if name not in backends:
        raise UsageError(f"no such command or backend '{name}'", f"commands: phalanx --help; backends: {', '.join(backends)}")
    own = declared(name)
    options = [o for o in run_options() if name in o.backends and o.group != "backend"]
    options += [o.as_option((name,)) for o in own if o.cli]
    formatter = click.HelpFormatter()
    formatter.write_usage(f"phalanx run --backend {name}", "[OPTIONS] [SCRIPT|COMMAND] [ARGS]...")
    formatter.write_paragraph()
    formatter.write_text(f"The options of the {name} backend (in a job file: under backend_options:, or in the "
                         f"section shown). Every option: phalanx run {HELP_ALL}.")
    rows = [(_flags_text(o), o.described(backends)) for o in options]
    with formatter.section(f"Options of the {name} backend"):
        formatter.write_dl(rows or [("(none)", f"the {name} backend takes only the common options")])
    sections = [(f"{s.key}:", s.help) for s in declared_sections(name)]
    sections += [(f"backend_options.{o.name}:", o.help) for o in own if not o.cli]
    if sections:
        with formatter.section("Job-file keys"):
            formatter.write_dl(sections)
    return formatter.getvalue()


def _callback(words: tuple[str, ...], **given: Any) -> None:
    from .runflow import run_from_cli

    run_from_cli(list(words), given)
