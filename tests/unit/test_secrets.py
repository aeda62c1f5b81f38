"""Secrets (docs/secrets.md): the masker on byte streams, the local store's file and its checks, the
keyring path (a fake keyring, named so), ``--secret`` and ``secrets:`` read into a spec that holds
names only, what a plan renders, and the warm pools' key and environment without the values."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.errors import SecretError, UsageError
from phalanx.secrets.local import LocalStore
from phalanx.secrets.mask import MASK, Masker, mask_text, secret_values

VALUE = b"hf_Zq8canary41xY"


def _fed(values: list[bytes], pieces: list[bytes]) -> bytes:
    masker = Masker(values)
    return b"".join(masker.feed(p) for p in pieces) + masker.flush()


# -- the masker --------------------------------------------------------------------------------


def test_a_value_is_masked_whole_and_at_every_split_point():
    text = b"token=" + VALUE + b" done\n"
    for cut in range(len(text) + 1):
        assert _fed([VALUE], [text[:cut], text[cut:]]) == b"token=" + MASK + b" done\n", cut
    assert _fed([VALUE], [bytes([b]) for b in text]) == b"token=" + MASK + b" done\n"  # a byte per write


def test_carriage_return_redraws_are_masked_and_nothing_is_lost():
    """A progress line redrawn with \\r: every full occurrence masked; the prefixes of a value that
    a redraw showed before it was whole are other bytes, kept as written."""
    redraws = [b"\r" + VALUE[:4], b"\r" + VALUE[:9], b"\r" + VALUE, b"\r" + VALUE + b" 100%\n"]
    out = _fed([VALUE], redraws)
    assert VALUE not in out
    assert out == b"\r" + VALUE[:4] + b"\r" + VALUE[:9] + b"\r" + MASK + b"\r" + MASK + b" 100%\n"


def test_held_bytes_that_turn_out_not_to_be_a_value_come_out_at_once():
    masker = Masker([VALUE])
    assert masker.feed(b"loss=0.1 hf_Zq") == b"loss=0.1 "  # could be the start of the value: held
    assert masker.feed(b"X and more") == b"hf_ZqX and more"  # it was not: released with what follows
    assert masker.feed(b"hf_") == b""
    assert masker.flush() == b"hf_"  # the end of the stream releases the rest
    assert masker.feed(b"cut off: " + VALUE[:-2]) == b"cut off: "
    assert masker.flush() == MASK  # most of a value, cut off by the stream's end: masked


def test_values_that_overlap_or_repeat():
    a, b = b"secretvalue", b"secret"
    assert _fed([a, b], [b"x secretvaluesecret secretval"]) == b"x " + MASK + MASK + b" " + MASK + b"val"
    assert _fed([b"aaab"], [b"aaaab"]) == b"a" + MASK  # the value starts after a false start
    assert _fed([], [b"nothing to mask"]) == b"nothing to mask"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"b", b"hf_", b"\r", b"\n", VALUE, VALUE[:5], VALUE[5:]]), max_size=30),
       st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_masking_a_stream_in_pieces_is_masking_it_whole(parts, cuts):
    """However the bytes are cut into writes, the masked stream is the same as the whole one
    masked at once, and holds no value."""
    text = b"".join(parts)
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[i:j] for i, j in zip([0, *points], [*points, len(text)])]
    whole = _fed([VALUE], [text])
    assert _fed([VALUE], pieces) == whole
    assert VALUE not in whole


def test_mask_text_and_the_values_named_in_the_environment():
    environ = {"PHALANX_SECRET_VARS": "HF_TOKEN,EMPTY,MISSING", "HF_TOKEN": VALUE.decode(), "EMPTY": ""}
    values = secret_values(environ)
    assert values == [VALUE]
    assert mask_text(f"ValueError: bad token {VALUE.decode()}", values) == "ValueError: bad token ********"


# -- the local store ---------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "cfg" / "phalanx" / "secrets.json")


def test_set_get_list_remove_and_the_file_is_the_users_alone(store):
    assert store.set("HF_TOKEN", VALUE.decode(), owner="ada") is True
    assert store.set("HF_TOKEN", "second-value", owner="ada") is False
    assert store.get("HF_TOKEN") == "second-value"
    info = store.list()
    assert [(i.name, i.owner, i.where) for i in info] == [("HF_TOKEN", "ada", "file")]
    assert info[0].updated >= info[0].created
    assert "value" not in json.dumps([i.to_dict() for i in info]) and "second-value" not in json.dumps([i.to_dict() for i in info])
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.path.parent.stat().st_mode) == 0o700
    assert store.remove("HF_TOKEN") is True and store.remove("HF_TOKEN") is False
    with pytest.raises(SecretError, match="no secret 'HF_TOKEN' in the secrets of this user"):
        store.get("HF_TOKEN")


def test_a_file_open_to_others_or_not_ours_is_refused_in_one_line(store, tmp_path):
    store.set("HF_TOKEN", VALUE.decode(), owner="ada")
    store.path.chmod(0o644)
    with pytest.raises(SecretError) as exc:
        store.get("HF_TOKEN")
    assert "is open to other users (mode 644)" in str(exc.value) and f"chmod 600 {store.path}" in str(exc.value)
    assert "\n" not in str(exc.value) and exc.value.exit_code == 2
    with pytest.raises(SecretError, match="open to other users"):
        store.list()  # nothing of it is read, names neither
    store.path.chmod(0o600)
    if os.geteuid() == 0:  # only root can give a file away
        os.chown(store.path, 65534, -1)
        with pytest.raises(SecretError, match="belongs to uid 65534, not to this user"):
            store.get("HF_TOKEN")
        os.chown(store.path, 0, -1)
    target = tmp_path / "elsewhere.json"
    store.path.rename(target)
    store.path.symlink_to(target)
    with pytest.raises(SecretError, match="is a symbolic link"):
        store.get("HF_TOKEN")


def test_a_directory_others_may_write_is_refused(store):
    store.set("HF_TOKEN", VALUE.decode(), owner="ada")
    store.path.parent.chmod(0o777)
    with pytest.raises(SecretError, match="may be written by other users"):
        store.get("HF_TOKEN")


def test_names_and_values_the_store_refuses(store):
    for name in ("", "-x", "a b", "x" * 200, "a/b/c"):
        with pytest.raises(SecretError, match="is not a secret name"):
            store.set(name, "value", owner="ada")
    with pytest.raises(SecretError, match="lives on a team server"):
        store.set("vision/hf", "value", owner="ada")
    with pytest.raises(SecretError, match="lives on a team server"):
        store.get("vision/hf")
    with pytest.raises(SecretError, match="belong to AWS Secrets Manager"):
        store.get("arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-AbCdEf")
    with pytest.raises(SecretError, match="empty"):
        store.set("X", "", owner="ada")
    with pytest.raises(SecretError, match="NUL"):
        store.set("X", "a\x00b", owner="ada")
    assert not store.path.exists(), "nothing was written"


class FakeKeyring:
    """A FAKE of the keyring module's three calls (an OS keyring cannot run here)."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], str] = {}

    def set_password(self, service: str, name: str, value: str) -> None:
        self.values[(service, name)] = value

    def get_password(self, service: str, name: str) -> str | None:
        return self.values.get((service, name))

    def delete_password(self, service: str, name: str) -> None:
        del self.values[(service, name)]


def test_with_a_keyring_the_file_keeps_names_and_the_keyring_the_values(tmp_path):
    ring = FakeKeyring()
    store = LocalStore(tmp_path / "secrets.json", ring)
    store.set("HF_TOKEN", VALUE.decode(), owner="ada")
    assert VALUE not in store.path.read_bytes()
    assert ring.values == {("phalanx", "HF_TOKEN"): VALUE.decode()}
    assert store.get("HF_TOKEN") == VALUE.decode()
    assert [i.where for i in store.list()] == ["keyring"]
    with pytest.raises(SecretError, match="kept in the OS keyring, which cannot be reached here"):
        LocalStore(store.path).get("HF_TOKEN")  # the same file where no keyring is usable
    LocalStore(store.path).set("HF_TOKEN", "now-in-the-file", owner="ada")  # set again where no keyring is
    assert store.get("HF_TOKEN") == "now-in-the-file"
    store.remove("HF_TOKEN")  # with the keyring at hand, its old copy goes too
    assert ring.values == {}
    ring.set_password("phalanx", "GONE", "x")
    store.set("GONE", "v" * 8, owner="ada")
    ring.values.clear()
    with pytest.raises(SecretError, match="holds no value for secret 'GONE'"):
        store.get("GONE")


def test_no_usable_keyring_here_means_the_file(monkeypatch, tmp_path):
    """The keyring package is installed (test extra) but this machine has no keyring service:
    its "fail" backend is no keyring, and the store falls back to the file."""
    from phalanx.secrets import local

    monkeypatch.setenv("PHALANX_SECRETS_FILE", str(tmp_path / "s.json"))
    monkeypatch.delenv("PHALANX_SECRETS_STORE", raising=False)
    assert local.usable_keyring() is None
    assert local.open_store().keyring is None
    monkeypatch.setenv("PHALANX_SECRETS_STORE", "keyring")
    with pytest.raises(SecretError, match="no usable OS keyring"):
        local.open_store()
    monkeypatch.setenv("PHALANX_SECRETS_STORE", "vault")
    with pytest.raises(SecretError, match="use auto, file or keyring"):
        local.open_store()


def test_the_default_file_is_under_the_config_directory_not_the_home(monkeypatch, tmp_path):
    from phalanx.secrets.local import default_path

    monkeypatch.delenv("PHALANX_SECRETS_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PHALANX_HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "xdg" / "phalanx" / "secrets.json"


# -- --secret, secrets:, the spec and the plan -------------------------------------------------


def _spec(tmp_path: Path, monkeypatch, job: str | None = None, **given):
    from phalanx.jobfile import RunOptions, build_spec, resolve

    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    if job is not None:
        (tmp_path / "job.yaml").write_text(job)
        given["job_file"] = str(tmp_path / "job.yaml")
    opts = RunOptions(words=[] if job else ["train.py"], **given)
    values = resolve(opts)
    return build_spec(opts, values), values


def test_secret_flags_and_the_job_file_give_names_only(tmp_path, monkeypatch):
    spec, _ = _spec(tmp_path, monkeypatch, secrets=["HF_TOKEN", "WANDB_API_KEY=wandb_team"])
    assert spec.secrets == {"HF_TOKEN": "HF_TOKEN", "WANDB_API_KEY": "wandb_team"}
    spec, _ = _spec(tmp_path, monkeypatch, job="script: train.py\nsecrets: [HF_TOKEN, DB=prod.db]\n")
    assert spec.secrets == {"HF_TOKEN": "HF_TOKEN", "DB": "prod.db"}
    spec, _ = _spec(tmp_path, monkeypatch, job="script: train.py\nsecrets: {HF_TOKEN: hf_org}\n", secrets=["DB"])
    assert spec.secrets == {"HF_TOKEN": "hf_org", "DB": "DB"}  # the command line adds to the file's
    assert json.loads(json.dumps(spec.to_dict()))["secrets"] == {"HF_TOKEN": "hf_org", "DB": "DB"}


@pytest.mark.parametrize("given, message", [
    (["1BAD"], "invalid --secret '1BAD'; use VAR or VAR=SECRET, VAR an environment variable name"),
    (["hf-token"], "name the variable: SOME_VAR=hf-token"),
    (["X=bad name"], "invalid --secret 'X=bad name'; use VAR=SECRET, SECRET a secret's name"),
    (["PHALANX_JOB_ID"], "a variable outside PHALANX_*"),
])
def test_bad_secret_flags_are_one_line(tmp_path, monkeypatch, given, message):
    with pytest.raises(UsageError) as exc:
        _spec(tmp_path, monkeypatch, secrets=given)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_bad_job_file_secret_names_its_line(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match=r"job.yaml:4: secrets\[1\]: expected VAR or VAR=SECRET"):
        _spec(tmp_path, monkeypatch, job="script: train.py\nsecrets:\n  - HF_TOKEN\n  - 9LIVES\n")


def test_env_and_secret_for_one_variable_is_refused_and_a_credential_in_env_warns_once(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match="HF_TOKEN given both by --env and --secret; keep one"):
        _spec(tmp_path, monkeypatch, env=["HF_TOKEN=x"], secrets=["HF_TOKEN"])
    _, values = _spec(tmp_path, monkeypatch, env=["MY_API_KEY=abc", "DB_PASSWORD=x", "LR=0.1"])
    assert len(values.warnings) == 1
    assert "--env DB_PASSWORD, MY_API_KEY: these look like a credential" in values.warnings[0]
    assert "phalanx secret set DB_PASSWORD, then --secret DB_PASSWORD" in values.warnings[0]
    _, values = _spec(tmp_path, monkeypatch, env=["LR=0.1"])
    assert values.warnings == []


def test_the_plan_shows_the_name_and_holds_no_value(tmp_path, monkeypatch):
    from phalanx.backends.local import LocalBackend
    from phalanx.core.paths import HomePaths
    from phalanx.core.plan import Plan

    spec, _ = _spec(tmp_path, monkeypatch, secrets=["HF_TOKEN"], n="2")
    backend = LocalBackend()
    plan = backend.plan(spec, "abc123", 0, HomePaths(tmp_path / "home"), backend.facts(spec))
    text = plan.render()
    assert "  HF_TOKEN=<secret>\n" in text and "  PHALANX_SECRET_VARS=HF_TOKEN\n" in text
    data = plan.to_dict()
    assert data["nodes"][0]["secrets"] == {"HF_TOKEN": "HF_TOKEN"} and "HF_TOKEN" not in data["nodes"][0]["env"]
    assert [n.secrets for n in Plan.from_dict(json.loads(plan.to_json())).nodes] == [{"HF_TOKEN": "HF_TOKEN"}]
    plain, _ = _spec(tmp_path, monkeypatch)
    assert "secrets" not in backend.plan(plain, "abc123", 0, HomePaths(tmp_path / "home"), backend.facts(plain)).to_dict()["nodes"][0]


def test_a_backend_reads_the_values_at_start_and_says_a_missing_one_as_a_failed_start(tmp_path, monkeypatch):
    from phalanx.backends.local import LocalBackend
    from phalanx.core.plan import NodePlan
    from phalanx.errors import BackendError

    backend = LocalBackend()
    backend.secret_store = LocalStore(tmp_path / "secrets.json")
    backend.secret_store.set("hf_org", VALUE.decode(), owner="ada")
    node = NodePlan(0, "localhost", ("python3",), {}, secrets={"HF_TOKEN": "hf_org"})
    assert backend.secret_env(node) == {"HF_TOKEN": VALUE.decode()}
    backend.secret_store.remove("hf_org")
    with pytest.raises(BackendError, match="no secret 'hf_org'"):
        backend.secret_env(node)


# -- warm pools ----------------------------------------------------------------------------------


def test_a_warm_pool_never_holds_a_value_nor_keys_by_one():
    from phalanx.launch.warm import proto

    base = {"PATH": "/usr/bin", "HOME": "/root"}
    one = {**base, "PHALANX_SECRET_VARS": "HF_TOKEN", "HF_TOKEN": VALUE.decode()}
    other = {**base, "PHALANX_SECRET_VARS": "HF_TOKEN", "HF_TOKEN": "another-value"}
    assert proto.pool_environment(one) == base
    assert proto.pool_key(one) == proto.pool_key(other) == proto.pool_key(base)


def test_a_secrets_file_inside_the_project_never_enters_a_snapshot_or_a_bundle(tmp_path, monkeypatch):
    """A user may keep the secrets file in the project (the secrets_file setting): the code
    snapshot every job takes, and the bundle of a --no-snapshot directory, leave it out."""
    from phalanx.storage.bundle import code_files
    from phalanx.storage.snapshot import list_workdir

    project = tmp_path / "proj"
    (project / ".config").mkdir(parents=True)
    (project / "train.py").write_text("print(1)\n")
    monkeypatch.setenv("PHALANX_SECRETS_FILE", str(project / ".config" / "secrets.json"))
    store = LocalStore(project / ".config" / "secrets.json")
    store.set("HF_TOKEN", VALUE.decode(), owner="ada")
    (project / ".config" / ".secrets.json.99.tmp").write_bytes(VALUE)  # a copy being written
    (project / ".config" / "other.json").write_text("{}")
    listed = list_workdir(project, tmp_path / "home").files
    assert sorted(listed) == [".config/other.json", "train.py"]
    assert sorted(rel for rel, _ in code_files(project)) == [".config/other.json", "train.py"]
