"""Files shipped by content (storage/objects.py): manifests, uploads checked against their digest,
trees laid out again (copies for a working directory, links for data) and never outside."""

from __future__ import annotations

import hashlib
import os

import pytest

from phalanx.core.paths import HomePaths
from phalanx.errors import UsageError
from phalanx.storage import objects


def _store(home: HomePaths, data: bytes, executable: bool = False) -> str:
    sha = hashlib.sha256(data).hexdigest()
    with objects.Upload(home) as upload:
        upload.write(data[:3])
        upload.write(data[3:])
        assert upload.finish(sha, executable) == len(data)
    return sha


def test_an_upload_is_stored_once_and_only_with_the_bytes_of_its_digest(tmp_path):
    home = HomePaths(tmp_path / "home")
    sha = _store(home, b"print('hi')\n")
    stored = objects.object_path(home, sha, False)
    assert stored.read_bytes() == b"print('hi')\n" and stored.stat().st_mode & 0o777 == 0o444
    with objects.Upload(home) as again:
        again.write(b"print('hi')\n")
        assert again.finish(sha, False) == 0, "the store had it"
    with objects.Upload(home) as forged:
        forged.write(b"something else")
        with pytest.raises(UsageError, match="arrived with other bytes"):
            forged.finish(sha, True)
    assert not objects.object_path(home, sha, True).exists()
    assert not any((home.code_objects / ".incoming").iterdir()), "nothing left of the refused upload"
    assert objects.missing(home, [(sha, False), (sha, True)]) == [(sha, True)]
    with pytest.raises(UsageError, match="not a sha256"):
        objects.missing(home, [("../../etc/passwd", False)])


def test_a_tree_is_laid_out_as_copies_or_links_and_a_copy_can_be_written(tmp_path):
    home = HomePaths(tmp_path / "home")
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("A = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(src / "run.sh", 0o755)
    os.symlink("pkg/a.py", src / "alias.py")
    hashes = {rel: hashlib.sha256((src / rel).read_bytes()).hexdigest() for rel in ("pkg/a.py", "run.sh")}
    entries = objects.manifest(src, ["pkg/a.py", "run.sh", "alias.py"], hashes)
    wire = [e.to_wire() for e in entries]
    assert [objects.Entry.from_wire(w) for w in wire] == entries
    for e in entries:
        if e.link is None:
            _store(home, (src / e.path).read_bytes(), e.executable)
    copy = tmp_path / "copy"
    assert objects.lay_out(home, entries, copy, copy=True) == 2
    assert os.access(copy / "run.sh", os.X_OK) and os.readlink(copy / "alias.py") == "pkg/a.py"
    (copy / "pkg" / "a.py").write_text("changed\n")
    assert objects.object_path(home, hashes["pkg/a.py"], False).read_text() == "A = 1\n", "the object is untouched"
    linked = tmp_path / "linked"
    objects.lay_out(home, entries, linked, copy=False)
    assert (linked / "pkg" / "a.py").stat().st_ino == objects.object_path(home, hashes["pkg/a.py"], False).stat().st_ino
    assert objects.digest(entries) == objects.digest(list(reversed(entries)))


@pytest.mark.parametrize("path", ["../x.py", "/etc/x.py", "a/../../x.py", "", "a\0b"])
def test_a_manifest_path_outside_its_tree_is_refused(path):
    with pytest.raises(UsageError, match="not a path inside the tree"):
        objects.Entry.from_wire([path, "0" * 64, 0, 1])


def test_a_link_leading_out_of_the_tree_is_refused(tmp_path):
    home = HomePaths(tmp_path / "home")
    with pytest.raises(UsageError, match="leads out of the shipped tree"):
        objects.lay_out(home, [objects.Entry("evil", link="../../etc")], tmp_path / "t", copy=True)
    with pytest.raises(UsageError, match="lacks the content"):
        objects.lay_out(home, [objects.Entry("a.py", "1" * 64, False, 3)], tmp_path / "u", copy=True)
