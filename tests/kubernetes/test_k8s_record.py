"""The job record of ``--in-cluster`` jobs (``record.py``): what the supervisor pod writes to the
object store and every other machine unpacks into its home."""

from __future__ import annotations

import io
import json
import tarfile

from phalanx.backends.kubernetes import record as rec


def _home(root, job_id="3f2a9c1d"):
    job = root / "jobs" / job_id
    (job / "attempt_0" / "rank_0").mkdir(parents=True)
    (job / "attempt_0" / "rank_0" / "output.log").write_text("step=1 loss=0.5\n")
    (job / "spec.json").write_text("{}")
    (job / "code").mkdir()
    (job / "code" / "train.py").write_text("print('hi')\n")
    (job / "code" / "data").symlink_to("/etc")
    (root / "state" / "train").mkdir(parents=True)
    (root / "state" / "train" / "checkpoint.pt").write_bytes(b"\0" * 100)
    return root


def test_k8s_record_round_trip_without_the_code_keeping_local_files(tmp_path):
    data = rec.pack(_home(tmp_path / "pod"), "3f2a9c1d", {"id": "3f2a9c1d", "state": "RUNNING"}, "train")
    names = tarfile.open(fileobj=io.BytesIO(data)).getnames()
    assert "jobs/3f2a9c1d/attempt_0/rank_0/output.log" in names and "state/train/checkpoint.pt" in names
    assert not [n for n in names if "/code/" in n], "the bundle carries the code"
    other = tmp_path / "other"
    job = other / "jobs" / "3f2a9c1d"
    (job / "code").mkdir(parents=True)
    (job / "k8s-supervisor.json").write_text("{}")
    (job / "stale.txt").write_text("from an older record")
    row = rec.unpack(data, other, "3f2a9c1d", keep=("k8s-supervisor.json",))
    assert row == {"id": "3f2a9c1d", "state": "RUNNING"}
    assert (job / "attempt_0" / "rank_0" / "output.log").read_text() == "step=1 loss=0.5\n"
    assert (other / "state" / "train" / "checkpoint.pt").stat().st_size == 100
    assert (job / "k8s-supervisor.json").exists() and (job / "code").is_dir()
    assert not (job / "stale.txt").exists(), "the record replaces the job directory"


def test_k8s_record_unpack_writes_nothing_outside_the_job(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in (("row.json", json.dumps({"id": "3f2a9c1d"})), ("jobs/3f2a9c1d/../../evil", "x"),
                           ("jobs/other/spec.json", "x"), ("jobs/3f2a9c1d/ok.txt", "ok")):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text.encode()))
    rec.unpack(buf.getvalue(), tmp_path / "home", "3f2a9c1d")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "home/jobs/3f2a9c1d/ok.txt"]


def test_k8s_record_state_archive_is_none_when_empty(tmp_path):
    assert rec.pack_dir(tmp_path / "missing") is None
    (tmp_path / "s").mkdir()
    assert rec.pack_dir(tmp_path / "s") is None
    (tmp_path / "s" / "ckpt").write_text("1")
    assert tarfile.open(fileobj=io.BytesIO(rec.pack_dir(tmp_path / "s"))).getnames() == ["ckpt"]
