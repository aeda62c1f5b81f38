"""Who may use a team server: users and their API tokens (``phalanx server user add|list|revoke``,
``phalanx server token rotate``), and turning a token into the ``Principal`` every call on the
face carries.

A token is ``phx_<id>_<secret>``: ``id`` (12 hex digits) is public and names the token's row,
so checking one reads one row; ``secret`` (256 random bits) is never stored, only its scrypt
hash with a salt of its own (a stolen database does not give the tokens away; scrypt makes
trying guesses against it expensive). A token is shown once, when it is made.

Checking a token costs one scrypt (tens of milliseconds) the first time; a server remembers,
per token, that this very secret matched this very stored hash, so later requests cost the
one row read that also says whether the token or its user was revoked since (a revocation
takes effect on the next request).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any

from .. import config
from ..core.identity import Principal
from ..errors import NotAuthenticated, UsageError
from ..store import Store
from ..store.users import TokenRecord, UserRecord

PREFIX = "phx_"
_ID_HEX = 12
_NAME = re.compile(r"^[a-z][a-z0-9._-]{0,63}$")
_TOKEN = re.compile(r"^phx_([0-9a-f]{12})_([A-Za-z0-9_-]{20,128})$")
# scrypt's cost: 2**14 x 8 x 1 needs 16 MiB and some 50 ms per check (RFC 7914's interactive setting).
SCRYPT = {"n": 2 ** 14, "r": 8, "p": 1, "maxmem": 64 * 1024 * 1024, "dklen": 32}


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise UsageError(f"invalid user name '{name}'",
                         "use lower-case letters, digits, '.', '_' and '-', starting with a letter (at most 64)")
    return name


def _hash(secret: str, salt: str) -> str:
    return hashlib.scrypt(secret.encode(), salt=bytes.fromhex(salt), **SCRYPT).hex()


def _new_token(user: str) -> tuple[str, TokenRecord]:
    token_id = secrets.token_hex(_ID_HEX // 2)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    record = TokenRecord(token_id, user, salt, _hash(secret, salt), time.time(), None)
    return f"{PREFIX}{token_id}_{secret}", record


def add_user(store: Store, name: str, admin: bool = False, who: Principal | None = None) -> tuple[UserRecord, str]:
    """A new user and their first token (returned: shown once, never stored). They join the
    project 'default' as a member, as every user of a server did before projects (an admin may
    remove them from it). ``who``: who adds them (the audit log's; default: this machine's user)."""
    from . import audit

    who = who or Principal.here(config.user())
    with audit.audited(store, who, "user.add", name) as event:
        check_name(name)
        token, record = _new_token(name)
        if not store.users.add(name, admin, record.created_at):
            existing = store.users.get(name)
            why = "was revoked (names stay with the jobs they submitted)" if existing and existing.revoked_at else "exists"
            raise UsageError(f"user '{name}' {why}", "pick another name" if existing and existing.revoked_at
                             else f"give them a new token with: phalanx server token rotate {name}")
        try:
            store.users.add_token(record)
            _join_default(store, name, record.created_at)
        except BaseException:
            store.users.remove(name)  # no user without a way in
            raise
        event.detail = {"admin": admin, "token": record.id}
    user = store.users.get(name)
    assert user is not None
    return user, token


def _join_default(store: Store, name: str, at: float) -> None:
    from ..core.identity import DEFAULT_PROJECT
    from ..store import tx
    from ..store.teams import ProjectTable

    def join(t: tx.Tx) -> None:
        if ProjectTable.read(t, DEFAULT_PROJECT) is not None and ProjectTable.member(t, DEFAULT_PROJECT, name) is None:
            ProjectTable.set_member(t, DEFAULT_PROJECT, name, "member", at)

    tx.atomic(store, join)


def list_users(store: Store) -> list[dict[str, Any]]:
    return [u.to_dict() for u in store.users.list()]


def revoke_user(store: Store, name: str, who: Principal | None = None) -> UserRecord:
    """The user and their tokens stop working at once; their jobs stay (and keep their name)."""
    from . import audit

    with audit.audited(store, who or Principal.here(config.user()), "user.revoke", name):
        user = _live(store, name)
        store.users.revoke(user.name, time.time())
    revoked = store.users.get(name)
    assert revoked is not None
    return revoked


def rotate_token(store: Store, name: str, who: Principal | None = None) -> str:
    """A new token for the user; every older one stops working."""
    from . import audit

    with audit.audited(store, who or Principal.here(config.user()), "token.rotate", name) as event:
        user = _live(store, name)
        token, record = _new_token(user.name)
        store.users.add_token(record)
        store.users.revoke_tokens(user.name, time.time(), keep=record.id)
        event.detail = {"token": record.id}
    return token


def _live(store: Store, name: str) -> UserRecord:
    user = store.users.get(check_name(name))
    if user is None:
        raise UsageError(f"no user '{name}'", "list them with: phalanx server user list")
    if user.revoked_at is not None:
        raise UsageError(f"user '{name}' was revoked", "add a user of another name with: phalanx server user add NAME")
    return user


class _Verified:
    """Tokens whose secret was seen to match the stored hash (a bounded LRU; see the docstring)."""

    def __init__(self, size: int = 4096) -> None:
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._lock = threading.Lock()
        self._size = size

    def check(self, record: TokenRecord, secret: str) -> bool:
        key = (record.id, record.hash, hashlib.sha256(secret.encode()).hexdigest())
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return True
        if not secrets.compare_digest(_hash(secret, record.salt), record.hash):
            return False
        with self._lock:
            self._seen[key] = None
            while len(self._seen) > self._size:
                self._seen.popitem(last=False)
        return True


_verified = _Verified()


def authenticate(store: Store, token: str | None) -> Principal:
    """The user ``token`` belongs to, as a ``Principal``. Raises ``NotAuthenticated`` (no token,
    a malformed, unknown or wrong one, a revoked token or user); the message never holds the
    token."""
    if not token:
        raise NotAuthenticated("no API token given", "log in with: phalanx login URL")
    match = _TOKEN.match(token.strip())
    if match is None:
        raise NotAuthenticated("the API token is not a phalanx token (phx_...)", "check it, or ask an admin for a new one")
    found = store.users.token(match.group(1))
    if found is None or not _verified.check(found[0], match.group(2)):
        raise NotAuthenticated("the API token is not valid on this server", "check it, or ask an admin for a new one")
    record, user = found
    if record.revoked_at is not None or user.revoked_at is not None:
        raise NotAuthenticated("the API token was revoked", "ask an admin for a new one (phalanx server token rotate)")
    return Principal(user=user.name, admin=user.admin, projects=store.projects.roles_of(user.name))


def token_owner(store: Store, token: str | None) -> str:
    """Whose token this claims to be, for the audit log of a failed login ('?': no such token)."""
    match = _TOKEN.match((token or "").strip())
    found = store.users.token(match.group(1)) if match else None
    return found[1].name if found else "?"
