"""``phalanx``: run a training script distributed, and watch, stop and inspect its jobs."""

from __future__ import annotations

import functools
import os
import re
import sys
from typing import Any, List, Optional

import click
import typer

from ..core.rawtext import show_streams
from ..errors import MissingDependency, PhalanxError
from .doctor import DoctorCommand
from .runflags import RunCommand

app = typer.Typer(
    name="phalanx",
    help="Run an existing training script distributed — many processes, GPUs and nodes — with one command.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    suggest_commands=False,  # click suggests once; typer would say it a second time
    context_settings={"help_option_names": ["-h", "--help"]},
)

_DEBUG = False


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"phalanx {version('phalanx')}")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
    local: bool = typer.Option(False, "--local", help="Use this machine's own store, not the server logged in to."),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_version, help="Print the version and exit."),
) -> None:
    global _DEBUG
    _DEBUG = _DEBUG or debug
    if local:
        from . import face

        face.LOCAL = True
        face.face.cache_clear()


# The options of `run` come from the option table (core/options.py, backends' options modules).
app.command("run", cls=RunCommand, context_settings={"allow_interspersed_args": False})(lambda: None)
app.command("doctor", cls=DoctorCommand)(lambda: None)


@app.command("help")
def help_cmd(command: Optional[List[str]] = typer.Argument(None, help="A command (run, sweep show) or a backend (slurm).")) -> None:
    """Show the help of phalanx, of one of its commands (phalanx help run), or the options of one
    backend (phalanx help slurm)."""
    group = _command()
    ctx = click.get_current_context().find_root()
    target: click.Command = group
    for name in command or []:
        sub = target.get_command(ctx, name) if isinstance(target, click.Group) else None
        if sub is None and target is group and len(command or []) == 1:
            from .runflags import backend_help

            typer.echo(backend_help(name), nl=False)  # a backend's options, or the error naming both lists
            return
        if sub is None:
            from ..errors import UsageError

            raise UsageError(f"no such command '{' '.join(command or [])}'", "see: phalanx --help")
        target = sub
    path = " ".join(["phalanx", *(command or [])])
    with click.Context(target, info_name=path, parent=None, help_option_names=["-h", "--help"]) as sub_ctx:
        typer.echo(target.get_help(sub_ctx))


def _register_subcommands() -> None:
    """Commands that live in their own modules (each imports its heavy parts lazily)."""
    from .control import register as register_control
    from .artifacts import register as register_data
    from .manage import register as register_manage
    from .observe import register as register_observe
    from .account import register as register_account
    from .pool import pool_app
    from .secret import secret_app
    from .server import server_app
    from .sweep import sweep_app

    register_control(app)
    app.add_typer(sweep_app, name="sweep")
    register_observe(app)
    register_data(app)
    register_manage(app)
    app.add_typer(pool_app, name="pool")
    app.add_typer(secret_app, name="secret")
    register_account(app)
    app.add_typer(server_app, name="server")
    from .projects import events_cmd

    app.command("events")(events_cmd)


_register_subcommands()


# click >= 8.2 raises this for a bare group; click 8.1 (what skypilot 0.14 pins) prints the help
# and raises Exit(0) itself, so there is nothing to catch (an empty tuple catches nothing).
_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


@functools.lru_cache(maxsize=1)
def _command() -> click.Command:
    """The click command tree, built once per process (building it is most of --help's time)."""
    return typer.main.get_command(app)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one error boundary for the whole CLI."""
    global _DEBUG
    args = sys.argv[1:] if argv is None else argv
    show_streams(sys.stdout, sys.stderr)  # a name or argument that is not UTF-8 is shown, never a UnicodeEncodeError
    _DEBUG = os.environ.get("PHALANX_DEBUG") == "1" or "--debug" in _leading_options(args)
    command = _command()
    try:
        code = command.main(args=args, prog_name="phalanx", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except PhalanxError as exc:
        if _DEBUG:
            raise
        sys.stderr.write(f"phalanx: error: {_one_line(str(exc))}\n")
        sys.exit(exc.exit_code)
    except ModuleNotFoundError as exc:  # an optional package a command imports where it needs it
        extra = EXTRAS.get((exc.name or "").split(".")[0])
        if _DEBUG or extra is None:
            raise
        error = MissingDependency(str(exc.name).split(".")[0], extra)
        sys.stderr.write(f"phalanx: error: {_one_line(str(error))}\n")
        sys.exit(error.exit_code)
    except _NO_ARGS_IS_HELP as exc:  # bare `phalanx` (or `phalanx sweep`): its help
        sys.stdout.write(exc.ctx.get_help() + "\n")
        sys.exit(0)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.stderr.write("phalanx: aborted\n")
        sys.exit(130)
    except KeyboardInterrupt:
        sys.stderr.write("phalanx: interrupted\n")
        sys.exit(130)
    except click.exceptions.ClickException as exc:  # usage errors: one line, exit 2
        if _DEBUG:
            raise
        message = _one_line(exc.format_message()).rstrip(".").replace(". Did you mean", "; did you mean")
        message = re.sub(r"\.? \(Did you mean (?:one of: )?(.*)\?\)$", r"; did you mean \1?", message)
        ctx = getattr(exc, "ctx", None)
        where = f"{ctx.command_path} --help" if ctx is not None else "phalanx --help"
        sys.stderr.write(f"phalanx: error: {message[0].lower() + message[1:] if message else 'bad usage'}; see: {where}\n")
        sys.exit(getattr(exc, "exit_code", 2))


# Optional packages (pyproject.toml's extras) by the name they are imported as: a command that
# needs one that is missing says which extra brings it, in one line, instead of a traceback.
EXTRAS = {"starlette": "web", "uvicorn": "web", "plotly": "web", "psycopg": "postgres", "psycopg_pool": "postgres",
          "optuna": "sweeps", "fsspec": "storage", "s3fs": "storage", "torch": "torch", "jax": "jax",
          "boto3": "sagemaker", "botocore": "sagemaker", "ray": "ray", "sky": "skypilot", "keyring": "secrets",
          "mlflow": "mlflow", "wandb": "wandb", "tensorboard": "tensorboard", "pynvml": "gpu"}


def _one_line(text: str) -> str:
    """Errors are one line: a value with a line break in it (any that str.splitlines knows)
    must not break that."""
    return " ".join(text.splitlines())


def _leading_options(args: list[str]) -> list[str]:
    """Options before the run target (``--debug`` after the script belongs to the script)."""
    commands = set(_command().commands)  # type: ignore[attr-defined]
    lead = []
    for word in args:
        if not word.startswith("-") and word not in commands:
            break
        lead.append(word)
    return lead
