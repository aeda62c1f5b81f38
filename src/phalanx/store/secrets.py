"""The secrets a team server keeps (migration 10): rows only, their values AES-256-GCM ciphertext
sealed and opened by ``secrets/server.py`` (which also says who may touch which). ``scope`` is
``user`` (``owner`` the user) or ``project`` (``owner`` the project)."""

from __future__ import annotations

from typing import Any

from . import tx

_INFO = "scope, owner, name, created_at, updated_at, set_by"


class SecretTable:
    def __init__(self, store: Any) -> None:
        self._store = store

    def put(self, scope: str, owner: str, name: str, ciphertext: str, nonce: str, at: float, by: str) -> bool:
        """Store (or replace) one sealed value; True when it was new."""
        def write(t: tx.Tx) -> bool:
            if t.execute("UPDATE secrets SET ciphertext = ?, nonce = ?, updated_at = ?, set_by = ? "
                         "WHERE scope = ? AND owner = ? AND name = ?", [ciphertext, nonce, at, by, scope, owner, name]):
                return False
            t.execute("INSERT INTO secrets (scope, owner, name, ciphertext, nonce, created_at, updated_at, set_by) "
                      "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [scope, owner, name, ciphertext, nonce, at, at, by])
            return True

        return tx.atomic(self._store, write)

    def delete(self, scope: str, owner: str, name: str) -> bool:
        return tx.atomic(self._store, lambda t: t.execute(
            "DELETE FROM secrets WHERE scope = ? AND owner = ? AND name = ?", [scope, owner, name])) > 0

    def sealed(self, scope: str, owner: str, name: str) -> tuple[str, str] | None:
        """(nonce, ciphertext) of one secret, or None."""
        found = tx.rows(self._store, "SELECT nonce, ciphertext FROM secrets WHERE scope = ? AND owner = ? AND name = ?",
                        [scope, owner, name])
        return (str(found[0][0]), str(found[0][1])) if found else None

    def infos(self, user: str) -> list[tuple[Any, ...]]:
        """(scope, owner, name, created, updated, set_by) of ``user``'s own secrets, then of
        every project's, each by name: never a value."""
        own = tx.rows(self._store, f"SELECT {_INFO} FROM secrets WHERE scope = 'user' AND owner = ? ORDER BY name", [user])
        return own + tx.rows(self._store, f"SELECT {_INFO} FROM secrets WHERE scope = 'project' ORDER BY owner, name")
