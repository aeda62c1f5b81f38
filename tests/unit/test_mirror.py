"""The ssh node's file mirror (phalanx.launch.remote): Mirror/TreeMirror frames into a Receiver, no ssh."""

from __future__ import annotations

import base64
import io
import json
import os
from pathlib import Path

import pytest

from phalanx.launch import remote
from phalanx.launch.remote import Mirror, Receiver


class Link:
    """The remote end's stdout, read by the supervisor's Receiver: frames go through as JSON lines."""

    def __init__(self, tmp_path: Path, trees: dict[str, Path], locals_: dict[str, Path]) -> None:
        self.remote_attempt = tmp_path / "remote" / "attempt_0"
        self.local_attempt = tmp_path / "local" / "attempt_0"
        self.out = io.StringIO()
        self.mirror = Mirror(self.remote_attempt, 0, self.out, trees)
        self.receiver = Receiver(self.local_attempt, locals_, tag="0")
        self.frames: list[dict] = []

    def scan(self, final: bool = False) -> list[dict]:
        self.mirror._trees_at = 0.0  # every scan looks at the trees (no waiting for TREE_INTERVAL)
        self.mirror.scan(final=final)
        return self.deliver()

    def deliver(self) -> list[dict]:
        frames = [json.loads(line) for line in self.out.getvalue().splitlines()]
        self.out.seek(0)
        self.out.truncate()
        for frame in frames:
            self.receiver.apply(frame)
        self.frames += frames
        return frames


@pytest.fixture
def trees(tmp_path):
    """A host's state dir (with a file pushed there before the start) and the supervisor's copy."""
    host, local = tmp_path / "host_state", tmp_path / "local_state"
    host.mkdir()
    local.mkdir()
    for root in (host, local):
        (root / "pushed.pt").write_bytes(b"baseline")
    return host, local


def _sent(frames: list[dict]) -> list[str]:
    return [f["f"] for f in frames if "n" in f]


def test_a_big_file_goes_in_bounded_chunks_then_replaces_the_old_one(tmp_path, trees, monkeypatch):
    monkeypatch.setattr(remote, "CHUNK", 1000)
    host, local = trees
    link = Link(tmp_path, {"state": host}, {"state": local})
    data = os.urandom(4500)
    (host / "sub").mkdir()
    (host / "sub" / "ckpt.pt").write_bytes(data)
    assert link.scan() == []  # new: not stable yet
    frames = link.scan()
    chunks = [f for f in frames if "d" in f]
    assert [f["o"] for f in chunks] == [0, 1000, 2000, 3000, 4000]
    assert all(len(base64.b64decode(f["d"])) <= 1000 for f in chunks)
    assert frames[-1] == {"r": "state", "f": "sub/ckpt.pt", "n": 4500, "m": (host / "sub" / "ckpt.pt").stat().st_mtime_ns}
    assert (local / "sub" / "ckpt.pt").read_bytes() == data
    assert (local / "sub" / "ckpt.pt").stat().st_mtime_ns == (host / "sub" / "ckpt.pt").stat().st_mtime_ns
    assert sorted(p.name for p in (local / "sub").iterdir()) == ["ckpt.pt"]  # no temp file left
    assert link.scan() == [] and link.scan(final=True) == []  # sent once


def test_files_present_at_start_are_the_baseline_and_not_sent(tmp_path, trees):
    host, local = trees
    link = Link(tmp_path, {"state": host}, {"state": local})
    assert link.scan() == [] and link.scan() == [] and link.scan(final=True) == []
    (host / "pushed.pt").write_bytes(b"changed by a rank")
    link.scan()
    link.scan()
    assert (local / "pushed.pt").read_bytes() == b"changed by a rank"


def test_a_file_is_sent_only_once_stable_or_at_the_final_scan(tmp_path, trees):
    host, local = trees
    link = Link(tmp_path, {"output": host}, {"output": local})
    path = host / "log.bin"
    for i in range(3):  # changes at every scan: never stable
        path.write_bytes(b"x" * (i + 1))
        assert _sent(link.scan()) == []
    path.write_bytes(b"last")
    assert _sent(link.scan(final=True)) == ["log.bin"]  # the node is done: sent as it is
    assert (local / "log.bin").read_bytes() == b"last"


def test_temporary_names_are_never_sent(tmp_path, trees):
    host, local = trees
    link = Link(tmp_path, {"state": host}, {"state": local})
    (host / "ckpt.pt.tmp.123").write_bytes(b"half")
    (host / ".hidden").write_bytes(b"h")
    (host / ".partial").mkdir()
    (host / ".partial" / "a").write_bytes(b"a")
    link.scan()
    assert link.scan(final=True) == []


def test_a_removed_file_is_removed_locally(tmp_path, trees):
    host, local = trees
    link = Link(tmp_path, {"state": host}, {"state": local})
    (host / "pushed.pt").unlink()
    assert link.scan() == [{"r": "state", "f": "pushed.pt", "x": 1}]
    assert not (local / "pushed.pt").exists()
    (host / "new.pt").write_bytes(b"n")
    link.scan()
    link.scan()
    (host / "new.pt").unlink()
    link.scan()
    assert sorted(os.listdir(local)) == []


def test_a_file_that_changes_while_read_is_dropped_and_sent_again(tmp_path, trees, monkeypatch):
    monkeypatch.setattr(remote, "CHUNK", 4)
    host, local = trees
    link = Link(tmp_path, {"state": host}, {"state": local})
    path = host / "pushed.pt"
    path.write_bytes(b"version two!")
    link.scan()
    sent = link.mirror.frame

    def write_meanwhile(frame):  # a rank rewrites the file in place while it is being sent
        if frame.get("o") == 4:
            with open(path, "r+b") as fh:
                fh.write(b"VERSION")
            os.utime(path, ns=(1, 1))
        return sent(frame)

    link.mirror.trees[0].send = write_meanwhile
    frames = link.scan()
    assert frames[-1] == {"r": "state", "f": "pushed.pt", "abort": 1}
    assert (local / "pushed.pt").read_bytes() == b"baseline"  # the good old one stays
    assert [p.name for p in local.iterdir()] == ["pushed.pt"]
    link.mirror.trees[0].send = sent
    link.scan()
    assert _sent(link.scan()) == ["pushed.pt"]
    assert (local / "pushed.pt").read_bytes() == b"VERSION two!"


def test_a_file_cut_off_mid_way_never_replaces_the_good_one(tmp_path, trees):
    host, local = trees
    receiver = Receiver(tmp_path / "attempt_0", {"state": local}, tag="1")
    receiver.apply({"r": "state", "f": "pushed.pt", "o": 0, "d": base64.b64encode(b"new but").decode()})
    assert (local / ".pushed.pt.1.part").exists()
    receiver.apply({"r": "state", "f": "pushed.pt", "o": 99, "d": base64.b64encode(b"gap").decode()})  # out of order
    receiver.apply({"r": "state", "f": "pushed.pt", "n": 10, "m": 1})
    assert (local / "pushed.pt").read_bytes() == b"baseline"
    receiver.apply({"r": "state", "f": "pushed.pt", "o": 0, "d": base64.b64encode(b"new but").decode()})
    receiver.close()  # the link broke
    assert (local / "pushed.pt").read_bytes() == b"baseline"
    assert [p.name for p in local.iterdir()] == ["pushed.pt"]


def test_nodes_sending_the_same_path_at_once_do_not_mix(tmp_path, trees):
    _, local = trees
    a = Receiver(tmp_path / "attempt_0", {"state": local}, tag="0")
    b = Receiver(tmp_path / "attempt_0", {"state": local}, tag="1")
    for receiver, text in ((a, b"from node 0"), (b, b"from node 1")):
        receiver.apply({"r": "state", "f": "c.pt", "o": 0, "d": base64.b64encode(text[:4]).decode()})
    for receiver, text in ((a, b"from node 0"), (b, b"from node 1")):
        receiver.apply({"r": "state", "f": "c.pt", "o": 4, "d": base64.b64encode(text[4:]).decode()})
        receiver.apply({"r": "state", "f": "c.pt", "n": len(text), "m": 5})
    assert (local / "c.pt").read_bytes() == b"from node 1"  # last writer wins, whole


def test_paths_leaving_their_directory_are_refused(tmp_path, trees):
    _, local = trees
    outside = tmp_path / "outside"
    outside.mkdir()
    (local / "link").symlink_to(outside)
    (outside / "victim").write_bytes(b"keep")
    receiver = Receiver(tmp_path / "attempt_0", {"state": local})
    data = base64.b64encode(b"evil").decode()
    for rel in ("../outside/evil", str(outside / "evil"), "link/evil", "", "."):
        receiver.apply({"r": "state", "f": rel, "o": 0, "d": data})
        receiver.apply({"r": "state", "f": rel, "n": 4, "m": 1})
        receiver.apply({"r": "state", "f": rel, "w": data})
    receiver.apply({"r": "state", "f": "link/victim", "x": 1})
    receiver.apply({"r": "state", "f": "../outside/victim", "x": 1})
    receiver.apply({"f": "../../outside/evil", "w": data})  # an attempt file
    receiver.apply({"r": "nosuchtree", "f": "evil", "o": 0, "d": data})
    receiver.close()
    assert sorted(os.listdir(outside)) == ["victim"] and (outside / "victim").read_bytes() == b"keep"
    assert not (tmp_path / "nosuchtree").exists()


def test_an_empty_file_arrives(tmp_path, trees):
    host, local = trees
    link = Link(tmp_path, {"state": host}, {"state": local})
    (host / "empty").write_bytes(b"")
    link.scan()
    assert _sent(link.scan()) == ["empty"]
    assert (local / "empty").read_bytes() == b""


def test_attempt_files_still_mirror_and_the_link_going_away_stops_the_frames(tmp_path, trees):
    host, local = trees
    link = Link(tmp_path, {"state": host}, {"state": local})
    node = link.remote_attempt / "node_0"
    node.mkdir(parents=True)
    (node / "agent.log").write_text("one\n")
    (node / "result.json").write_text('{"exitcode": 0}')
    link.scan()
    with open(node / "agent.log", "a") as fh:
        fh.write("two\n")
    link.scan()
    assert (link.local_attempt / "node_0" / "agent.log").read_text() == "one\ntwo\n"
    assert json.loads((link.local_attempt / "node_0" / "result.json").read_text()) == {"exitcode": 0}

    class Gone:
        def write(self, text):
            raise BrokenPipeError

        def flush(self):
            pass

    link.mirror.out = Gone()
    (host / "more").write_bytes(b"m")
    link.scan()
    link.scan(final=True)  # no exception: the remote end goes on to stop its agent
    assert link.mirror.closed and link.mirror.frame({"exit": 0}) is False


def test_a_flood_of_log_output_goes_in_bounded_frames(tmp_path, trees, monkeypatch):
    monkeypatch.setattr(remote, "CHUNK", 1000)
    link = Link(tmp_path, {}, {})
    node = link.remote_attempt / "node_0"
    node.mkdir(parents=True)
    text = "".join(f"line {i}\n" for i in range(400))
    (node / "agent.log").write_text(text)
    frames = link.scan()
    assert [f["o"] for f in frames] == list(range(0, len(text), 1000))
    assert (link.local_attempt / "node_0" / "agent.log").read_text() == text
