"""Metric extraction from rank output: definitions, automatic pick-up, user JSON lines, read-back."""

from __future__ import annotations

import json
import time

import pytest

from phalanx.core.paths import JobPaths
from phalanx.core.spec import parse_metric
from phalanx.monitor.metrics import MetricsCollector, read_metrics, summarize
from phalanx.monitor.report import by_step, metrics_report, sparkline


@pytest.fixture
def paths(tmp_path) -> JobPaths:
    return JobPaths(tmp_path / "job")


def write(paths: JobPaths, rank: int, text: str | bytes, attempt: int = 0, user: bool = False) -> None:
    path = paths.rank_user_metrics(attempt, rank) if user else paths.rank_log(attempt, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:
        fh.write(text.encode() if isinstance(text, str) else text)


def values(paths: JobPaths, **where) -> list[tuple]:
    return [(r["name"], r["value"], r["step"], r["epoch"]) for r in read_metrics(paths, **where)]


def test_definitions_and_automatic_pick_up_with_step_and_epoch(paths):
    write(paths, 0, "epoch 1 step 123 loss=0.1234 acc=0.5\n"
                    "Epoch: [2][ 100/5000]\tLoss 1.2e+00 (1.3)\tAcc@1  75.3 ( 70.1)\n"
                    " * Acc@1 76.100 Acc@5 92.870\n"
                    "{'loss': 0.3, 'learning_rate': 5e-05, 'epoch': 0.5}\n"
                    "iter 7/100 | train/loss: 0.25 | val.acc=0.9 | 45%\n")
    c = MetricsCollector(paths, 0, [parse_metric("Acc@1=Acc@1 +([0-9.]+)"), parse_metric("acc=acc=([0-9.]+)")])
    assert c.poll() == 8
    got = {(n, v, s, e) for n, v, s, e in values(paths)}
    assert got == {
        ("acc", 0.5, 123, 1), ("loss", 0.1234, 123, 1),
        ("Acc@1", 75.3, 123, 2), ("Acc@1", 76.1, 123, 2),
        ("loss", 0.3, 123, 2), ("learning_rate", 5e-05, 123, 2),
        ("train/loss", 0.25, 7, 2),
        ("acc", 0.9, 7, 2),  # the definition acc=(...) matches inside "val.acc=0.9": it wins, no duplicate
    }
    record = read_metrics(paths)[0]
    assert record["rank"] == 0 and record["attempt"] == 0 and abs(record["time"] - time.time()) < 60


def test_shape_cache_gives_what_a_regex_per_line_gives(paths):
    """Lines of one shape share one scan; digits must never change what is found."""
    import random
    import re

    from phalanx.monitor.metrics import digit_agnostic

    assert digit_agnostic(r"loss=([0-9.eE+-]+)") and digit_agnostic(r"acc\s*(\d+\.\d+)") and digit_agnostic(r"x=([a-z0-9.]+)")
    assert not digit_agnostic(r"Acc@1 ([0-9.]+)") and not digit_agnostic(r"v=(\d{2})") and not digit_agnostic(r"(?P<n1>\d)")
    rnd = random.Random(7)
    templates = ["step {i} loss={f} acc={f}", "loss={f} top1={f} 5loss={i}", "e{i}x loss={f}{i}", "loss={i}.{i}.{i} loss={f}",
                 "{i}loss={f} t{i}={f}"]
    lines = [rnd.choice(templates).format(i=rnd.randint(0, 10**rnd.randint(0, 6)), f=round(rnd.random() * 10, rnd.randint(0, 5)))
             for _ in range(3000)]
    write(paths, 0, "\n".join(lines) + "\n")
    rx = re.compile(r"loss=([0-9.eE+-]+)")
    MetricsCollector(paths, 0, [parse_metric("loss=loss=([0-9.eE+-]+)")], auto=False).poll()
    expected = [float(v) for line in lines for v in rx.findall(line) if re.fullmatch(r"[0-9]*\.?[0-9]+(e[-+]?\d+)?|\d+\.", v)]
    assert [r["value"] for r in read_metrics(paths)] == expected


def test_step_after_the_value_on_the_same_line_counts(paths):
    write(paths, 0, "loss=0.5 step=10\nloss=0.4 step=11\nval_loss=0.45\n")
    MetricsCollector(paths, 0).poll()
    assert values(paths) == [("loss", 0.5, 10, None), ("loss", 0.4, 11, None), ("val_loss", 0.45, 11, None)]


def test_malformed_numbers_and_junk_are_ignored_not_fatal(paths):
    write(paths, 0, b"time: 12:30:01 version=1.2.3 speed=10ms ratio=1.5x --lr=0.1 a=b=1\n"
                    b"loss=nan grad_norm=inf big=1e999 loss=-.5e-3,\n"
                    b"\xff\xfe\x00 garbage \x80 acc=0.75\n"
                    b"rank=1 world_size=2 pid=123 port: 29500 seed=3\n" + b"x" * 5000 + b"=1\n")
    c = MetricsCollector(paths, 0, [parse_metric("bad=loss=([a-z]+)"), parse_metric("v=version=([0-9.]+)")])
    c.poll()
    assert values(paths) == [("loss", -0.0005, None, None), ("acc", 0.75, None, None)]
    assert c.errors == 0


def test_partial_lines_wait_for_their_end_and_final_flushes(paths):
    c = MetricsCollector(paths, 0)
    write(paths, 0, "step=1 loss=0.9\nstep=2 lo")
    assert c.poll() == 1
    write(paths, 0, "ss=0.8\nstep=3 loss=0.")
    assert c.poll() == 1
    write(paths, 0, "7")
    assert c.poll() == 0
    assert c.poll(final=True) == 1
    assert values(paths) == [("loss", 0.9, 1, None), ("loss", 0.8, 2, None), ("loss", 0.7, 3, None)]


def test_progress_bars_with_carriage_returns(paths):
    write(paths, 0, " 45%|####| 45/100 [00:01<00:00, loss=0.31]\r 46%|####| 46/100 [00:01<00:00, loss=0.30]\r")
    MetricsCollector(paths, 0).poll()
    assert [v for _, v, _, _ in values(paths)] == [0.31, 0.30]


def test_automatic_pick_up_can_be_turned_off_but_steps_still_count(paths):
    write(paths, 0, "Epoch 3 step 40 loss=0.5 acc=0.9\n")
    MetricsCollector(paths, 0, [parse_metric("acc=acc=([0-9.]+)")], auto=False).poll()
    assert values(paths) == [("acc", 0.9, 40, 3)]


def test_user_metrics_file_both_forms(paths):
    write(paths, 1, '{"loss": 0.3, "acc": 0.9, "step": 10, "epoch": 1, "note": "x", "flag": true}\n'
                    '{"name": "lr", "value": 0.001, "step": 10}\n'
                    'not json\n[1, 2]\n{"loss": NaN}\n{"loss": 0.2, "step": 11}\n{"loss": 0.1', user=True)
    c = MetricsCollector(paths, 0)
    assert c.poll() == 4
    assert values(paths, rank=1) == [("loss", 0.3, 10, 1), ("acc", 0.9, 10, 1), ("lr", 0.001, 10, None), ("loss", 0.2, 11, None)]
    write(paths, 1, ', "step": 12}\n', user=True)
    c.poll()
    assert values(paths, rank=1)[-1] == ("loss", 0.1, 12, None)


def test_ranks_that_appear_later_and_activity(paths):
    c = MetricsCollector(paths, 0)
    assert c.poll() == 0
    before = c.last_activity
    time.sleep(0.01)
    write(paths, 0, "loss=1\n")
    write(paths, 3, "loss=3\n")
    assert c.poll() == 2
    assert c.last_activity > before
    quiet = c.last_activity
    assert c.poll() == 0 and c.last_activity == quiet  # nothing new: no activity
    assert [r["rank"] for r in read_metrics(paths)] == [0, 3]
    assert paths.rank_metrics(0, 3).exists()


def test_background_thread_and_final_poll(paths):
    write(paths, 0, "loss=1\n")
    c = MetricsCollector(paths, 0).start(interval=0.05)
    deadline = time.time() + 10
    while c.records < 1 and time.time() < deadline:
        time.sleep(0.02)
    write(paths, 0, "loss=2")  # no newline: only the final poll takes it
    assert c.stop() == 2
    assert c.stop() == 2  # idempotent
    assert [v for _, v, _, _ in values(paths)] == [1.0, 2.0]


def test_large_output_in_bounded_chunks(paths, monkeypatch):
    import phalanx.monitor.metrics as m

    monkeypatch.setattr(m, "READ_CHUNK", 1000)  # many chunk boundaries inside lines
    write(paths, 0, "".join(f"epoch {i // 100} step {i} loss={i / 1000:.4f} acc=0.5\n" for i in range(2000)))
    c = MetricsCollector(paths, 0, [parse_metric("loss=loss=([0-9.eE+-]+)"), parse_metric("acc=acc=([0-9.]+)")])
    assert c.poll(final=True) == 4000
    records = read_metrics(paths)
    assert sorted(r["step"] for r in records if r["name"] == "loss") == list(range(2000))
    assert all(r["value"] == r["step"] / 1000 for r in records if r["name"] == "loss")
    assert all(r["epoch"] == r["step"] // 100 for r in records)


def test_bounded_polls_catch_up_later(paths, monkeypatch):
    import phalanx.monitor.metrics as m

    monkeypatch.setattr(m, "READ_CHUNK", 100)
    write(paths, 0, "".join(f"step={i} loss={i}\n" for i in range(100)))  # about 1,600 bytes
    c = MetricsCollector(paths, 0)
    assert c.poll(max_bytes=300) < 30
    while c.poll(max_bytes=300):
        pass
    assert [r["step"] for r in read_metrics(paths)] == list(range(100))


def test_read_back_summary_by_step_and_attempts(paths):
    write(paths, 0, "step=1 loss=0.9\nstep=2 loss=0.5\nstep=3 loss=0.7\n", attempt=0)
    write(paths, 0, "step=2 loss=0.4\nstep=3 loss=0.3\nstep=4 loss=0.2\n", attempt=1)
    MetricsCollector(paths, 0).poll()
    MetricsCollector(paths, 1).poll()
    records = read_metrics(paths)
    assert [r["attempt"] for r in records] == [0, 0, 0, 1, 1, 1]
    assert summarize(records) == {"loss": {"last": 0.2, "min": 0.2, "max": 0.9, "count": 6, "last_step": 4}}
    assert by_step(records, "loss") == [(1, 0.9), (2, 0.4), (3, 0.3), (4, 0.2)]  # the retry's values win
    assert summarize(read_metrics(paths, attempt=0))["loss"]["last"] == 0.7


def test_sparkline():
    assert sparkline([]) == ""
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([2.0, 2.0]) == "▄▄"
    line = sparkline([float(i) for i in range(1000)], width=20)
    assert len(line) == 20 and line[0] == "▁" and line[-1] == "█"


def test_metrics_report_and_errors(paths):
    from phalanx.errors import UsageError

    write(paths, 0, "step=1 loss=0.9\nstep=2 loss=0.5\n")
    MetricsCollector(paths, 0).poll()
    paths_ = paths

    class Record:  # what the report reads of a JobRecord (``paths``: its job directory)
        id, job_dir, nnodes, nproc_per_node, attempt, paths = "abc", str(paths_.root), 1, 2, 0, paths_

    report = metrics_report(Record())
    assert report["rank"] == 0 and report["metrics"]["loss"]["last"] == 0.5
    assert report["metrics"]["loss"]["sparkline"] == "█▁"
    json.dumps(report)
    with pytest.raises(UsageError, match="no attempt 5"):
        metrics_report(Record(), attempt=5)
    with pytest.raises(UsageError, match="no rank 9"):
        metrics_report(Record(), rank=9)
