"""The secrets a team server keeps (secrets/server.py, api/serversecrets.py), in process on a store
of each engine: the cipher (AES-256-GCM, bound to scope/owner/name: a tampered or moved row does not
decrypt, another key reads nothing), the key file, who may set, list, remove and use what, the
audit rows (names only), and the table holding ciphertext only. A real server, real jobs and a
real PostgreSQL dump: tests/server/test_secrets.py."""

from __future__ import annotations

import base64

import pytest

from phalanx import config
from phalanx.api import audit, projects, serversecrets, users
from phalanx.core.identity import Principal
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec
from phalanx.errors import NotAllowed, SecretError, UsageError
from phalanx.secrets import server as kept
from phalanx.store import Store, tx

ROOT = Principal.here(config.user())
CANARY = "unit-canary-5c2e91d7ab"


@pytest.fixture
def key_file(tmp_path, monkeypatch):
    path = tmp_path / "secrets.key"
    path.write_text(kept.new_key() + "\n")
    monkeypatch.setenv(kept.KEY_ENV, str(path))
    return path


def test_the_cipher_binds_each_value_to_its_scope_owner_and_name_and_key():
    key = base64.b64decode(kept.new_key())
    nonce, sealed = kept.seal(key, "project", "vision", "hf", CANARY)
    assert CANARY not in sealed and kept.unseal(key, "project", "vision", "hf", nonce, sealed) == CANARY
    assert kept.seal(key, "project", "vision", "hf", CANARY) != (nonce, sealed), "a fresh nonce each time"
    for scope, owner, name in (("project", "vision", "other"), ("project", "nlp", "hf"), ("user", "vision", "hf")):
        with pytest.raises(SecretError, match="cannot be decrypted with this server's key"):
            kept.unseal(key, scope, owner, name, nonce, sealed)
    raw = bytearray(base64.b64decode(sealed))
    raw[3] ^= 1
    with pytest.raises(SecretError, match="cannot be decrypted"):
        kept.unseal(key, "project", "vision", "hf", nonce, base64.b64encode(bytes(raw)).decode())
    with pytest.raises(SecretError, match="cannot be decrypted"):
        kept.unseal(base64.b64decode(kept.new_key()), "project", "vision", "hf", nonce, sealed)


def test_the_key_file_must_hold_32_bytes_of_base64_and_none_is_said_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(kept.KEY_ENV, raising=False)
    with pytest.raises(SecretError) as none:
        kept.load_key()
    assert "this server keeps no secrets: its operator has not given it a key (--secrets-key-file)" in str(none.value)
    short = tmp_path / "short"
    short.write_text(base64.b64encode(b"x" * 16).decode())
    for bad in (short, tmp_path / "absent"):
        with pytest.raises(SecretError, match="secrets key file"):
            kept.load_key(bad)
    good = tmp_path / "good"
    good.write_text(kept.new_key())
    assert len(kept.load_key(good)) == 32


@pytest.fixture
def store(store_at, tmp_path, monkeypatch, key_file):
    """Users alice (server admin), bob, carol, dan; project vision: bob admin, carol member, dan viewer."""
    monkeypatch.setenv("PHALANX_HOME", str(tmp_path / "home"))
    found = Store(store_at)
    for name in ("alice", "bob", "carol", "dan", "erin"):
        users.add_user(found, name, name == "alice")
    projects.add_project(found, ROOT, "vision")
    for user, role in (("bob", "admin"), ("carol", "member"), ("dan", "viewer")):
        projects.set_member(found, ROOT, "vision", user, role)
    return found


def who(store: Store, name: str) -> Principal:
    user = store.users.get(name)
    assert user is not None
    return Principal(user=name, admin=user.admin, projects=store.projects.roles_of(name), address="10.0.0.9")


def test_who_may_set_list_remove_and_use_which_secret(store):
    bob, carol, dan, erin = (who(store, n) for n in ("bob", "carol", "dan", "erin"))
    assert serversecrets.secret_set(store, bob, "vision/hf", CANARY)["new"] is True
    assert serversecrets.secret_set(store, carol, "MINE", CANARY + "-carol")["new"] is True
    assert serversecrets.secret_set(store, carol, "MINE", CANARY + "-carol2")["new"] is False
    with pytest.raises(NotAllowed, match="only an admin of project 'vision'"):
        serversecrets.secret_set(store, carol, "vision/hf", "stolen-value")
    for outsider in (erin,):
        with pytest.raises(UsageError, match="no project 'vision'"):
            serversecrets.secret_set(store, outsider, "vision/hf", "stolen-value")
    with pytest.raises(UsageError, match="no project 'nope'"):
        serversecrets.secret_set(store, who(store, "alice"), "nope/x", "value-x")

    listed = {u: serversecrets.secret_list(store, p) for u, p in (("carol", carol), ("dan", dan), ("erin", erin))}
    assert [s["name"] for s in listed["carol"]] == ["MINE", "vision/hf"]
    assert [s["name"] for s in listed["dan"]] == ["vision/hf"] and listed["erin"] == []
    assert CANARY not in repr(listed)

    as_job = {u: kept.JobSecrets(store, u) for u in ("carol", "dan", "erin", "bob")}
    assert as_job["carol"].get("vision/hf") == CANARY and as_job["carol"].get("MINE") == CANARY + "-carol2"
    assert as_job["bob"].get("vision/hf") == CANARY
    for user, name in (("dan", "vision/hf"), ("erin", "vision/hf"), ("bob", "MINE")):
        with pytest.raises(SecretError, match=f"no secret '{name}'"):
            as_job[user].get(name)

    with pytest.raises(SecretError, match="no secret 'GONE'"):
        serversecrets.secret_rm(store, carol, "GONE")
    serversecrets.secret_rm(store, bob, "vision/hf")
    with pytest.raises(SecretError, match="no secret 'vision/hf'"):
        as_job["carol"].get("vision/hf")

    rows = tx.rows(store, "SELECT scope, owner, name, ciphertext, nonce, set_by FROM secrets")
    assert [r[:3] for r in rows] == [("user", "carol", "MINE")] and CANARY not in repr(rows)
    events = [(e["user"], e["action"], e["target"], e["outcome"]) for e in audit.events(store, ROOT, limit=100)
              if e["action"].startswith("secret.")]
    assert ("bob", "secret.set", "vision/hf", "ok") in events and ("carol", "secret.set", "vision/hf", "denied") in events
    assert ("bob", "secret.rm", "vision/hf", "ok") in events and CANARY not in repr(audit.events(store, ROOT, limit=100))


def test_a_row_moved_to_another_owner_does_not_decrypt(store):
    serversecrets.secret_set(store, who(store, "carol"), "MINE", CANARY)
    tx.atomic(store, lambda t: t.execute("UPDATE secrets SET owner = 'erin' WHERE owner = 'carol'"))
    with pytest.raises(SecretError, match="cannot be decrypted"):
        kept.JobSecrets(store, "erin").get("MINE")


def test_only_a_job_submitted_through_a_server_reads_the_servers_table(store, monkeypatch):
    spec = JobSpec(entrypoint=Entrypoint(EntrypointKind.SCRIPT, "/tmp/t.py"), secrets={"HF": "vision/hf"})
    assert kept.for_spec(spec, store) is None, "a job of one's own reads one's own store"
    served = spec.with_(env={"PHALANX_USER": "carol"})
    assert isinstance(kept.for_spec(served, store), kept.JobSecrets)
    assert kept.for_spec(served.with_(secrets={}), store) is None
    monkeypatch.setenv(kept.KEY_ENV, "")  # a server without a key: its table still, which says it keeps none
    with pytest.raises(SecretError, match="keeps no secrets"):
        kept.for_spec(served, store).get("vision/hf")  # type: ignore[union-attr]
    monkeypatch.delenv(kept.KEY_ENV)  # no server here: --env PHALANX_USER=... on one's own machine
    assert kept.for_spec(served, store) is None
