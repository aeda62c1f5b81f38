"""The users of a team server and their API tokens (migration 7). Rows only: making, hashing
and checking tokens is ``api/users.py``'s business; no secret is ever stored here, only a
token's public id, its salt and its slow hash."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .sql import Writer


@dataclass(frozen=True)
class UserRecord:
    name: str
    admin: bool
    created_at: float
    revoked_at: float | None
    default_project: str | None = None  # where their jobs go when they name none (issue 27)
    tokens: int = 0  # live tokens (``list``)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "admin": self.admin, "created_at": self.created_at,
                "revoked_at": self.revoked_at, "default_project": self.default_project, "tokens": self.tokens}


@dataclass(frozen=True)
class TokenRecord:
    id: str
    user_name: str
    salt: str
    hash: str
    created_at: float
    revoked_at: float | None


_USER = "u.name, u.admin, u.created_at, u.revoked_at, u.default_project"
_TOKEN = "t.id, t.user_name, t.salt, t.hash, t.created_at, t.revoked_at"


class UserTable:
    def __init__(self, store: Writer) -> None:
        self._store = store

    def _read(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        return list(self._store.engine.rows(sql, tuple(params)))

    # -- writes ---------------------------------------------------------------------------------

    def add(self, name: str, admin: bool, at: float) -> bool:
        """A new user; False when the name is taken (a revoked user's too: names stay theirs)."""
        return self._store._write("INSERT INTO users (name, admin, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                                  [name, 1 if admin else 0, at]) == 1

    def remove(self, name: str) -> None:
        """Undo ``add`` (a user whose first token could not be stored)."""
        self._store._write("DELETE FROM users WHERE name = ? AND NOT EXISTS (SELECT 1 FROM tokens WHERE user_name = ?)",
                           [name, name])

    def revoke(self, name: str, at: float) -> bool:
        """The user and every token of theirs stop working now. False: no such live user."""
        changed = self._store._write("UPDATE users SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL", [at, name])
        self.revoke_tokens(name, at)
        return changed == 1

    def add_token(self, token: TokenRecord) -> None:
        self._store._write("INSERT INTO tokens (id, user_name, salt, hash, created_at) VALUES (?, ?, ?, ?, ?)",
                           [token.id, token.user_name, token.salt, token.hash, token.created_at])

    def set_default_project(self, name: str, project: str | None) -> bool:
        return self._store._write("UPDATE users SET default_project = ? WHERE name = ?", [project, name]) == 1

    def revoke_tokens(self, name: str, at: float, keep: str | None = None) -> int:
        """Revoke the user's live tokens (but ``keep``, the one just made by a rotation)."""
        return self._store._write("UPDATE tokens SET revoked_at = ? WHERE user_name = ? AND revoked_at IS NULL AND id <> ?",
                                  [at, name, keep or ""])

    # -- reads ----------------------------------------------------------------------------------

    def get(self, name: str) -> UserRecord | None:
        rows = self._read(f"SELECT {_USER} FROM users u WHERE u.name = ?", [name])
        return _user(rows[0]) if rows else None

    def list(self) -> list[UserRecord]:
        rows = self._read(f"SELECT {_USER}, (SELECT COUNT(*) FROM tokens t WHERE t.user_name = u.name "
                          "AND t.revoked_at IS NULL) FROM users u ORDER BY u.name", [])
        return [_user(row[:5], int(row[5])) for row in rows]

    def token(self, token_id: str) -> tuple[TokenRecord, UserRecord] | None:
        """A token by its public id, with its user: one indexed row."""
        rows = self._read(f"SELECT {_TOKEN}, {_USER} FROM tokens t JOIN users u ON u.name = t.user_name WHERE t.id = ?",
                          [token_id])
        if not rows:
            return None
        row = rows[0]
        return TokenRecord(*row[:6]), _user(row[6:])

    def count(self) -> int:
        return int(self._read("SELECT COUNT(*) FROM users WHERE revoked_at IS NULL", [])[0][0])


def _user(row: tuple[Any, ...], tokens: int = 0) -> UserRecord:
    return UserRecord(name=row[0], admin=bool(row[1]), created_at=row[2], revoked_at=row[3], default_project=row[4],
                      tokens=tokens)
