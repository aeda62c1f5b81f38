"""How a failed attempt is shown (``api/failure.py``, ``monitor/tail.RankTailer``): the rank that
failed first first, the ranks that only lost their peer folded, and nothing else folded. Job
directories written by hand as the bootstrap writes them; the real 2-rank gloo job is in
tests/local/test_run.py and tests/web/test_browser.py."""

from __future__ import annotations

import json
from pathlib import Path

from phalanx.api.failure import PEER_LOST, failure
from phalanx.core.paths import JobPaths
from phalanx.core.state import JobState
from phalanx.monitor.tail import RankTailer
from phalanx.store import JobRecord

GLOO = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:23936. This is typically caused by a remote worker crashing. Check the logs of the remote worker.")
NCCL_ABORT = (
    "[rank0]:[E1127 11:02:03.000 ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] Process group watchdog thread terminated "
    "with exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5\n"
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
    "terminate called after throwing an instance of 'c10::DistBackendError'\n"
)


def _trace(kind: str, message: str) -> str:
    return ("Traceback (most recent call last):\n  File \"/work/train.py\", line 9, in <module>\n"
            "    dist.all_reduce(flag)\n    ~~~~~~~~~~~~~~~^^^^^^\n" f"{kind}: {message}\n")


def _job(tmp_path: Path, ranks: dict[int, tuple[str, dict | None]], cause_rank: int = 1, t0: float = 1000.0,
         state: JobState = JobState.FAILED) -> JobRecord:
    """A failed 1-node job: per rank its log and its exception record (type, message, timestamp)."""
    paths = JobPaths(tmp_path / "job")
    for rank, (log, error) in ranks.items():
        paths.rank_log(0, rank).parent.mkdir(parents=True, exist_ok=True)
        paths.rank_log(0, rank).write_text(log)
        if error is not None:
            paths.rank_error(0, rank).write_text(json.dumps({
                "rank": rank, "node_rank": 0, "exitcode": 1, "traceback": _trace(error["type"], error["message"]),
                **error}))
    cause = {"rank": cause_rank, "node_rank": 0, "exitcode": 1, "timestamp": t0, "type": "KeyError",
             "message": "'batch_size'"}
    return JobRecord("abcd1234", "broken", state, "local", 1, len(ranks), "train.py", str(paths.root), "{}", t0 - 10,
                     t0 - 9, t0 + 1, 1, 0, None, None, json.dumps(cause))


def test_a_peer_that_lost_its_connection_after_the_cause_is_folded_from_its_traceback(tmp_path):
    before = "step=1 loss=2.0\nstep=2 loss=1.5\n"
    record = _job(tmp_path, {
        0: (before + _trace("RuntimeError", GLOO), {"type": "RuntimeError", "message": GLOO, "timestamp": 1000.4}),
        1: ("step=1 loss=2.1\n" + _trace("KeyError", "'batch_size'"),
            {"type": "KeyError", "message": "'batch_size'", "timestamp": 1000.0}),
    })
    failed = failure(record)
    assert failed is not None and failed.rank == 1 and failed.order([0, 1]) == [1, 0]
    (lost,) = failed.peer_lost
    assert (lost.rank, lost.after, lost.fold_at, lost.folded_lines) == (0, 1, len(before), 5)
    assert lost.error == "RuntimeError: Connection closed by peer [127.0.0.1]:23936"
    assert failed.headline() == ("rank 1 failed first (KeyError: 'batch_size'): its log comes first; "
                                 "rank 0 lost its peer after it (folded)")
    tailer = RankTailer(record.paths, 0, order=failed.order([0, 1]), folds=failed.folds())
    lines = [tailer.format(r, line) for r, line in tailer.poll(final=True)]
    assert lines[0] == "[1] step=1 loss=2.1" and lines[5] == "[1] KeyError: 'batch_size'"
    assert lines[6:] == ["[0] step=1 loss=2.0", "[0] step=2 loss=1.5",
                         "[0] rank 0: lost its peer after rank 1 failed (RuntimeError: Connection closed by peer "
                         "[127.0.0.1]:23936; 5 lines folded, --rank 0 shows them)"]
    # From --tail's offset past the fold: only the fold's line.
    tailer = RankTailer(record.paths, 0, ranks={0}, offsets={0: len(before) + 10}, folds=failed.folds())
    assert [line for _, line in tailer.poll(final=True)] == [failed.folds()[0][1]]


def test_a_rank_that_aborted_in_nccl_without_a_record_is_folded_from_its_first_nccl_line(tmp_path):
    before = "step=1 loss=2.0\n"
    record = _job(tmp_path, {
        0: (before + NCCL_ABORT, None),
        1: (_trace("KeyError", "'batch_size'"), {"type": "KeyError", "message": "'batch_size'", "timestamp": 1000.0}),
    })
    (lost,) = failure(record).peer_lost
    assert lost.fold_at == len(before) and lost.folded_lines == 3 and "DistBackendError" in lost.error


def test_other_failures_stay_in_view(tmp_path):
    # Rank 0 raised its own error after the cause (not a communication error); rank 2 lost its
    # connection *before* rank 1 failed (so not because of it); rank 3 ended quietly.
    record = _job(tmp_path, {
        0: (_trace("ValueError", "bad shape"), {"type": "ValueError", "message": "bad shape", "timestamp": 1000.5}),
        1: (_trace("KeyError", "'batch_size'"), {"type": "KeyError", "message": "'batch_size'", "timestamp": 1000.0}),
        2: (_trace("RuntimeError", GLOO), {"type": "RuntimeError", "message": GLOO, "timestamp": 999.0}),
        3: ("step=1 loss=2.0\n", None),
    })
    failed = failure(record)
    assert failed is not None and failed.peer_lost == () and failed.folds() == {}
    assert failed.headline() == "rank 1 failed first (KeyError: 'batch_size'): its log comes first"
    assert failure(_job(tmp_path / "ok", {0: ("", None), 1: ("", None)}, state=JobState.SUCCEEDED)) is None


def test_communication_errors_are_recognised():
    for text in (GLOO, "DistBackendError: NCCL communicator was aborted on rank 0",
                 "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting",
                 "DistNetworkError: Connection reset by peer", "RuntimeError: Socket Timeout",
                 "torch.distributed.DistStoreError: Failed to recv, got 0 bytes", "BrokenPipeError: [Errno 32] Broken pipe"):
        assert PEER_LOST.search(text), text
    for text in ("KeyError: 'batch_size'", "ValueError: expected 3 channels", "CUDA out of memory",
                 "RuntimeError: mat1 and mat2 shapes cannot be multiplied"):
        assert not PEER_LOST.search(text), text


def test_a_parameters_scale_follows_its_search_space():
    from phalanx.sweeps.space import parse_space

    space = parse_space(["--lr", "loguniform(1e-4, 1e-1)", "--wd", "loguniform(1e-5, 1e-2, 4)", "--bs", "[16, 32]",
                         "--drop", "uniform(0, 0.5)", "--layers", "range(2, 6)", "--opt", "choice(adam, sgd)"])
    assert {p.name: p.scale for p in space.params} == {"lr": "log", "wd": "log", "bs": "categorical", "drop": "linear",
                                                        "layers": "linear", "opt": "categorical"}
