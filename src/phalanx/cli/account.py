"""``phalanx login | logout | whoami``: which team server this machine's commands go to, as whom.
Thin: parse, one call, render. The login lives in ``remote/login.py``'s file (mode 0600)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("login")(login_cmd)
    app.command("logout")(logout_cmd)
    app.command("whoami")(whoami_cmd)


def login_cmd(
    url: str = typer.Argument(..., help="The server, e.g. https://phalanx.example.com:8443"),
    token_stdin: bool = typer.Option(False, "--token-stdin", help="Read the API token from stdin (CI), not a prompt."),
    ca_cert: Optional[Path] = typer.Option(None, "--ca-cert", help="The CA that signed the server's certificate "
                                           "(default: the system's)."),
) -> None:
    """Log in to a team server with an API token (an admin made it with `phalanx server user
    add`): from then on every command goes to that server, until `phalanx logout`."""
    import getpass

    from ..errors import UsageError
    from ..remote.client import Client
    from ..remote.login import Login, save

    if ca_cert is not None and not ca_cert.is_file():
        raise UsageError(f"--ca-cert {ca_cert}: no such file", "give the PEM file of the server's CA")
    ca = str(ca_cert.resolve()) if ca_cert else None
    client = Client(url, None, ca)  # checks the URL before asking for anything
    if token_stdin:
        token = sys.stdin.readline().strip()
    else:
        token = getpass.getpass(f"API token for {client.url}: ").strip()
    if not token:
        raise UsageError("no token given", f"paste the token an admin gave you, or: echo $TOKEN | phalanx login {client.url} --token-stdin")
    client.token = token
    me = client.call("GET", "/whoami", [("login", "1")])
    where = save(Login(client.url, token, ca, me["user"]))
    _check_version(me.get("version"))
    role = " (admin)" if me.get("admin") else ""
    typer.echo(f"logged in to {client.url} as {me['user']}{role}; saved in {where}")


def _check_version(theirs: object) -> None:
    from importlib.metadata import version

    ours = version("phalanx")
    if theirs and theirs != ours:
        sys.stderr.write(f"phalanx: warning: the server runs phalanx {theirs}, this machine {ours}: "
                         "install the same version here\n")


def logout_cmd() -> None:
    """Forget the saved login: commands use this machine's own store again."""
    from ..remote.login import forget

    was = forget()
    typer.echo(f"logged out of {was.url}" if was else "not logged in")


def whoami_cmd() -> None:
    """Who the commands act as, and where: the server logged in to, or this machine's store."""
    from .face import face

    me = face().whoami()
    if me.get("local"):
        typer.echo(f"{me['user']} (this machine's store)")
        return
    from ..remote.login import current

    login = current()
    where = login.url if login else "the server"
    typer.echo(f"{me['user']} on {where}" + (" (admin)" if me.get("admin") else ""))
