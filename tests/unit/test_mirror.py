"""The ssh node's file mirror (phalanx.launch.frames): Mirror/TreeMirror frames into a Receiver, no ssh."""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from phalanx.backends import commands, ssh
from phalanx.errors import BackendError
from phalanx.launch import frames as link_frames
from phalanx.launch.frames import Mirror, Receiver


def parse(stream: bytes) -> list[tuple[dict, bytes]]:
    """The frames in a remote end's output, read independently of Receiver: (header, its bytes)."""
    frames = []
    while stream:
        line, _, stream = stream.partition(b"\n")
        header = json.loads(line)
        size = header.get("b", 0)
        frames.append((header, stream[:size]))
        stream = stream[size:]
    return frames


def frame(header: dict, data: bytes | None = None) -> bytes:
    """One frame as the remote end writes it."""
    if data is None:
        return json.dumps(header).encode() + b"\n"
    return json.dumps({**header, "b": len(data)}).encode() + b"\n" + data


class Link:
    """The remote end's stdout, read by the supervisor's Receiver: a header line per frame, raw bytes after it."""

    def __init__(self, tmp_path: Path, trees: dict[str, Path], locals_: dict[str, Path]) -> None:
        self.remote_attempt = tmp_path / "remote" / "attempt_0"
        self.local_attempt = tmp_path / "local" / "attempt_0"
        self.out = io.BytesIO()
        self.mirror = Mirror(self.remote_attempt, 0, self.out, trees)
        self.receiver = Receiver(self.local_attempt, locals_, tag="0")
        self.frames: list[dict] = []
        self.payloads: list[bytes] = []

    def node_files(self, log: bytes, result: str | None = '{"exitcode": 0}') -> Path:
        """This node's directory of the remote attempt, with its agent log (and result)."""
        node = self.remote_attempt / "node_0"
        node.mkdir(parents=True)
        (node / "agent.log").write_bytes(log)
        if result is not None:
            (node / "result.json").write_text(result)
        return node

    def scan(self, final: bool = False) -> list[dict]:
        self.mirror._trees_at = 0.0  # every scan looks at the trees (no waiting for TREE_INTERVAL)
        self.mirror.scan(final=final)
        return self.deliver()

    def written(self) -> bytes:
        """What the remote end wrote since the last delivery."""
        data = self.out.getvalue()
        self.out.seek(0)
        self.out.truncate()
        return data

    def deliver(self) -> list[dict]:
        data = self.written()
        frames = parse(data)
        assert self.receiver.receive(io.BytesIO(data)) is None  # no exit frame: the stream "ended" here
        self.frames += [h for h, _ in frames]
        self.payloads += [d for _, d in frames]
        return [h for h, _ in frames]


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
    monkeypatch.setattr(link_frames, "CHUNK", 1000)
    host, local = trees
    link = Link(tmp_path, {"state": host}, {"state": local})
    data = os.urandom(4500)
    (host / "sub").mkdir()
    (host / "sub" / "ckpt.pt").write_bytes(data)
    assert link.scan() == []  # new: not stable yet
    frames = link.scan()
    chunks = [f for f in frames if "b" in f]
    assert [f["o"] for f in chunks] == [0, 1000, 2000, 3000, 4000]
    assert [f["b"] for f in chunks] == [1000, 1000, 1000, 1000, 500]
    assert b"".join(link.payloads[-6:-1]) == data  # raw, not encoded
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
    monkeypatch.setattr(link_frames, "CHUNK", 4)
    host, local = trees
    link = Link(tmp_path, {"state": host}, {"state": local})
    path = host / "pushed.pt"
    path.write_bytes(b"version two!")
    link.scan()
    sent = link.mirror.frame

    def write_meanwhile(frame, data=None):  # a rank rewrites the file in place while it is being sent
        if frame.get("o") == 4:
            with open(path, "r+b") as fh:
                fh.write(b"VERSION")
            os.utime(path, ns=(1, 1))
        return sent(frame, data)

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
    receiver.apply({"r": "state", "f": "pushed.pt", "o": 0, "b": 7}, io.BytesIO(b"new but"))
    assert (local / ".pushed.pt.1.part").exists()
    receiver.apply({"r": "state", "f": "pushed.pt", "o": 99, "b": 3}, io.BytesIO(b"gap"))  # out of order
    receiver.apply({"r": "state", "f": "pushed.pt", "n": 10, "m": 1})
    assert (local / "pushed.pt").read_bytes() == b"baseline"
    receiver.apply({"r": "state", "f": "pushed.pt", "o": 0, "b": 7}, io.BytesIO(b"new but"))
    receiver.close()  # the link broke
    assert (local / "pushed.pt").read_bytes() == b"baseline"
    assert [p.name for p in local.iterdir()] == ["pushed.pt"]


def test_nodes_sending_the_same_path_at_once_do_not_mix(tmp_path, trees):
    _, local = trees
    a = Receiver(tmp_path / "attempt_0", {"state": local}, tag="0")
    b = Receiver(tmp_path / "attempt_0", {"state": local}, tag="1")
    for receiver, text in ((a, b"from node 0"), (b, b"from node 1")):
        receiver.apply({"r": "state", "f": "c.pt", "o": 0, "b": 4}, io.BytesIO(text[:4]))
    for receiver, text in ((a, b"from node 0"), (b, b"from node 1")):
        receiver.apply({"r": "state", "f": "c.pt", "o": 4, "b": len(text) - 4}, io.BytesIO(text[4:]))
        receiver.apply({"r": "state", "f": "c.pt", "n": len(text), "m": 5})
    assert (local / "c.pt").read_bytes() == b"from node 1"  # last writer wins, whole


def test_paths_leaving_their_directory_are_refused(tmp_path, trees):
    _, local = trees
    outside = tmp_path / "outside"
    outside.mkdir()
    (local / "link").symlink_to(outside)
    (outside / "victim").write_bytes(b"keep")
    receiver = Receiver(tmp_path / "attempt_0", {"state": local})
    stream = b""
    for rel in ("../outside/evil", str(outside / "evil"), "link/evil", "", "."):
        stream += frame({"r": "state", "f": rel, "o": 0}, b"evil")
        stream += frame({"r": "state", "f": rel, "n": 4, "m": 1})
        stream += frame({"f": rel, "o": 0}, b"evil")
        stream += frame({"f": rel, "w": 1}, b"evil")
    stream += frame({"r": "state", "f": "link/victim", "x": 1})
    stream += frame({"r": "state", "f": "../outside/victim", "x": 1})
    stream += frame({"f": "../../outside/evil", "w": 1}, b"evil")  # an attempt file
    stream += frame({"r": "nosuchtree", "f": "evil", "o": 0}, b"evil")
    # A refused frame's bytes are read past: the frames after it still arrive.
    stream += frame({"r": "state", "f": "good", "o": 0}, b"{\"exit\": 3}\n")  # bytes that look like a frame
    stream += frame({"r": "state", "f": "good", "n": 12, "m": 1})
    assert receiver.receive(io.BytesIO(stream)) is None
    assert sorted(os.listdir(outside)) == ["victim"] and (outside / "victim").read_bytes() == b"keep"
    assert not (tmp_path / "nosuchtree").exists()
    assert (local / "good").read_bytes() == b'{"exit": 3}\n'


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
    node = link.node_files(b"one\n")
    link.scan()
    with open(node / "agent.log", "a") as fh:
        fh.write("two\n")
    link.scan()
    assert (link.local_attempt / "node_0" / "agent.log").read_text() == "one\ntwo\n"
    assert json.loads((link.local_attempt / "node_0" / "result.json").read_text()) == {"exitcode": 0}

    class Gone:
        def write(self, data):
            raise BrokenPipeError

        def flush(self):
            pass

    link.mirror.out = Gone()
    (host / "more").write_bytes(b"m")
    link.scan()
    link.scan(final=True)  # no exception: the remote end goes on to stop its agent
    assert link.mirror.closed and link.mirror.frame({"exit": 0}) is False


def test_a_flood_of_log_output_goes_in_bounded_frames(tmp_path, trees, monkeypatch):
    monkeypatch.setattr(link_frames, "CHUNK", 1000)
    link = Link(tmp_path, {}, {})
    text = "".join(f"line {i}\n" for i in range(400))
    link.node_files(text.encode(), result=None)
    frames = link.scan()
    assert [f["o"] for f in frames] == list(range(0, len(text), 1000))
    assert (link.local_attempt / "node_0" / "agent.log").read_text() == text


class Trickle:
    """A stream that hands out at most a few bytes per read, as a pipe or socket may."""

    def __init__(self, data: bytes, most: int = 3) -> None:
        self.inner = io.BytesIO(data)
        self.most = most
        self.reads = 0

    def readline(self, limit: int = -1) -> bytes:
        return self.inner.readline(limit)

    def read(self, n: int = -1) -> bytes:
        self.reads += 1
        return self.inner.read(min(n, self.most))


def test_bytes_that_come_in_small_pieces_are_read_until_complete(tmp_path, trees, monkeypatch):
    monkeypatch.setattr(link_frames, "CHUNK", 1000)
    host, local = trees
    link = Link(tmp_path, {"state": host}, {"state": local})
    link.node_files(b"log\n" * 600)
    data = os.urandom(2500)
    (host / "ckpt.pt").write_bytes(data)
    link.mirror.scan(final=True)
    link.mirror.frame({"exit": 7})
    stream = Trickle(b"Welcome to gpu1!\n" + link.written(), most=3)  # a login banner first: skipped
    assert link.receiver.receive(stream) == 7
    assert stream.reads > 2500 // 3  # it did come in pieces
    assert (local / "ckpt.pt").read_bytes() == data
    assert (link.local_attempt / "node_0" / "agent.log").read_bytes() == b"log\n" * 600
    assert json.loads((link.local_attempt / "node_0" / "result.json").read_text()) == {"exitcode": 0}
    assert sorted(os.listdir(local)) == ["ckpt.pt", "pushed.pt"]


def test_frames_through_a_pipe_larger_than_its_buffer(tmp_path, trees):
    """A real pipe, read unbuffered: a frame's bytes (1 MiB) come in many short reads."""
    host, local = trees
    link = Link(tmp_path, {"state": host}, {"state": local})
    data = os.urandom(3 * link_frames.CHUNK // 2)
    (host / "ckpt.pt").write_bytes(data)
    r, w = os.pipe()
    with os.fdopen(r, "rb", buffering=0) as reader, os.fdopen(w, "wb") as writer:
        link.mirror.out = writer

        def send() -> None:
            link.mirror.scan(final=True)
            link.mirror.frame({"exit": 0})
            writer.close()

        sender = threading.Thread(target=send)
        sender.start()
        assert link.receiver.receive(reader) == 0
        sender.join()
    assert (local / "ckpt.pt").read_bytes() == data


def test_a_stream_cut_off_within_a_frame_s_bytes_leaves_no_partial_file(tmp_path, trees, monkeypatch):
    monkeypatch.setattr(link_frames, "CHUNK", 1000)
    host, local = trees
    link = Link(tmp_path, {"state": host}, {"state": local})
    link.node_files(b"a" * 1500)
    (host / "pushed.pt").write_bytes(b"N" * 2500)
    link.mirror.scan(final=True)
    link.mirror.frame({"exit": 0})
    stream = link.written()
    ends = []  # where each frame's bytes end in the stream, and its header
    at = 0
    for header, _ in parse(stream):
        at = stream.index(b"\n", at) + 1 + header.get("b", 0)
        ends.append((at, header))

    def cut_inside(match) -> bytes:
        """The stream up to half-way through the bytes of the first frame ``match`` accepts."""
        end, header = next((end, h) for end, h in ends if match(h))
        return stream[:end - header["b"] // 2]

    # Frames go in this order: the log's appends, the whole result.json, the tree file's chunks.
    cases = [  # where the stream is cut, then what the attempt directory holds
        (cut_inside(lambda h: h.get("f") == "node_0/agent.log" and h.get("o") == 1000), ["agent.log"], 1000),
        (cut_inside(lambda h: h.get("w") == 1), ["agent.log"], 1500),
        (cut_inside(lambda h: h.get("f") == "pushed.pt" and h.get("o") == 1000), ["agent.log", "result.json"], 1500),
    ]
    for cut, files, log in cases:
        shutil.rmtree(link.local_attempt, ignore_errors=True)
        receiver = Receiver(link.local_attempt, {"state": local}, tag="0")
        assert receiver.receive(io.BytesIO(cut)) is None  # no exit: the link was lost
        assert (local / "pushed.pt").read_bytes() == b"baseline"  # the good old one stays
        assert sorted(os.listdir(local)) == ["pushed.pt"]  # no temp file left
        assert sorted(os.listdir(link.local_attempt / "node_0")) == files
        assert (link.local_attempt / "node_0" / "agent.log").read_bytes() == b"a" * log  # whole appends only
    assert receiver.receive(io.BytesIO(stream)) == 0
    assert (local / "pushed.pt").read_bytes() == b"N" * 2500


def test_the_preflight_refuses_a_host_with_another_link_protocol(monkeypatch):
    """The two ends of a node's link must speak the same frames: a mixed pair would break silently."""
    ours = importlib.metadata.version("phalanx")
    reported = {"protocol": ssh.PROTOCOL}
    run = subprocess.run

    def fake_run(argv, env=None, timeout=60.0):  # the preflight script run here, as if on the host
        proc = run([sys.executable, "-c", ssh.PREFLIGHT, "0"], capture_output=True, text=True, check=True)
        info = json.loads(proc.stdout)
        assert info["phalanx"] and info["phalanx_version"] == ours and info["protocol"] == ssh.PROTOCOL
        info["protocol"] = reported["protocol"]
        return SimpleNamespace(returncode=0, stdout=json.dumps(info) + "\n", stderr="")

    monkeypatch.setattr(commands, "run", fake_run)
    node = SimpleNamespace(torchrun_argv=(), processes=(), agent_argv=(sys.executable,))
    plan = SimpleNamespace(nodes=[node])
    backend = ssh.SshBackend()
    backend.preflight({"ssh_config": None}, ["gpu1", "gpu2"], plan)  # same version: fine
    reported["protocol"] = 1
    with pytest.raises(BackendError) as err:
        backend.preflight({"ssh_config": None}, ["gpu1"], plan)
    assert f"gpu1: its phalanx {ours} speaks link protocol 1, this machine's {ours} speaks {ssh.PROTOCOL}" in str(err.value)
