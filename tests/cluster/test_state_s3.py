"""The state directory on object storage, against a real S3-compatible server."""

from __future__ import annotations

import json
import shutil

import pytest

from phalanx.storage.state import MANIFEST, StateSync, StateSyncError
from tests.conftest import EXAMPLES, phalanx

pytestmark = pytest.mark.cluster


def test_job_state_survives_on_s3_across_machines(phx_home, s3_env):
    uri = f"s3://{s3_env}/runs/resnet"
    args = ["--epochs", "1", "--steps-per-epoch", "6", "--checkpoint-every", "3"]
    phalanx("run", "--name", "resnet", "--state", uri, str(EXAMPLES / "train_ddp.py"), *args, check=True)
    status = json.loads(phalanx("status", "resnet", "--json", check=True).stdout)
    assert status["state_synced_at"] is not None
    assert "last upload:" in phalanx("status", "resnet", check=True).stdout
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    manifest = json.loads(fs.cat(f"{s3_env}/runs/resnet/{MANIFEST}"))
    assert fs.exists(f"{s3_env}/runs/resnet/{manifest['files']['checkpoint.pt']['key']}")
    # A new machine: no local state at all. The job restores it from S3 before starting.
    shutil.rmtree(phx_home)
    out = phalanx("run", "--name", "resnet", "--state", uri, str(EXAMPLES / "train_ddp.py"), "--epochs", "2",
                  "--steps-per-epoch", "6", "--checkpoint-every", "3", check=True)
    assert "resumed from step=6" in out.stdout
    assert "restored 1 file(s) of state" in out.stderr


def test_interrupted_upload_leaves_previous_state_complete(tmp_path, s3_env, monkeypatch):
    local = tmp_path / "state"
    local.mkdir()
    (local / "a.bin").write_bytes(b"A" * 1000)
    (local / "b.bin").write_bytes(b"B" * 1000)
    uri = f"s3://{s3_env}/interrupted"
    first = StateSync(local, uri)
    assert first.push() == 2
    # new versions of both files; the upload dies after the first object
    (local / "a.bin").write_bytes(b"a" * 2000)
    (local / "b.bin").write_bytes(b"b" * 2000)
    real_put = first.fs.put_file
    calls = []

    def dying_put(src, dst, **kw):
        calls.append(dst)
        if len(calls) > 1:
            raise ConnectionResetError("connection lost mid-upload")
        return real_put(src, dst, **kw)

    monkeypatch.setattr(first.fs, "put_file", dying_put)
    with pytest.raises(StateSyncError, match="previous upload is still complete"):
        first.push()
    # Another machine restores: the old manifest still describes complete files.
    other = tmp_path / "other"
    restored = StateSync(other, uri)
    restored.fs.invalidate_cache()
    assert restored.pull() == 2
    manifest = json.loads(restored.fs.cat(f"{s3_env}/interrupted/{MANIFEST}"))
    for name, meta in manifest["files"].items():
        assert (other / name).stat().st_size == meta["size"] == 1000
    assert (other / "a.bin").read_bytes() == b"A" * 1000
    assert not list(other.rglob("*.part"))


def test_bad_state_uri_is_rejected_before_start(phx_home):
    proc = phalanx("run", "--state", "ftpx://bucket/x", str(EXAMPLES / "hello.py"))
    assert proc.returncode == 2 and "unknown scheme 'ftpx'" in proc.stderr
    assert json.loads(phalanx("ps", "--all", "--json").stdout) == []


def test_missing_bucket_fails_with_clear_error(phx_home, s3_env):
    proc = phalanx("run", "--state", "s3://no-such-bucket-phx/x", str(EXAMPLES / "hello.py"))
    assert proc.returncode == 1
    assert "bucket 'no-such-bucket-phx' of 's3://no-such-bucket-phx/x' does not exist; create it, or fix --state" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert json.loads(phalanx("ps", "--all", "--json").stdout) == []
