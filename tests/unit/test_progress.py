"""Progress and ETA read from what scripts print: real tqdm output (with its \\r redraws), the
Rich bar of a real Lightning Trainer at a terminal (recorded), HF-Trainer-style lines, Keras,
step/epoch counts, --progress REGEX; and through the metrics collector reading a real log."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from tqdm import tqdm

from phalanx.core.grammar import progress_regex
from phalanx.core.paths import JobPaths
from phalanx.core.optiontypes import BadValue
from phalanx.health.progress import Estimate, ProgressTracker, epochs_from_args, human, last_step

RECORDED = Path(__file__).parent / "recorded" / "progress"


def read(lines: str, **kw) -> Estimate | None:
    tracker = ProgressTracker(**kw)
    tracker.feed(0, lines, 10.0)
    return tracker.estimate(10.0)


def tqdm_output(total: int, upto: int, **kw) -> str:
    """What a real tqdm bar writes to a file (``\\r`` redraws, no newline), as phalanx reads it."""
    out = io.StringIO()
    bar = tqdm(total=total, file=out, mininterval=0, miniters=1, **kw)
    for _ in range(upto):
        bar.update(1)
    text = out.getvalue()
    bar.close()
    return text.replace("\r", "\n")  # the collector ends a line at \r too


def test_a_real_tqdm_bar_gives_the_share_done_and_an_eta_from_the_pace():
    tracker = ProgressTracker()
    text = tqdm_output(1000, 800)
    lines = text.split("\n")
    assert tracker.feed(0, "\n".join(lines[:300]), 100.0)
    first = tracker.estimate(100.0)
    assert first is not None and first.text.endswith("/1000") and first.eta is None  # one reading: no pace yet
    tracker.feed(0, "\n".join(lines[300:]), 160.0)
    now = tracker.estimate(160.0)
    assert now.fraction == pytest.approx(0.8) and now.text == "800/1000"
    # about 0.5 of the run in 60 s: 0.2 left takes about 24 s
    assert now.eta == pytest.approx(0.2 / ((0.8 - first.fraction) / 60), rel=0.01)
    assert now.short(160.0) == "80% ETA 24s" and now.short(170.0) == "80% ETA 14s"  # counted down
    assert now.short(170.0, running=False) == "80%"


def test_a_labelled_tqdm_bar_and_its_evaluation_bar():
    train = tqdm_output(500, 250, desc="train")
    evaluation = tqdm_output(40, 40, desc="Validation")
    assert read(train + "\n" + evaluation).text == "train 250/500"  # the evaluation bar is not the run's


def test_the_rich_bar_of_a_real_lightning_trainer_at_a_terminal():
    # Recorded from a real Trainer(max_epochs=3) with phalanx's own rich installed (Lightning then
    # picks RichProgressBar), under a pseudo-terminal: ANSI colours, cursor moves, \r redraws.
    raw = (RECORDED / "lightning_rich_pty.txt").read_bytes().decode()
    text = raw.replace("\r", "\n")
    halfway = text.index("Epoch 1/2")
    middle = read(text[:text.index("\n", halfway + 400)])  # complete lines, as the collector hands them on
    assert middle.text.startswith("epoch 1/2 · ") and 1 / 3 <= middle.fraction < 2 / 3
    end = read(text)
    assert end.text == "epoch 2/2 · 80/80" and end.fraction == 1.0


def test_lightnings_tqdm_bar_with_the_epochs_from_the_scripts_arguments():
    line = "Epoch 2:  45%|████▌     | 36/80 [00:12<00:15, 2.85it/s, v_num=0, train_loss=0.512]"
    assert epochs_from_args(("--lr", "0.1", "--max_epochs", "5")) == 5
    assert epochs_from_args(("--epochs=4",)) == 4 and epochs_from_args(("--steps", "9")) is None
    with_epochs = read(line, epochs=5)
    assert with_epochs.fraction == pytest.approx((2 + 36 / 80) / 5) and not with_epochs.of_epoch
    alone = read(line)  # no count of epochs anywhere: the share of this epoch
    assert alone.of_epoch and alone.fraction == pytest.approx(0.45) and alone.short(10.0).startswith("epoch 2 45%")


def test_hf_trainer_style_output():
    # The HF Trainer's main bar counts global steps; its log lines are dicts; its evaluation
    # bar is an unlabelled, shorter bar.
    text = "\n".join([
        " 10%|█         | 100/1000 [00:20<03:00,  5.00it/s]",
        "{'loss': 0.6931, 'grad_norm': 1.234, 'learning_rate': 4.5e-05, 'epoch': 0.3}",
        " 15%|█▌        | 150/1000 [00:30<02:50,  5.00it/s]",
        "100%|██████████| 13/13 [00:01<00:00, 10.20it/s]",
        "{'eval_loss': 0.65, 'eval_runtime': 1.3, 'epoch': 0.45}",
    ])
    found = read(text)
    assert found.text == "150/1000" and found.fraction == pytest.approx(0.15)


def test_counts_epochs_and_keras():
    assert read("step 12/100 loss=0.3").text == "step 12/100"
    assert read("iter: 5/50").fraction == pytest.approx(0.1)
    assert read("[300/1000] loss 0.2").fraction == pytest.approx(0.3)
    # epoch 3 of 10 (from 1) with the step inside it
    assert read("Epoch [3/10] step 20/500 loss=1.0").fraction == pytest.approx(0.2 + 20 / 500 / 10)
    # epochs from 0 once a 0 was seen
    tracker = ProgressTracker()
    tracker.feed(0, "epoch 0/4 loss=1\nepoch 1/4 loss=0.9", 1.0)
    assert tracker.estimate(1.0).fraction == pytest.approx(0.25)
    # Keras: the epoch line, then its bar
    keras = "Epoch 2/10\n 32/100 [========>.....................] - ETA: 1s - loss: 0.5"
    assert read(keras).fraction == pytest.approx(0.1 + 0.32 / 10)


def test_a_global_step_counter_under_an_epoch_count_is_the_runs():
    # 700 of 5000 steps is inside epoch 2's share (10%-20%): the counter counts the whole run
    assert read("epoch 2/10 step 700/5000").fraction == pytest.approx(0.14)


def test_user_regex():
    assert read("done 3 of 12 shards", pattern=r"done (\d+) of (\d+)").fraction == pytest.approx(0.25)
    assert read("42.5% complete", pattern=r"(?P<percent>[\d.]+)% complete").fraction == pytest.approx(0.425)
    assert read("step 5/10", pattern=r"shard (\d+) of (\d+)") is None  # only the user's pattern counts
    with pytest.raises(BadValue):
        progress_regex(r"no groups")
    with pytest.raises(BadValue):
        progress_regex(r"(?P<done>\d+) only")


def test_rates_restart_when_the_share_falls_back():
    tracker = ProgressTracker()
    tracker.feed(0, "Epoch 0: 50%|#####     | 50/100", 10.0)
    tracker.feed(0, "Epoch 0: 90%|#########| 90/100", 20.0)
    assert tracker.estimate(20.0).eta == pytest.approx(2.5)
    tracker.feed(0, "Epoch 1: 10%|#         | 10/100", 25.0)  # a new epoch of an unknown number
    assert tracker.estimate(25.0).eta is None and tracker.estimate(25.0).of_epoch


def test_the_lowest_rank_that_prints_progress_is_followed():
    tracker = ProgressTracker()
    tracker.feed(2, "step 10/100", 1.0)
    tracker.feed(0, "step 50/100", 2.0)
    tracker.feed(2, "step 99/100", 3.0)
    assert tracker.estimate(3.0).text == "step 50/100" and tracker.estimate(3.0).rank == 0


def test_last_step_and_human():
    assert last_step(b"step 48 loss=1\nstep 49 loss=1\nglobal_step=50 acc=1\n") == 50
    assert last_step(b"no steps here") is None
    assert [human(s) for s in (45, 720, 11100, 190000)] == ["45s", "12m", "3h05m", "2d4h"]


def test_progress_through_the_collector_reading_a_real_log(tmp_path):
    """The guard hears the output as the metrics collector reads it (partial lines, \\r)."""
    from phalanx.monitor.metrics import MetricsCollector

    paths = JobPaths(tmp_path)
    log = paths.rank_log(0, 0)
    log.parent.mkdir(parents=True)
    tracker = ProgressTracker()

    class Hear:
        def output(self, rank, text, now):
            tracker.feed(rank, text, now)

        def values(self, rank, block, nonfinite, now):
            pass

    collector = MetricsCollector(paths, 0, observer=Hear())
    text = tqdm_output(200, 150, postfix={"loss": 0.25})
    cut = len(text) // 2
    log.write_text(text[:cut].replace("\n", "\r"))
    collector.poll()
    first = tracker.estimate(0.0)
    with open(log, "a") as fh:
        fh.write(text[cut:].replace("\n", "\r"))
    collector.poll(final=True)
    assert first is not None and tracker.estimate(0.0).text == "150/200"
    assert collector.records > 0  # the bar's postfix is a metric too


def test_a_sweeps_eta_counts_its_running_trials_progress(tmp_path):
    import time
    from types import SimpleNamespace

    from phalanx.core.state import JobState
    from phalanx.health.progress_file import Health, write
    from phalanx.api.lists import sweep_eta

    def trial(n: int, state: JobState, fraction: float | None) -> SimpleNamespace:
        paths = JobPaths(tmp_path / f"t{n}")
        if fraction is not None:
            write(paths.health, Health(0, 1.0, Estimate(f"step {fraction}", fraction, None, None, 1.0, 0)))
        return SimpleNamespace(state=state, paths=paths)

    trials = [trial(0, JobState.SUCCEEDED, 1.0), trial(1, JobState.SUCCEEDED, None), trial(2, JobState.RUNNING, 0.5),
              trial(3, JobState.RUNNING, 0.5), trial(4, JobState.PENDING, None)]
    store = SimpleNamespace(trials=lambda sweep_id: trials)
    sweep = SimpleNamespace(id="s", total=6, finished=2, started_at=time.time() - 300)
    # 3 trials' worth done in 300 s: the 3 left take 300 s more
    assert sweep_eta(store, sweep) == pytest.approx(300, rel=0.02)
    assert sweep_eta(store, SimpleNamespace(id="s", total=6, finished=0, started_at=None)) is None


def test_no_output_makes_the_tracker_fail():
    """Whatever a script prints (the supervisor reads it all), progress is read or not, never an error."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    pieces = st.sampled_from(["epoch", "Epoch", " ", "0", "12", "3.5.6", "/", "%|", "|", "k", "step", "[", "]", ":",
                              "━", "\n", "Validation", "1.2.3k", "9" * 30, "\x1b[2K", "it/s", "Epoch 0/"])

    @settings(max_examples=400, deadline=None)
    @given(st.lists(pieces, max_size=16).map("".join), st.sampled_from([None, r"(\d+) of (\d+)", r"(?P<percent>[\d.]+)%"]))
    def feed(text: str, pattern: str | None) -> None:
        tracker = ProgressTracker(pattern, epochs=3)
        tracker.feed(0, text, 1.0)
        tracker.feed(0, text, 2.0)
        tracker.estimate(2.0)

    feed()
