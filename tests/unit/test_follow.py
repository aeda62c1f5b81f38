"""Following output by events: lines come promptly and in order, a quiet job costs no reads,
and where events cannot be trusted the followers poll as before."""

from __future__ import annotations

import io
import threading
import time

import pytest

from phalanx.core.paths import JobPaths
from phalanx.monitor import tail, filewatch as watch
from phalanx.monitor.tail import RankTailer, Stop, follow_attempts, follow_job
from phalanx.monitor.filewatch import Watch, local_filesystem

pytestmark = pytest.mark.skipif(watch._LIBC is None, reason="inotify is Linux only (elsewhere the followers poll)")


class Out(io.StringIO):
    def text(self) -> str:
        return self.getvalue()


def until(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def write(paths: JobPaths, rank: int, text: str, attempt: int = 0) -> None:
    log = paths.rank_log(attempt, rank)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as fh:
        fh.write(text)


@pytest.fixture
def paths(tmp_path) -> JobPaths:
    paths = JobPaths(tmp_path / "job")
    paths.attempt(0).mkdir(parents=True)
    return paths


@pytest.fixture
def polls(monkeypatch) -> list[float]:
    """When the followers read the logs."""
    seen: list[float] = []
    original = RankTailer.poll_live  # what the foreground follower reads with

    def counted(self):
        seen.append(time.monotonic())
        return original(self)

    monkeypatch.setattr(RankTailer, "poll_live", counted)
    return seen


@pytest.mark.parametrize("stop", [Stop, threading.Event], ids=["stop", "plain-event"])
def test_lines_come_as_written_in_order_and_a_quiet_job_is_not_read(paths, polls, stop):
    assert local_filesystem(paths.root), "the test directory is on a local filesystem: events are trusted"
    out, done = Out(), stop()
    follower = threading.Thread(target=follow_attempts, args=(paths, 0, None, True, out, done))
    follower.start()
    try:
        write(paths, 0, "a\n")
        until(lambda: "[0] a\n" in out.text(), "the first line")
        write(paths, 1, "b\n")  # a rank that appears later
        until(lambda: "[1] b\n" in out.text(), "a new rank's line")
        for i in range(50):
            write(paths, 0, f"x{i}\n")
        until(lambda: "[0] x49\n" in out.text(), "a burst")
        time.sleep(0.3)  # the burst's last events may still bring one (empty) read
        quiet_from = len(polls)
        time.sleep(1.0)  # nothing is written: nothing is read (a poller would have read 10 times)
        assert len(polls) - quiet_from <= 1, "a quiet job is not read"
        write(paths, 1, "partial")
    finally:
        done.set()
        follower.join(30)
    assert not follower.is_alive()
    lines = out.text().splitlines()
    assert [line for line in lines if line.startswith("[0] x")] == [f"[0] x{i}" for i in range(50)]
    assert lines[-1] == "[1] partial", "the end flushes a last line without a newline"


def test_a_new_attempt_is_followed(paths):
    out, done = Out(), Stop()
    follower = threading.Thread(target=follow_attempts, args=(paths, 0, {0}, False, out, done))
    follower.start()
    try:
        write(paths, 0, "first\n")
        write(paths, 1, "not followed\n")
        until(lambda: "first\n" in out.text(), "attempt 0")
        write(paths, 0, "second\n", attempt=1)
        until(lambda: "second\n" in out.text(), "attempt 1")
    finally:
        done.set()
        follower.join(30)
    assert out.text() == "first\nsecond\n"


def test_a_plain_event_and_an_untrusted_filesystem_fall_back_to_polling(paths, polls, monkeypatch):
    monkeypatch.setattr(watch, "local_filesystem", lambda path: False)  # say, NFS
    with Watch(fallback=0.05) as w:
        assert w.add(paths.root, lambda name, is_dir: True) and w.polling
        started = time.monotonic()
        assert w.wait(None) is True and time.monotonic() - started < 30
    out, done = Out(), threading.Event()
    follower = threading.Thread(target=follow_attempts, args=(paths, 0, None, False, out, done, 0.05))
    follower.start()
    try:
        write(paths, 0, "polled\n")
        until(lambda: "polled\n" in out.text(), "a polled line")
        until(lambda: len(polls) > 5, "polls although nothing changes")
    finally:
        done.set()
        follower.join(30)


def test_no_inotify_instance_left_means_polling(paths, monkeypatch):
    class NoInotify:
        def inotify_init1(self, flags):
            return -1  # EMFILE: the user's instances are used up

    monkeypatch.setattr(watch, "_LIBC", NoInotify())
    with Watch(fallback=0.05) as w:
        assert w.polling and w.add(paths.root, lambda name, is_dir: True)
        assert w.wait(10) is True  # returns after the fallback interval


def test_watch_wakes_on_its_names_only_and_on_wake(paths):
    with Watch() as w:
        w.add(paths.attempt(0), lambda name, is_dir: name == "output.log")
        (paths.attempt(0) / "metrics.bin").write_bytes(b"x")
        assert w.wait(0.3) is False, "a change nobody asked about does not wake"
        (paths.attempt(0) / "output.log").write_text("x")
        assert w.wait(30) is True
        threading.Timer(0.05, w.wake).start()
        assert w.wait(30) is True


def test_logs_follow_ends_with_the_job_and_checks_liveness(paths, monkeypatch):
    """``follow_job`` (phalanx logs -f): the store changing wakes it; with no change at all it
    still looks at the job every LIVENESS_S (a vanished supervisor changes nothing)."""
    monkeypatch.setattr(tail, "LIVENESS_S", 0.2)
    store = paths.root / "phalanx.db"
    store.write_text("")
    state = {"ended": False, "refreshes": 0}

    def refresh():
        state["refreshes"] += 1
        return 0, state["ended"]

    out: list[str] = []
    follower = threading.Thread(target=follow_job, args=(paths, 0, None, True, out.append, refresh, True, True, [store]))
    follower.start()
    write(paths, 0, "one\n")
    until(lambda: "[0] one\n" in "".join(out), "a line")
    until(lambda: state["refreshes"] > 3, "liveness checks")
    state["ended"] = True
    with open(str(store) + "-wal", "a") as fh:  # the supervisor records the end
        fh.write("x")
    follower.join(30)
    assert not follower.is_alive()


def test_a_reader_gone_ends_the_following_of_a_quiet_job(paths, monkeypatch):
    """``logs -f`` over a server: when its client goes away, ``emit`` raises at the next
    heartbeat (an empty write every LIVENESS_S) and the following ends, although the job runs on
    and prints nothing."""
    monkeypatch.setattr(tail, "LIVENESS_S", 0.2)
    gone = threading.Event()
    heard: list[str] = []

    class Gone(Exception):
        pass

    def emit(text: str) -> None:
        if gone.is_set():
            raise Gone()
        heard.append(text)

    ended: list[BaseException] = []

    def follow() -> None:
        try:
            follow_job(paths, 0, None, True, emit, lambda: (0, False), True, True)
        except Gone as exc:
            ended.append(exc)

    follower = threading.Thread(target=follow)
    follower.start()
    until(lambda: "" in heard, "a heartbeat")
    gone.set()
    follower.join(30)
    assert not follower.is_alive() and ended, "the following ended with the reader"
