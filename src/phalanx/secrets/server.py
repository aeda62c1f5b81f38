"""Secrets a team server keeps (docs/secrets.md, "On a team server"): per user and per project,
in the store's ``secrets`` table (migration 10), encrypted at rest with AES-256-GCM under a key
the operator gives the server (``phalanx server --secrets-key-file FILE``, which sets
``PHALANX_SECRETS_KEY_FILE`` for the server and every supervisor it starts).

- ``NAME`` is the acting user's own secret (only they set, remove and use it);
- ``PROJECT/NAME`` is a project's: its admins (and server admins) set and remove it, its
  members use it.

The GCM associated data binds each ciphertext to its scope, owner and name, so a row copied
under another name or owner does not decrypt. A value leaves this module only through ``get``
(the supervisor, for the ranks' environment): never in a listing, an answer or an audit row.
Without a key the server keeps no secrets, and says so in one line.
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from pathlib import Path
from typing import Any, Callable

from ..core.identity import Principal
from ..errors import NotAllowed, SecretError, UsageError
from .base import SCOPED, SecretInfo, SecretStore, check_name, check_value

# The store (``phalanx.store.Store``, a floor beside this one: its ``secrets`` table and users and
# projects are reached through the object handed in, never imported).
Store = Any

KEY_ENV = "PHALANX_SECRETS_KEY_FILE"
KEY_BYTES = 32
NONCE_BYTES = 12


def new_key() -> str:
    """A fresh key as its file holds it: 32 random bytes, base64."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


def no_key() -> SecretError:
    return SecretError("this server keeps no secrets: its operator has not given it a key (--secrets-key-file)",
                       "the operator starts it with: phalanx server --secrets-key-file FILE "
                       "(make one with: phalanx server secrets-key > FILE); or keep the secret on your machine: "
                       "phalanx --local secret ...")


def load_key(path: str | Path | None = None) -> bytes:
    """The operator's key, from ``path`` or ``PHALANX_SECRETS_KEY_FILE``. SecretError (exit 2):
    none configured, unreadable, or not 32 bytes of base64."""
    where = str(path) if path else os.environ.get(KEY_ENV, "")
    if not where:
        raise no_key()
    try:
        text = Path(where).read_text().strip()
    except OSError as exc:
        raise SecretError(f"cannot read the secrets key file {where}: {exc.strerror or exc}",
                          "give a readable file holding 32 random bytes in base64 (phalanx server secrets-key)") from None
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise SecretError(f"the secrets key file {where} does not hold 32 bytes in base64",
                          "make one with: phalanx server secrets-key > FILE (or head -c32 /dev/urandom | base64)")
    return key


def _aad(scope: str, owner: str, name: str) -> bytes:
    return "\x00".join(("phalanx-secret-v1", scope, owner, name)).encode()


def seal(key: bytes, scope: str, owner: str, name: str, value: str) -> tuple[str, str]:
    """(nonce, ciphertext), each base64: ``value`` under ``key``, bound to scope/owner/name."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(NONCE_BYTES)
    sealed = AESGCM(key).encrypt(nonce, value.encode(), _aad(scope, owner, name))
    return base64.b64encode(nonce).decode(), base64.b64encode(sealed).decode()


def unseal(key: bytes, scope: str, owner: str, name: str, nonce: str, sealed: str) -> str:
    """The value ``seal`` sealed; SecretError when this key or this name did not seal it."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        return AESGCM(key).decrypt(base64.b64decode(nonce), base64.b64decode(sealed), _aad(scope, owner, name)).decode()
    except (InvalidTag, binascii.Error, ValueError):
        shown = f"{owner}/{name}" if scope == "project" else name
        raise SecretError(f"the secret '{shown}' cannot be decrypted with this server's key",
                          "start the server with the key that sealed it (--secrets-key-file), "
                          "or set the secret again") from None


def split(name: str, user: str) -> tuple[str, str, str]:
    """(scope, owner, name): ``PROJECT/NAME`` a project's, ``NAME`` ``user``'s own."""
    check_name(name)
    if SCOPED.match(name):
        project, _, short = name.partition("/")
        return "project", project, short
    return "user", user, name


class ServerSecrets:
    """The table, as ``who`` may use it: the verbs of ``secret set/list/rm`` through the server."""

    where = "the team server"

    def __init__(self, store: Store, who: Principal, key: bytes | None = None) -> None:
        self.store = store
        self.who = who
        self.key = key if key is not None else load_key()

    def _writable(self, name: str) -> tuple[str, str, str]:
        scope, owner, short = split(name, self.who.user)
        if scope == "project":
            if not self.who.sees(owner) or self.store.projects.get(owner) is None:
                raise UsageError(f"no project '{owner}'", "see: phalanx server project list")
            if not self.who.may_manage(owner):
                raise NotAllowed(f"only an admin of project '{owner}' may set or remove its secrets",
                                 f"ask one of them, or keep it as your own: phalanx secret set {short}")
        return scope, owner, short

    def set(self, name: str, value: str) -> bool:
        scope, owner, short = self._writable(name)
        nonce, sealed = seal(self.key, scope, owner, short, check_value(value))
        return bool(self.store.secrets.put(scope, owner, short, sealed, nonce, time.time(), self.who.user))

    def remove(self, name: str) -> bool:
        scope, owner, short = self._writable(name)
        return bool(self.store.secrets.delete(scope, owner, short))

    def list(self) -> list[SecretInfo]:
        """Own secrets, then those of the projects ``who`` is in (a server admin: every project's)."""
        out = []
        for scope, owner, name, created, updated, _ in self.store.secrets.infos(self.who.user):
            if scope == "user":
                out.append(SecretInfo(name, owner, created, updated, "server"))
            elif self.who.sees(owner) and self.who.role(owner) is not None:
                out.append(SecretInfo(f"{owner}/{name}", owner, created, updated, "server"))
        return out

    def read(self, name: str) -> str:
        """The value of ``name`` for ``who`` to use: their own, or a project's they are a member
        of (viewers run nothing). One answer for "none" and "not yours": nothing is told."""
        scope, owner, short = split(name, self.who.user)
        if scope == "project" and not self.who.at_least(owner, "member"):
            raise self.missing(name)
        found = self.store.secrets.sealed(scope, owner, short)
        if found is None:
            raise self.missing(name)
        return unseal(self.key, scope, owner, short, found[0], found[1])

    def missing(self, name: str) -> SecretError:
        own = "" if "/" in name else " (your own)"
        return SecretError(f"no secret '{name}'{own} you may read on {self.where}",
                           f"see: phalanx secret list; set it with: phalanx secret set {name} "
                           "(a project's: by one of its admins)")


class JobSecrets(SecretStore):
    """What a job's supervisor (and the submit's check) reads: the secrets its submitter may
    use, on their behalf (``Backend.secret_store``). Who they are (their roles now) and the key
    are read at each ``get``, so a retry sees a membership or a value as it is then."""

    where = "the team server"

    def __init__(self, store: Store, user: str) -> None:
        self.store = store
        self.user = user

    def _inner(self) -> ServerSecrets:
        found = self.store.users.get(self.user)
        who = Principal(user=self.user, admin=bool(found and found.admin and found.revoked_at is None),
                        projects=self.store.projects.roles_of(self.user))
        return ServerSecrets(self.store, who)

    def get(self, name: str) -> str:
        return self._inner().read(name)

    def set(self, name: str, value: str, owner: str) -> bool:
        raise SecretError("a job cannot set secrets", "use: phalanx secret set NAME")

    def list(self) -> list[SecretInfo]:
        return self._inner().list()

    def remove(self, name: str) -> bool:
        raise SecretError("a job cannot remove secrets", "use: phalanx secret rm NAME")


def for_spec(spec: Any, store: Store | Callable[[], Store]) -> SecretStore | None:
    """Where the secrets of ``spec`` are read: a job submitted through a team server (its
    environment names its submitter, ``PHALANX_USER``, which the server sets; the server and
    its supervisors have ``PHALANX_SECRETS_KEY_FILE`` set, empty when it has no key) reads the
    server's table as that user; any other job, None (its user's own store here). ``store``:
    the store, or what opens it (called only when needed)."""
    user = (spec.env or {}).get("PHALANX_USER") if spec is not None else None
    if not user or not spec.secrets or KEY_ENV not in os.environ:
        return None
    return JobSecrets(store() if callable(store) else store, user)
