"""Data in, results out, without a server: channel syntax, plans, snapshots, local transfers."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from phalanx.backends.base import Facts
from phalanx.backends.registry import get_backend
from phalanx.core.paths import HomePaths, JobPaths
from phalanx.core.spec import Channel, Entrypoint, EntrypointKind, JobSpec, code_root, in_snapshot, parse_channel
from phalanx.errors import UsageError
from phalanx.storage import channels, snapshot, transfer
from phalanx.storage.transfer import Item, TransferError
from phalanx.launch.host import HostFacts

FACTS = Facts(HostFacts(), ports=(29500,))  # plans are pure: what they know of the world is given


def _spec(**kw) -> JobSpec:
    return JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/src/proj/train.py", ("--x", "1")), name="train", workdir="/src/proj", **kw)


# -- channel syntax and the plan ----------------------------------------------------


def test_parse_channel():
    assert parse_channel("train=s3://b/imagenet/train") == Channel("train", "s3://b/imagenet/train")
    assert parse_channel("val=./data/val.tar.gz#extract") == Channel("val", "./data/val.tar.gz", extract=True)
    assert parse_channel("data=job:prep/state").uri == "job:prep/state"
    for bad, message in [("train", "use NAME=URI"), ("=s3://b", "invalid input name"), ("1x=/d", "invalid input name"),
                         ("d=s3://b/dir#extract", "not an archive")]:
        with pytest.raises(UsageError, match=message):
            parse_channel(bad)


def test_plan_exposes_channels_local_in_place_remote_in_cache():
    spec = _spec(channels=(Channel("train-a", "s3://b/t", "s3://b/t"), Channel("val", "./v", "/data/v"),
                           Channel("arc", "/data/a.zip", "/data/a.zip", extract=True)))
    home = HomePaths(Path("/h"))
    plan = get_backend("local").plan(spec, "j1", 0, home, FACTS)
    env = plan.nodes[0].env
    cache = home.channel_cache("s3://b/t").data
    assert str(cache).startswith("/h/cache/channels/") and cache == home.channel_path(spec.channels[0])
    assert env["PHALANX_CHANNEL_TRAIN_A"] == env["SM_CHANNEL_TRAIN_A"] == str(cache)
    assert env["PHALANX_CHANNEL_VAL"] == "/data/v"  # used in place
    assert env["PHALANX_CHANNEL_ARC"] == str(home.channel_cache("/data/a.zip", extract=True).data)
    assert json.loads(env["SM_CHANNELS"]) == ["arc", "train-a", "val"]


def test_unresolved_job_reference_cannot_be_planned():
    spec = _spec(channels=(Channel("d", "job:prep"),))
    with pytest.raises(UsageError, match="never resolved"):
        get_backend("local").plan(spec, "j1", 0, HomePaths(Path("/h")), FACTS)


def test_snapshot_freezes_the_code_but_keeps_the_users_cwd_and_names():
    spec = _spec(snapshot=True)
    frozen = in_snapshot(spec, "/h/jobs/j1/code")
    assert frozen.workdir == "/src/proj" and frozen.entrypoint == spec.entrypoint and frozen.code_dir == "/h/jobs/j1/code"
    plan = get_backend("local").plan(spec, "j1", 0, HomePaths(Path("/h")), FACTS)
    assert plan.nodes[0].cwd == "/src/proj"
    argv = plan.nodes[0].processes[0].argv
    assert argv[argv.index("--frozen"):] == ("--frozen", "/h/jobs/j1/code", "/src/proj", "--script", "/src/proj/train.py", "--x", "1")
    # a host that got a shipped copy runs in it
    shipped = in_snapshot(spec.with_(entrypoint=Entrypoint(EntrypointKind.SCRIPT, "/src/proj/sub/t.py", (), "./sub/t.py")),
                          "/r/jobs/j1/code", shipped=True)
    assert shipped.workdir == "/r/jobs/j1/code" and not shipped.code_dir
    assert (shipped.entrypoint.target, shipped.entrypoint.typed) == ("/r/jobs/j1/code/sub/t.py", "sub/t.py")
    # a script outside the working directory: its own directory is the code root
    outside = spec.with_(entrypoint=Entrypoint(EntrypointKind.SCRIPT, "/elsewhere/t.py"))
    assert code_root(outside) == "/elsewhere" and code_root(spec) == "/src/proj"


def test_spec_round_trips_with_data_fields():
    spec = _spec(channels=(Channel("t", "job:prep", "/h/jobs/x/output"),), output_uri="s3://b/o", skip_if_done=True, snapshot=True)
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_build_spec_resolves_inputs_and_checks_uris(tmp_path, monkeypatch, phx_home):
    from phalanx.jobfile import RunOptions, build_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    (tmp_path / "data").mkdir()
    spec = build_spec(RunOptions(words=["t.py"], inputs=["val=data", "train=s3://b/x", "f=file:///srv/d"], output="s3://b/runs/"))
    assert {c.name: c.source for c in spec.channels} == {"val": str(tmp_path / "data"), "train": "s3://b/x", "f": "/srv/d"}
    assert spec.output_uri == "s3://b/runs/" and spec.snapshot
    assert not build_spec(RunOptions(words=["t.py"], snapshot=False)).snapshot
    with pytest.raises(UsageError, match="unknown scheme 'ftpx'"):
        build_spec(RunOptions(words=["t.py"], inputs=["x=ftpx://b/x"]))
    with pytest.raises(UsageError, match="unknown scheme 'https'"):
        build_spec(RunOptions(words=["t.py"], output="https://example.com/x"))
    with pytest.raises(UsageError, match="clash"):
        build_spec(RunOptions(words=["t.py"], inputs=["a-b=data", "a_b=data"]))
    with pytest.raises(UsageError, match="no job with id or name 'nope'"):
        build_spec(RunOptions(words=["t.py"], inputs=["d=job:nope"]))
    missing = build_spec(RunOptions(words=["t.py"], inputs=["d=./missing"]))
    with pytest.raises(UsageError, match="does not exist; check the path given to --input d"):
        channels.check(missing)


# -- code snapshot ---------------------------------------------------------------------


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_snapshot_follows_gitignore_and_phalanxignore_and_stores_by_content(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "data").mkdir()
    (repo / ".venv" / "lib").mkdir(parents=True)
    (repo / "train.py").write_text("print('v1')\n")
    (repo / "pkg" / "model.py").write_text("x = 1\n")
    (repo / "pkg" / "notes.tmp").write_text("scratch\n")
    (repo / "data" / "big.bin").write_bytes(b"0" * 1000)
    (repo / ".venv" / "lib" / "site.py").write_text("")
    (repo / "untracked.py").write_text("")
    (repo / ".gitignore").write_text(".venv/\ndata/\n")
    (repo / ".phalanxignore").write_text("*.tmp\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "train.py", "pkg/model.py", ".gitignore")
    home = tmp_path / "home"
    listing = snapshot.list_workdir(repo, home)
    assert listing.mode == "git"
    assert sorted(listing.files) == [".gitignore", ".phalanxignore", "pkg/model.py", "train.py", "untracked.py"]
    dest = tmp_path / "code"
    snapshot.take(listing, dest, tmp_path / "code.json")
    (repo / "train.py").write_text("print('v2')\n")  # edits after submit do not reach the job
    assert (dest / "train.py").read_text() == "print('v1')\n"
    assert not (dest / "data").exists() and not (dest / ".venv").exists()  # the job reads those in place
    manifest = json.loads((tmp_path / "code.json").read_text())
    assert manifest["files"] == 5 and manifest["stored_bytes"] > 0
    # the same content again: hard links to the same stored objects, not a byte more
    again = snapshot.take(snapshot.list_workdir(repo, home), tmp_path / "code2", tmp_path / "code2.json")
    assert again["stored_bytes"] == len("print('v2')\n")  # only the edited file is new
    model1, model2 = (dest / "pkg" / "model.py").stat(), (tmp_path / "code2" / "pkg" / "model.py").stat()
    assert model1.st_ino == model2.st_ino and model1.st_nlink == 3  # the store's object and two jobs
    assert not os.access(dest / "pkg" / "model.py", os.W_OK) or os.geteuid() == 0


def test_snapshot_without_git_skips_heavy_dirs_gitignored_paths_and_the_home(tmp_path):
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "x.js").write_text("")
    (tmp_path / "phx" / "jobs").mkdir(parents=True)
    (tmp_path / "phx" / "jobs" / "f").write_text("")
    (tmp_path / "t.py").write_text("")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.pt").write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "keep.py").write_text("")
    (tmp_path / "sub" / "scratch.txt").write_text("")
    (tmp_path / ".gitignore").write_text("out/\n")
    (tmp_path / "sub" / ".gitignore").write_text("*.txt\n")
    listing = snapshot.list_workdir(tmp_path, tmp_path / "phx")
    assert listing.mode == "walk" and sorted(listing.files) == [".gitignore", "sub/.gitignore", "sub/keep.py", "t.py"]
    dest = tmp_path / "phx" / "jobs" / "j" / "code"
    snapshot.take(listing, dest, tmp_path / "phx" / "code.json")
    assert not (dest / "phx").exists() and not (dest / "node_modules").exists()


def test_large_files_that_are_not_python_are_left_out_unless_named(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.npy").write_bytes(b"0" * (snapshot.LARGE_FILE + 1))
    (tmp_path / "data" / "labels.csv").write_bytes(b"0" * 100)
    (tmp_path / "generated.py").write_bytes(b"#" * (snapshot.LARGE_FILE + 1))
    listing = snapshot.list_workdir(tmp_path, tmp_path / "phx")
    assert sorted(listing.files) == ["data/labels.csv", "generated.py", "train.py"]
    assert listing.skipped == [("data/train.npy", snapshot.LARGE_FILE + 1)]
    line = listing.skipped_line()
    assert "data/train.npy (1.0 MB)" in line and "'!data/train.npy' to .phalanxignore" in line
    (tmp_path / ".phalanxignore").write_text("!data/train.npy\n")
    assert "data/train.npy" in snapshot.list_workdir(tmp_path, tmp_path / "phx").files


def test_ignore_rules():
    rules = snapshot.IgnoreRules(["# comment", "*.ckpt", "/build", "logs/", "docs/*.pdf", "!keep.ckpt", "**/cache"])
    assert rules.excludes("a/b/model.ckpt") and not rules.excludes("keep.ckpt")
    assert rules.excludes("build/x.o") and not rules.excludes("src/build/x.o")
    assert rules.excludes("a/logs/run.txt") and not rules.excludes("logs")
    assert rules.excludes("docs/a.pdf") and not rules.excludes("docs/sub/a.py")
    assert rules.excludes("x/cache/y")


def test_too_big_workdir_is_refused_with_the_fix(tmp_path, monkeypatch, phx_home):
    from phalanx.jobfile import RunOptions, build_spec

    monkeypatch.setattr(snapshot, "MAX_FILES", 3)
    for i in range(5):
        (tmp_path / f"f{i}.py").write_text("")
    with pytest.raises(UsageError, match="too big for a code snapshot .more than 4 files") as err:
        build_spec(RunOptions(words=[str(tmp_path / "f0.py")], workdir=str(tmp_path)))
    assert ".phalanxignore" in err.value.hint and "--no-snapshot" in err.value.hint
    assert not build_spec(RunOptions(words=[str(tmp_path / "f0.py")], workdir=str(tmp_path), snapshot=False)).snapshot


# -- transfers: atomic, retried ---------------------------------------------------------


def test_interrupted_download_is_retried_and_never_leaves_a_part(tmp_path, monkeypatch):
    fs, _ = transfer.filesystem(str(tmp_path))
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(100_000))
    dst = tmp_path / "out" / "dst.bin"
    dst.parent.mkdir()
    dst.write_bytes(b"old complete file")
    real = fs.get_file
    calls = []

    def flaky(rpath, lpath, **kw):
        calls.append(lpath)
        if len(calls) == 1:
            Path(lpath).write_bytes(src.read_bytes()[:5000])  # half a file, then the connection drops
            raise ConnectionResetError("connection lost")
        return real(rpath, lpath, **kw)

    monkeypatch.setattr(transfer, "BACKOFF", 0.01)
    monkeypatch.setattr(fs, "get_file", flaky)
    transfer.download(fs, [Item(str(src), str(dst), 100_000)], tmp_path / "partial")
    assert dst.read_bytes() == src.read_bytes() and len(calls) == 2
    assert not (tmp_path / "partial").exists()

    def dead(rpath, lpath, **kw):
        Path(lpath).write_bytes(b"x")
        raise ConnectionResetError("connection lost")

    monkeypatch.setattr(fs, "get_file", dead)
    dst.write_bytes(b"previous")
    with pytest.raises(TransferError, match=r"failed after 4 attempt\(s\): connection lost"):
        transfer.download(fs, [Item(str(src), str(dst), 100_000)], tmp_path / "partial")
    assert dst.read_bytes() == b"previous" and not (tmp_path / "partial").exists()


def test_download_checks_size_and_digest(tmp_path, monkeypatch):
    monkeypatch.setattr(transfer, "BACKOFF", 0.0)
    fs, _ = transfer.filesystem(str(tmp_path))
    src = tmp_path / "a"
    src.write_bytes(b"abc")
    with pytest.raises(TransferError, match="arrived with 3 bytes, expected 4"):
        transfer.download(fs, [Item(str(src), str(tmp_path / "b"), 4)], tmp_path / "p")
    with pytest.raises(TransferError, match="different sha256"):
        transfer.download(fs, [Item(str(src), str(tmp_path / "b"), 3, "0" * 64)], tmp_path / "p")
    assert not (tmp_path / "b").exists()
    transfer.download(fs, [Item(str(src), str(tmp_path / "b"), 3, transfer.sha256_file(src))], tmp_path / "p")
    assert (tmp_path / "b").read_bytes() == b"abc"


def test_upload_to_a_local_path_is_atomic(tmp_path, monkeypatch):
    monkeypatch.setattr(transfer, "BACKOFF", 0.0)
    fs, root = transfer.filesystem(str(tmp_path / "remote"))
    src = tmp_path / "model.pt"
    src.write_bytes(b"weights" * 1000)
    transfer.upload(fs, [Item(str(src), f"{root}/run/model.pt", src.stat().st_size)])
    assert (tmp_path / "remote" / "run" / "model.pt").read_bytes() == src.read_bytes()
    assert not list((tmp_path / "remote").rglob("*.part"))


# -- archives ------------------------------------------------------------------------------


def _tar(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_local_archive_is_extracted_once_and_again_when_it_changes(tmp_path, phx_home):
    archive = tmp_path / "val.tar.gz"
    _tar(archive, {"val/a.txt": b"a", "val/b.txt": b"b"})
    home = HomePaths(phx_home)
    spec = _spec(channels=(Channel("val", str(archive), str(archive), extract=True),))
    said: list[str] = []
    channels.stage(home, spec, said.append)
    where = home.channel_path(spec.channels[0])
    assert (where / "val" / "a.txt").read_bytes() == b"a"
    channels.stage(home, spec, said.append)
    assert "unchanged since it was last extracted" in said[-1]
    _tar(archive, {"val/c.txt": b"c"})
    os.utime(archive, ns=(1, 1))
    channels.stage(home, spec, said.append)
    assert sorted(p.name for p in (where / "val").iterdir()) == ["c.txt"]
    assert not list(where.parent.glob("*.partial"))

    zipped = tmp_path / "z.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("../../escape.txt", "no")
        zf.writestr("ok.txt", "yes")
    zspec = _spec(channels=(Channel("z", str(zipped), str(zipped), extract=True),))
    channels.stage(home, zspec, said.append)
    zdir = home.channel_path(zspec.channels[0])
    assert (zdir / "ok.txt").read_text() == "yes" and (zdir / "escape.txt").exists()  # '..' dropped
    assert not (tmp_path / "escape.txt").exists()


def test_bad_archive_is_a_clear_error(tmp_path, phx_home):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball")
    spec = _spec(channels=(Channel("v", str(bad), str(bad), extract=True),))
    with pytest.raises(channels.ChannelError, match="input 'v': cannot extract bad.tar.gz"):
        channels.stage(HomePaths(phx_home), spec, lambda s: None)


# -- fingerprints ------------------------------------------------------------------------


def test_fingerprint_changes_with_code_args_and_data(tmp_path, phx_home):
    from phalanx.storage.inputs import fingerprint

    (tmp_path / "t.py").write_text("v1")
    data = tmp_path / "data"
    data.mkdir()
    (data / "x").write_text("1")
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(tmp_path / "t.py")), name="t", workdir=str(tmp_path),
                   channels=(Channel("d", "data", str(data)),))
    home = HomePaths(phx_home)
    first = fingerprint(spec, home)["digest"]
    assert fingerprint(spec, home)["digest"] == first
    assert fingerprint(spec.with_(entrypoint=Entrypoint(EntrypointKind.SCRIPT, str(tmp_path / "t.py"), ("--x",))), home)["digest"] != first
    (data / "x").write_text("22")
    second = fingerprint(spec, home)["digest"]
    assert second != first
    (tmp_path / "t.py").write_text("v2")
    assert fingerprint(spec, home)["digest"] != second


def test_job_paths_name_every_new_file(tmp_path):
    paths = JobPaths(tmp_path)
    assert {paths.code_dir.name, paths.code_manifest.name, paths.inputs.name, paths.artifacts.name} == {
        "code", "code.json", "inputs.json", "artifacts.json"}


def test_names_from_a_store_cannot_leave_the_target(tmp_path):
    assert transfer.local_path(tmp_path, "a/b.txt") == tmp_path / "a" / "b.txt"
    for bad in ("../x", "a/../../x", "/etc/passwd"):
        with pytest.raises(TransferError, match="leaves"):
            transfer.local_path(tmp_path, bad)


def test_a_snapshot_of_hard_links_bundles_as_plain_files(tmp_path):
    from phalanx.storage.bundle import build, code_files, unpack

    (tmp_path / "proj" / "pkg").mkdir(parents=True)
    (tmp_path / "proj" / "train.py").write_text("print('hi')\n")
    (tmp_path / "proj" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "proj" / "pkg" / "empty.py").write_text("")  # same content as __init__.py: one stored object
    dest = tmp_path / "home" / "jobs" / "j" / "code"
    snapshot.take(snapshot.list_workdir(tmp_path / "proj", tmp_path / "home"), dest, tmp_path / "code.json")
    assert sorted(rel for rel, _ in code_files(dest)) == ["pkg/__init__.py", "pkg/empty.py", "train.py"]
    bundle = build(code_files(dest), tmp_path / "b.tar.gz")
    unpack(bundle.path, tmp_path / "out")
    assert (tmp_path / "out" / "code" / "train.py").read_text() == "print('hi')\n"
    assert (tmp_path / "out" / "code" / "pkg" / "empty.py").read_text() == ""


@pytest.mark.parametrize("form", ["path", "file-url"])
def test_outputs_go_to_a_local_directory_named_by_path_or_file_url(tmp_path, phx_home, form):
    """`--output /dir` and `--output file:///dir` are the same destination (the URL once failed
    every job: its temporary names kept the scheme and os.replace could not find them)."""
    from tests.conftest import phalanx

    project = tmp_path / "proj"
    project.mkdir()
    (project / "w.py").write_text('import os\nopen(os.path.join(os.environ["PHALANX_OUTPUT_DIR"], "o.txt"), "w").write("x")\n')
    dest = tmp_path / "out"
    uri = dest.as_uri() if form == "file-url" else str(dest)
    proc = phalanx("run", "-q", "--output", uri, "w.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    (landed,) = dest.glob("w-*/output/o.txt")
    assert landed.read_text() == "x"
    assert not list(dest.rglob("*.part"))
    (manifest,) = dest.glob("w-*/_phalanx_artifacts.json")
    assert json.loads(manifest.read_text())["output"]["o.txt"]["size"] == 1
