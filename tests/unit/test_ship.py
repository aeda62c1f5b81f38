"""What the ssh backend runs on a host to receive a pushed directory (Shipment.command), run here with sh."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from phalanx.backends.ssh import Shipment


def _receive(item: Shipment, digest: str | None = None) -> None:
    """As over ssh: ``tar -c`` of the local side piped into the remote command."""
    has_data = item.local is not None
    tar = subprocess.Popen(["tar", "-cf", "-", "-C", str(item.local), "."], stdout=subprocess.PIPE) if has_data else None
    subprocess.run(["sh", "-c", item.command(digest, has_data)], stdin=tar.stdout if tar else subprocess.DEVNULL, check=True)
    if tar:
        tar.wait()


def test_a_pushed_state_directory_replaces_the_hosts_copy(tmp_path):
    local, remote = tmp_path / "local", tmp_path / "host" / "state" / "run"
    (local / "sub").mkdir(parents=True)
    (local / "sub" / "checkpoint.pt").write_bytes(b"new")
    remote.mkdir(parents=True)
    (remote / "stale.pt").write_bytes(b"from an older run")
    _receive(Shipment("the state directory", local, str(remote)))
    assert sorted(p.relative_to(remote).as_posix() for p in remote.rglob("*")) == ["sub", "sub/checkpoint.pt"]
    assert sorted(p.name for p in remote.parent.iterdir()) == ["run"]  # no leftovers beside it
    _receive(Shipment("the state directory", None, str(remote)))  # --clean-state: nothing local
    assert remote.is_dir() and list(remote.iterdir()) == []


def test_a_marker_records_what_was_sent_and_code_is_extracted_over(tmp_path):
    local, remote = tmp_path / "data", tmp_path / "host" / "cache" / "abc"
    local.mkdir()
    (local / "a.txt").write_text("a")
    item = Shipment("input 'data'", local, str(remote), marker=str(remote.parent / "abc.json"))
    digest = item.digest()
    _receive(item, digest)
    assert json.loads((remote.parent / "abc.json").read_text()) == {"digest": digest}
    (local / "a.txt").write_text("changed")
    assert item.digest() != digest
    code = Shipment("the code", local, str(tmp_path / "host" / "code"), replace=False)
    (tmp_path / "host" / "code").mkdir()
    (tmp_path / "host" / "code" / "kept").write_text("k")
    _receive(code)
    assert sorted(p.name for p in (tmp_path / "host" / "code").iterdir()) == ["a.txt", "kept"]


def test_remote_paths_with_a_tilde_expand_on_the_host(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    local = tmp_path / "local"
    local.mkdir()
    (local / "f").write_text("x")
    _receive(Shipment("the state directory", local, "~/remote home/state/it's"))
    assert (Path(tmp_path) / "remote home" / "state" / "it's" / "f").read_text() == "x"


def test_hosts_sharing_their_home_may_push_the_same_directory_at_once(tmp_path):
    local, remote = tmp_path / "local", tmp_path / "shared-home" / "state" / "run"
    local.mkdir()
    (local / "checkpoint.pt").write_bytes(b"x" * 100_000)
    item = Shipment("the state directory", local, str(remote))
    for _ in range(5):
        tars = [subprocess.Popen(["tar", "-cf", "-", "-C", str(local), "."], stdout=subprocess.PIPE) for _ in range(4)]
        shells = [subprocess.Popen(["sh", "-c", item.command(None, True)], stdin=tar.stdout) for tar in tars]
        assert [sh.wait() for sh in shells] == [0, 0, 0, 0]
        for tar in tars:
            tar.wait()
        assert [p.name for p in remote.iterdir()] == ["checkpoint.pt"]
        assert sorted(p.name for p in remote.parent.iterdir()) == ["run"]
