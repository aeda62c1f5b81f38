"""Users and API tokens of a team server (api/users.py on store/users.py): a token is shown once
and stored as a salted scrypt hash; checking reads one row; revocation and rotation take effect
at the next check; names are checked."""

from __future__ import annotations

import pytest

from phalanx.api import users
from phalanx.errors import NotAuthenticated, UsageError
from phalanx.store import Store


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "p.db")


def test_a_token_is_shown_once_and_stored_only_as_a_salted_slow_hash(store):
    user, token = users.add_user(store, "alice", admin=True)
    assert user.admin and token.startswith("phx_") and len(token) > 50
    rows = store._conn.execute("SELECT id, salt, hash FROM tokens").fetchall()
    assert len(rows) == 1
    token_id, salt, digest = rows[0]
    assert token.split("_")[1] == token_id, "the public part names the row"
    secret = token.split("_", 2)[2]
    dumped = "\n".join(store._conn.iterdump())
    assert secret not in dumped and token not in dumped, "the secret is in no row"
    import hashlib

    assert digest == hashlib.scrypt(secret.encode(), salt=bytes.fromhex(salt), **users.SCRYPT).hex()
    _, other = users.add_user(store, "bob")
    assert store._conn.execute("SELECT COUNT(DISTINCT salt) FROM tokens").fetchone()[0] == 2, "a salt per token"
    assert users.authenticate(store, token).user == "alice" and users.authenticate(store, token).admin
    assert users.authenticate(store, other).user == "bob" and not users.authenticate(store, other).admin


@pytest.mark.parametrize("given, says", [
    (None, "no API token given"),
    ("", "no API token given"),
    ("hunter2", "not a phalanx token"),
    ("phx_0123456789ab_" + "a" * 43, "not valid on this server"),
])
def test_missing_malformed_and_unknown_tokens(store, given, says):
    with pytest.raises(NotAuthenticated, match=says):
        users.authenticate(store, given)


def test_a_wrong_secret_for_a_known_id_is_refused(store):
    _, token = users.add_user(store, "alice")
    with pytest.raises(NotAuthenticated, match="not valid"):
        users.authenticate(store, token[:-1] + ("A" if token[-1] != "A" else "B"))


def test_revoke_and_rotate_take_effect_at_the_next_check(store):
    _, token = users.add_user(store, "carol")
    assert users.authenticate(store, token).user == "carol"  # remembered as checked
    new = users.rotate_token(store, "carol")
    with pytest.raises(NotAuthenticated, match="revoked"):
        users.authenticate(store, token)
    assert users.authenticate(store, new).user == "carol"
    users.revoke_user(store, "carol")
    with pytest.raises(NotAuthenticated, match="revoked"):
        users.authenticate(store, new)
    listed = users.list_users(store)
    assert listed[0]["name"] == "carol" and listed[0]["revoked_at"] is not None and listed[0]["tokens"] == 0
    with pytest.raises(UsageError, match="was revoked"):
        users.rotate_token(store, "carol")
    with pytest.raises(UsageError, match="was revoked"):
        users.add_user(store, "carol")


def test_names_are_checked_and_taken_once(store):
    for bad in ("", "Alice", "a b", "1x", "x" * 65, "ali/ce"):
        with pytest.raises(UsageError, match="invalid user name"):
            users.add_user(store, bad)
    users.add_user(store, "dave")
    with pytest.raises(UsageError, match="user 'dave' exists; give them a new token with: phalanx server token rotate dave"):
        users.add_user(store, "dave")
    assert store.users.count() == 1
    assert store._conn.execute("SELECT COUNT(*) FROM tokens WHERE revoked_at IS NULL").fetchone()[0] == 1
    with pytest.raises(UsageError, match="no user 'erin'"):
        users.revoke_user(store, "erin")
