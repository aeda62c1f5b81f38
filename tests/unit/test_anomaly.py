"""Bad numbers caught (nan/inf, spikes) in what the collector reads; the retry decision after
divergence (pure); the arguments --on-nan-args computes; versions of a state directory kept,
linked, pruned and restored on a real filesystem."""

from __future__ import annotations

import os

import pytest

from phalanx.core.contracts import OutcomeKind
from phalanx.core.paths import JobPaths
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec
from phalanx.errors import UsageError
from phalanx.health.anomaly import Anomaly, AnomalyWatch, Rules, pick_version, rules_of
from phalanx.health.anomaly_args import apply, check
from phalanx.monitor.metrics import MetricsCollector
from phalanx.storage.versions import Versions, listing
from phalanx.supervise.outcome import Outcome
from phalanx.supervise.retry import should_retry


def collect(tmp_path, text: str, rules: Rules) -> tuple[AnomalyWatch, MetricsCollector]:
    paths = JobPaths(tmp_path)
    log = paths.rank_log(0, 0)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text)
    watch = AnomalyWatch(rules)

    class Hear:
        def output(self, rank, text, now):
            pass

        def values(self, rank, block, nonfinite, now):
            watch.nonfinite(nonfinite, now) or watch.values(rank, block, now)

    collector = MetricsCollector(paths, 0, observer=Hear())
    collector.poll(final=True)
    return watch, collector


def test_a_watched_loss_printed_as_nan_is_caught_with_its_step_and_rank(tmp_path):
    lines = "".join(f"step {s} loss={1 / s:.4f} grad_norm=nan\n" for s in range(1, 1234))
    watch, collector = collect(tmp_path, lines + "step 1234 loss=nan lr=0.1\nstep 1235 loss=0.5\n", Rules(on_nan="stop"))
    found = watch.found
    assert found is not None and (found.metric, found.value, found.step, found.rank) == ("loss", "nan", 1234, 0)
    assert found.message() == "diverged: loss=nan at step 1,234 (rank 0)"
    # grad_norm=nan on every line is not watched (a skipped step under mixed precision); nan is no record
    from phalanx.monitor.readback import read_metrics

    names = {r["name"] for r in read_metrics(JobPaths(tmp_path), 0, 0)}
    assert "grad_norm" not in names and collector.records == 1233 + 2  # the finite losses, lr, the loss after


@pytest.mark.parametrize("printed", ["loss: inf", "loss=-inf", "'loss': NaN,", "train_loss=nan"])
def test_the_ways_nan_and_inf_are_printed(tmp_path, printed):
    watch, _ = collect(tmp_path, f"step 7 {printed}\n", Rules(on_nan="stop"))
    assert watch.found is not None and watch.found.step == 7


def test_nothing_is_watched_without_the_options_and_loss_scale_never_is(tmp_path):
    assert collect(tmp_path, "loss=nan\n", Rules())[0].found is None
    assert collect(tmp_path, "loss_scale=inf\n", Rules(on_nan="stop"))[0].found is None
    assert collect(tmp_path, "acc=nan\n", Rules(on_nan="stop", watch=("acc",)))[0].found is not None


def test_a_spike_above_factor_times_the_recent_median(tmp_path):
    steady = "".join(f"step {s} loss={1.0 + 0.01 * (s % 3)}\n" for s in range(1, 30))
    watch, _ = collect(tmp_path, steady + "step 30 loss=9.0\n", Rules(spike=10.0))
    assert watch.found is None  # 9x: below the factor
    watch, _ = collect(tmp_path, steady + "step 30 loss=12.5\n", Rules(spike=10.0))
    found = watch.found
    assert found.kind == "spike" and found.step == 30 and found.median == pytest.approx(1.01)
    assert found.message() == "diverged: loss=12.5 at step 30 (rank 0), 12× its recent median 1.01"
    assert Anomaly.from_dict(found.to_dict()) == found
    # the first values swing: none is judged before MIN_VALUES
    assert collect(tmp_path, "loss=1\nloss=50\n", Rules(spike=10.0))[0].found is None


def test_rules_from_a_spec():
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "t.py"), on_nan="retry", on_spike=5.0)
    rules = rules_of(spec, objective="val_acc")
    assert rules.action == "retry" and rules.watches("train_loss") and rules.watches("val_acc")
    assert not rules.watches("loss_scale") and not rules.watches("acc")
    assert rules_of(spec.with_(watch_metrics=("acc*",))).watch == ("acc*",)


def diverged(step: int = 57) -> Outcome:
    anomaly = Anomaly("nan", "loss", "nan", step, 0, 1000.0)
    return Outcome(OutcomeKind.DIVERGED, 1, {"message": anomaly.message(), "anomaly": anomaly.to_dict()})


def test_the_retry_decision_after_divergence():
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "t.py"), max_retries=2)
    nothing = lambda: ""  # noqa: E731
    assert should_retry(spec.with_(on_nan="stop"), diverged(), 0, nothing)[0] is False
    assert should_retry(spec.with_(on_nan="retry"), diverged(), 0, nothing) == (True, "diverged: rolling back")
    assert should_retry(spec.with_(on_nan="retry"), diverged(), 2, nothing) == (False, "no retries left (2/2 used)")
    timeout = Outcome(OutcomeKind.TIMEOUT, 124, {"message": "ran for 6h"})
    assert should_retry(spec, timeout, 0, nothing) == (False, "timeout")


def test_the_version_a_rollback_picks():
    versions = [{"n": 0, "step": None, "time": 100.0}, {"n": 1, "step": 40, "time": 140.0},
                {"n": 2, "step": 50, "time": 150.0}, {"n": 3, "step": 57, "time": 157.5}, {"n": 4, "step": 60, "time": 161.0}]
    anomaly = Anomaly("nan", "loss", "nan", 57, 0, 158.0)
    assert pick_version(versions, anomaly)["n"] == 2  # written at step 57 may hold its numbers already
    assert pick_version(versions[:1], anomaly)["n"] == 0  # only the state it started from
    unstepped = Anomaly("nan", "loss", "nan", None, 0, 158.0)
    assert pick_version(versions, unstepped)["n"] == 2  # by time: 157.5 is within the read's second
    assert pick_version([], anomaly) is None


def test_on_nan_args_computes_from_the_scripts_own_arguments():
    args = ("--lr", "0.1", "--bs", "32", "--warmup-steps=100")
    assert apply("--lr {lr*0.5}", args) == ("--lr", "0.05", "--bs", "32", "--warmup-steps=100")
    assert apply("--lr {lr/2} --warmup-steps {warmup_steps + 50}", args) == (
        "--lr", "0.05", "--bs", "32", "--warmup-steps=150")
    assert apply("--lr {lr*0.5}", apply("--lr {lr*0.5}", args))[1] == "0.025"  # every retry again
    check("--lr {lr*0.5}", args)
    for bad, word in [("--lr {momentum*0.5}", "no --momentum"), ("--lr {lr*}", "not arithmetic"),
                      ("--lr {__import__('os')}", "not arithmetic"), ("--lr {lr ** 99}", "not arithmetic"), ("", "empty")]:
        with pytest.raises(UsageError, match=word):
            check(bad, args)
    with pytest.raises(UsageError, match="not a number"):
        check("--bs {name}", ("--bs", "1", "--name", "x"))


# -- versions of the state directory ----------------------------------------------------------------


def write(path, data: bytes, mtime: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:  # in place, as torch.save does
        fh.write(data)
    os.utime(path, (mtime, mtime))


def test_versions_survive_checkpoints_rewritten_in_place(tmp_path):
    live = tmp_path / "state"
    versions = Versions(tmp_path / "states", keep=3)
    write(live / "model.pt", b"weights-10", 1000)
    write(live / "sub" / "data.bin", b"x" * 4096, 1000)
    write(live / ".tmp-half", b"partial", 1000)  # temporary names are left out
    v0 = versions.take(live, 10, 1000.0, 0)
    assert v0["step"] == 10 and sorted(v0["files"]) == ["model.pt", "sub/data.bin"]
    assert versions.take(live, 11, 1001.0, 0) is None  # nothing changed
    write(live / "model.pt", b"weights-20", 2000)  # rewritten in place
    v1 = versions.take(live, 20, 2000.0, 0)
    assert (versions.path(v0) / "model.pt").read_bytes() == b"weights-10"  # the older version is intact
    assert (versions.path(v1) / "model.pt").read_bytes() == b"weights-20"
    # the unchanged file is one inode for both versions, never the live one's
    assert os.stat(versions.path(v0) / "sub" / "data.bin").st_ino == os.stat(versions.path(v1) / "sub" / "data.bin").st_ino
    assert os.stat(versions.path(v1) / "sub" / "data.bin").st_ino != os.stat(live / "sub" / "data.bin").st_ino
    assert v1["how"]["link"] == 1 and (v1["how"].get("copy", 0) + v1["how"].get("reflink", 0)) == 1
    for step in (30, 40):
        write(live / "model.pt", f"weights-{step}".encode(), step * 100)
        versions.take(live, step, step * 100.0, 0)
    assert [v["step"] for v in versions.list()] == [20, 30, 40]  # the last K
    assert not versions.path(v0).exists()


def test_restore_is_a_byte_equal_copy_and_keeps_what_was_there(tmp_path):
    live = tmp_path / "state"
    versions = Versions(tmp_path / "states", keep=5)
    write(live / "model.pt", os.urandom(100_000), 1000)
    at50 = versions.take(live, 50, 1000.0, 0)
    good = (versions.path(at50) / "model.pt").read_bytes()
    write(live / "model.pt", b"nan nan nan", 2000)
    at60 = versions.take(live, 60, 2000.0, 0)
    aside = versions.restore(at50, live)
    assert (live / "model.pt").read_bytes() == good and listing(live) == {"model.pt": (100_000, 1000 * 10**9)}
    assert (aside / "model.pt").read_bytes() == b"nan nan nan"  # the diverged state, kept aside
    assert os.stat(live / "model.pt").st_ino != os.stat(versions.path(at50) / "model.pt").st_ino  # a copy
    write(live / "model.pt", b"the retry writes over it", 3000)
    assert (versions.path(at50) / "model.pt").read_bytes() == good
    assert versions.drop_after(at50) == 1 and [v["n"] for v in versions.list()] == [at50["n"]]
    assert not versions.path(at60).exists()


# -- the options, as a run builds its spec ------------------------------------------------------------


def test_the_health_options_build_into_the_spec(tmp_path, monkeypatch):
    from phalanx.jobfile import RunOptions, build_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("print(1)\n")
    spec = build_spec(RunOptions(words=["t.py", "--lr", "0.1"], on_nan="retry", on_nan_args="--lr {lr*0.5}",
                                 max_duration="1h30m", idle_timeout="10m", on_spike="8", watch_metrics=["val_*"]))
    assert (spec.on_nan, spec.keep_states, spec.max_retries, spec.on_spike) == ("retry", 3, 3, 8.0)
    assert (spec.max_duration, spec.idle_timeout, spec.watch_metrics) == (5400.0, 600.0, ("val_*",))
    spec = build_spec(RunOptions(words=["t.py"], on_nan="retry", keep_states="5", max_retries="1"))
    assert (spec.keep_states, spec.max_retries) == (5, 1)
    spec = build_spec(RunOptions(words=["t.py"], on_nan="stop"))
    assert (spec.keep_states, spec.max_retries) == (0, 0)
    for given, word in [({"on_nan_args": "--lr {lr*0.5}", "on_nan": "retry"}, "no --lr"),
                        ({"on_nan_args": "--x 1"}, "--on-nan is not retry"),
                        ({"on_nan": "retry", "keep_states": "0"}, "--keep-states is 0"),
                        ({"watch_metrics": ["loss"]}, "neither is given")]:
        with pytest.raises(UsageError, match=word):
            build_spec(RunOptions(words=["t.py"], **given))
