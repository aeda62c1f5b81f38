"""``phalanx server``: serve a team (the API under /api/v1, the dashboard) on a shared store, and
manage who may log in: ``server user add|list|revoke``, ``server token rotate``. These act on
the store ``--store`` names (or ``PHALANX_STORE``) directly, so they work before the server
runs. Thin: parse, one call, render."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

if TYPE_CHECKING:
    from ..store import Store

server_app = typer.Typer(help="Serve a team from one store, and manage its users and their tokens.",
                         invoke_without_command=True, add_completion=False, rich_markup_mode=None)
user_app = typer.Typer(help="Who may log in to the server.", no_args_is_help=True, add_completion=False,
                       rich_markup_mode=None)
token_app = typer.Typer(help="API tokens.", no_args_is_help=True, add_completion=False, rich_markup_mode=None)
server_app.add_typer(user_app, name="user")
server_app.add_typer(token_app, name="token")


def _projects() -> typer.Typer:
    from .projects import project_app

    return project_app


server_app.add_typer(_projects(), name="project")

STORE_HELP = "The store (default: PHALANX_STORE, else the SQLite file in PHALANX_HOME), e.g. postgresql://phalanx@db/phalanx."


def _use_store(store: Optional[str]) -> None:
    if store:
        os.environ["PHALANX_STORE"] = store


@server_app.callback()
def serve_cmd(
    ctx: typer.Context,
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to serve on (any but loopback needs TLS or --insecure-http)."),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="Port (0: any free one)."),
    tls_cert: Optional[Path] = typer.Option(None, "--tls-cert", help="TLS certificate (PEM), with --tls-key."),
    tls_key: Optional[Path] = typer.Option(None, "--tls-key", help="Its private key (PEM)."),
    insecure_http: bool = typer.Option(False, "--insecure-http", help="Serve plain HTTP off loopback (a TLS proxy is in front)."),
    lease_ttl: float = typer.Option(30.0, "--lease-ttl", min=1.0, help="Seconds a replica's lease on a job lasts unless renewed: another replica adopts the job after it (docs/server.md, high availability)."),
    secrets_key_file: Optional[Path] = typer.Option(None, "--secrets-key-file", help="The key the users' secrets are encrypted with at rest (32 random bytes, base64: phalanx server secrets-key > FILE; default PHALANX_SECRETS_KEY_FILE). Without one the server keeps no secrets."),
) -> None:
    """Serve the team: the API (/api/v1), the dashboard with a login page, /healthz and /metrics,
    until Ctrl-C. Jobs submitted to it run here, on its backends, with its credentials."""
    _use_store(store)
    if ctx.invoked_subcommand is not None:
        return
    from ..server.serve import serve  # without the web extra: main's one line naming it (EXTRAS)

    def announce(url: str) -> None:
        typer.echo(f"phalanx server: {url}  (Ctrl-C stops; jobs run on)")
        sys.stdout.flush()

    def warn(text: str) -> None:
        typer.echo(text, err=True)

    serve(host, port, store, tls_cert, tls_key, insecure_http, announce, warn, lease_ttl=lease_ttl,
          secrets_key=secrets_key_file)


@server_app.command("secrets-key")
def secrets_key_cmd() -> None:
    """Print a new key for --secrets-key-file (32 random bytes, base64): keep it in a file only the
    server's user may read, and keep a copy: the secrets cannot be read without it."""
    from ..secrets.server import new_key

    typer.echo(new_key())


def _store() -> "Store":
    from ..api.query import open_store

    return open_store()


@user_app.command("add")
def user_add_cmd(
    name: str = typer.Argument(..., help="The user's name (lower-case letters, digits, . _ -)."),
    admin: bool = typer.Option(False, "--admin", help="May act on every user's jobs, prune, and manage users."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
) -> None:
    """Add a user and print their API token, once (it is stored hashed: nobody can show it again)."""
    from ..api.users import add_user

    _use_store(store)
    user, token = add_user(_store(), name, admin)
    typer.echo(token)
    typer.echo(f"phalanx: user {user.name}{' (admin)' if user.admin else ''} added; give them the token above "
               "(shown once): phalanx login URL", err=True)


@user_app.command("list")
def user_list_cmd(
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The users: admin or not, live tokens, when added and revoked."""
    from ..api.users import list_users
    from .render import ago, dump_json, table

    _use_store(store)
    users = list_users(_store())
    if as_json:
        dump_json(users, sys.stdout)
        return
    if not users:
        typer.echo("no users yet: phalanx server user add NAME --admin")
        return
    table([(u["name"], "admin" if u["admin"] else "user", str(u["tokens"]), ago(u["created_at"]),
            ago(u["revoked_at"]) if u["revoked_at"] else "-") for u in users],
          ("NAME", "ROLE", "TOKENS", "ADDED", "REVOKED"), sys.stdout)


@user_app.command("revoke")
def user_revoke_cmd(
    name: str = typer.Argument(..., help="The user to revoke."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
) -> None:
    """Revoke a user: their tokens stop working at once; their jobs stay, under their name."""
    from ..api.users import revoke_user

    _use_store(store)
    revoke_user(_store(), name)
    typer.echo(f"user {name} revoked")


@token_app.command("rotate")
def token_rotate_cmd(
    name: str = typer.Argument(..., help="Whose token."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
) -> None:
    """A new API token for the user, printed once; every older one of theirs stops working."""
    from ..api.users import rotate_token

    _use_store(store)
    typer.echo(rotate_token(_store(), name))
    typer.echo(f"phalanx: {name}'s older tokens no longer work; log in again with the one above", err=True)


@server_app.command("manifests")
def manifests_cmd(
    image: str = typer.Option("phalanx:latest", "--image", help="The server's image: phalanx installed with its web and postgres extras."),
    namespace: str = typer.Option("phalanx", "--namespace", help="Where the server runs, and the jobs it submits to its k8s backend."),
    store_secret: str = typer.Option("phalanx-store", "--store-secret",
                                     help="The Secret holding the store's 'url' (no password in it) and 'password'."),
    tls_secret: Optional[str] = typer.Option(None, "--tls-secret", help="A kubernetes.io/tls Secret: HTTPS in the pod (else a TLS proxy in front)."),
    with_postgres: bool = typer.Option(False, "--with-postgres", help="Add an example PostgreSQL (a StatefulSet and its Service)."),
    systemd: bool = typer.Option(False, "--systemd", help="Print a systemd unit for a server on one machine instead."),
) -> None:
    """Print what a team applies to run the server: Kubernetes objects (kubectl apply -f -), or a
    systemd unit. Nothing is applied."""
    from ..server import deploy

    if systemd:
        if with_postgres or tls_secret:
            from ..errors import UsageError

            raise UsageError("--systemd prints a unit only; --with-postgres and --tls-secret are for Kubernetes",
                             "drop them, or drop --systemd")
        here = Path(sys.executable).parent / "phalanx"
        typer.echo(deploy.systemd(str(here if here.exists() else "/usr/local/bin/phalanx")), nl=False)
        return
    from ..backends.kubernetes.manifests import to_yaml

    typer.echo(to_yaml(deploy.kubernetes(deploy.Deploy(image, namespace, store_secret, tls_secret, with_postgres))), nl=False)
