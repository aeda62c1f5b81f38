"""``phalanx secret set|list|rm``: this user's secrets, which jobs ask for by name (``--secret
NAME``; docs/secrets.md). A value is read from standard input or asked for at the terminal without
echo, never taken from an argument (the shell's history and ``ps`` would show it); ``list`` shows
names, owners and dates, never a value. Thin: parse, one call on the face, render."""

from __future__ import annotations

import sys
from typing import List

import typer

secret_app = typer.Typer(help="Keep tokens and passwords out of a job's records: its ranks get them by name "
                              "(phalanx run --secret NAME).", no_args_is_help=True, add_completion=False,
                         rich_markup_mode=None)

LONGEST = 64 * 1024  # bytes: an environment variable's value must fit the kernel's limit on one (128 KiB)


@secret_app.command("set")
def set_cmd(name: str = typer.Argument(..., help="The secret's name, e.g. HF_TOKEN.")) -> None:
    """Set secret NAME: its value comes from standard input (echo "$TOKEN" | phalanx secret set NAME,
    or < FILE; one final newline is dropped), or, at a terminal, from a prompt that does not echo."""
    from .face import face

    from ..secrets.base import SHORTEST_MASKED

    value = _read_value(name)
    done = face().secret_set(name, value)
    if len(value) < SHORTEST_MASKED:
        sys.stderr.write(f"phalanx: warning: the value of {name} is {len(value)} character(s) long; it is masked "
                         "wherever those characters appear in a job's output\n")
    typer.echo(f"secret {done['name']} {'set' if done['new'] else 'replaced'} in {done['where']}")


@secret_app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Every secret's name, owner, where its value is kept and when it was set; never a value."""
    from .face import face
    from .render import ago, dump_json, table

    secrets = face().secret_list()
    if as_json:
        dump_json(secrets, sys.stdout)
        return
    if not secrets:
        typer.echo("no secrets (set one with: phalanx secret set NAME)")
        return
    table([(s["name"], s["owner"], s["where"], ago(s["created"]), ago(s["updated"])) for s in secrets],
          ("NAME", "OWNER", "KEPT IN", "CREATED", "UPDATED"), sys.stdout)


@secret_app.command("rm")
def rm_cmd(names: List[str] = typer.Argument(..., help="The secrets to forget.")) -> None:
    """Forget secrets. Jobs that ask for one afterwards fail to start, saying which."""
    from .face import face

    for name in names:
        face().secret_rm(name)
        typer.echo(f"secret {name} removed")


def _read_value(name: str) -> str:
    """The value: a prompt without echo at a terminal, else all of standard input."""
    from ..errors import SecretError

    if sys.stdin is None:
        raise SecretError("no standard input to read the secret's value from", "pipe it in: ... | phalanx secret set NAME")
    if sys.stdin.isatty():
        import getpass

        try:
            value = getpass.getpass(f"value of {name} (not shown): ")
        except EOFError:
            value = ""
    else:
        raw = sys.stdin.buffer.read(LONGEST + 1)
        if len(raw) > LONGEST:
            raise SecretError(f"the value on standard input is longer than {LONGEST // 1024} KiB",
                              "an environment variable cannot hold it; keep such data in a file and pass its path")
        value = raw.decode("utf-8", "surrogateescape")
        value = value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else value
    return value
