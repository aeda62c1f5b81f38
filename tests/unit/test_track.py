"""``--track`` without a tracker: the options and their settings, the ids a script is handed, the
parameters read from a script's arguments, and the exporter's cursor over a job's files (in order,
nothing twice across a restart, a rewritten file or a failed delivery)."""

from __future__ import annotations

import json
import os
from array import array


from phalanx.core.env import tracker_env
from phalanx.core.paths import JobPaths
from phalanx.monitor.metricfile import NONE, Columns, encode_block
from phalanx.monitor.stream import JobStream
from phalanx.supervise.trackinfo import script_params
from phalanx.track.conventions import capture, describe, metric_key, TrackState
from tests.unit.test_bad_input import _run_options, assert_one_line_error, cli, project  # noqa: F401


def test_script_arguments_become_parameters():
    args = ("--lr", "0.1", "--bs=32", "--amp", "--name", "-x", "data.csv", "--scale", "-1.5", "--last")
    assert script_params(args) == {"lr": "0.1", "bs": "32", "amp": "true", "name": "true", "scale": "-1.5",
                                   "last": "true"}


def test_the_script_is_handed_the_ids_its_own_tracker_code_reads():
    config = {"MLFLOW_TRACKING_URI": "http://m:5000", "WANDB_PROJECT": "p", "MLFLOW_EXPERIMENT_NAME": "e"}
    env = tracker_env(("mlflow", "wandb"), config, "abc123", "abc123", "run9")
    assert env == {"MLFLOW_TRACKING_URI": "http://m:5000", "MLFLOW_EXPERIMENT_NAME": "e", "MLFLOW_RUN_ID": "run9",
                   "WANDB_PROJECT": "p", "WANDB_RUN_ID": "phalanx-abc123", "WANDB_RESUME": "allow",
                   "WANDB_RUN_GROUP": "abc123"}
    assert "MLFLOW_RUN_ID" not in tracker_env(("mlflow",), config, "abc123", "g", None)  # no run yet
    assert tracker_env(("tensorboard",), config, "abc123", "g", None) == {}
    # places only: a key in the environment is never recorded
    assert capture(("wandb",), {"WANDB_API_KEY": "secret", "WANDB_MODE": "offline"}) == {"WANDB_MODE": "offline"}
    assert (metric_key("loss", 0, True), metric_key("loss", 3, True), metric_key("loss", 3, False)) == \
        ("loss", "rank3/loss", "loss")


def test_status_line_says_what_waits_and_why():
    state = TrackState("mlflow", run_id="r1", url="http://m/#/experiments/1/runs/r1", sent=10, waiting=5,
                       error="MLflow at http://m did not answer")
    line = describe(state, exporter_alive=False)
    assert line.startswith("http://m/#/experiments/1/runs/r1  (10 points sent, 5 waiting (exporter stopped")
    assert "last error: MLflow at http://m did not answer" in line


def test_options_settings_and_job_file(project, monkeypatch, capsys):  # noqa: F811
    from phalanx.jobfile import build_spec

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "never-recorded")
    spec = build_spec(_run_options(["--track", "mlflow", "--track", "tensorboard", "--track-ranks", "all",
                                    "--track-artifacts", "-e", "MLFLOW_EXPERIMENT_NAME=x", "t.py"]))
    assert spec.track == ("mlflow", "tensorboard") and spec.track_ranks == "all" and spec.track_artifacts
    assert spec.track_config == {"MLFLOW_TRACKING_URI": "http://127.0.0.1:1", "MLFLOW_EXPERIMENT_NAME": "x"}
    assert "never-recorded" not in json.dumps(spec.to_dict())
    monkeypatch.setenv("PHALANX_TRACK", "tensorboard")
    assert build_spec(_run_options(["t.py"])).track == ("tensorboard",)
    (project / "job.yaml").write_text("script: t.py\ntrack: [wandb, mlflow]\ntrack_dir: tb\n")
    spec = build_spec(_run_options(["-f", "job.yaml"]))
    assert spec.track == ("wandb", "mlflow") and spec.track_dir == str(project / "tb")
    assert "track_dir is where TensorBoard writes; add --track tensorboard" in capsys.readouterr().err
    code, _, err = cli(["run", "--dry-run", "--track", "neptune", "t.py"], capsys)
    assert_one_line_error(code, err, 2, "--track")
    assert "mlflow, tensorboard, wandb" in err
    monkeypatch.setenv("PHALANX_TRACK", "mlflow,comet")
    code, _, err = cli(["run", "--dry-run", "t.py"], capsys)
    assert_one_line_error(code, err, 2, "setting 'track' names comet")


def _block(time: float, rows: list[tuple[str, int | None, float]]) -> bytes:
    columns: dict[str, Columns] = {}
    for seq, (name, step, value) in enumerate(rows):
        col = columns.setdefault(name, Columns())
        col.seq.append(seq)
        col.steps.append(NONE if step is None else step)
        col.epochs.append(NONE)
        col.values.append(value)
    return encode_block(time, columns)


def _paths(tmp_path) -> JobPaths:
    paths = JobPaths(tmp_path / "job")
    for attempt in (0, 1):
        paths.rank_dir(attempt, 0).mkdir(parents=True)
    return paths


def test_stream_takes_in_order_and_a_new_reader_goes_on_from_the_cursor(tmp_path):
    paths = _paths(tmp_path)
    first = _block(1.0, [("loss", 0, 1.0), ("acc", 0, 0.1), ("loss", 1, 0.5)]) + _block(2.0, [("loss", 2, 0.25)])
    paths.rank_metrics(0, 0).write_bytes(first)
    paths.rank_metrics(1, 0).write_bytes(_block(3.0, [("loss", 3, 0.125), ("loss", None, 9.0)]))
    stream = JobStream(paths, all_ranks=False)
    assert stream.waiting() == 6
    got = stream.take(2)
    assert [(r.name, r.step, r.value) for r in got] == [("loss", 0, 1.0), ("acc", 0, 0.1)]
    # not delivered, and the reader gone: a new one from the saved cursor takes the same again
    stream = JobStream(paths, False, stream.cursor())
    assert [(r.name, r.step) for r in stream.take(2)] == [("loss", 0), ("acc", 0)]
    stream.commit()
    assert stream.waiting() == 4
    # a new reader (a restarted exporter) from the saved cursor: the rest, attempt 0 before 1
    again = JobStream(paths, False, json.loads(json.dumps(stream.cursor())))
    rest = again.take(100)
    assert [(r.attempt, r.name, r.step, r.value, r.time) for r in rest] == [
        (0, "loss", 1, 0.5, 1.0), (0, "loss", 2, 0.25, 2.0), (1, "loss", 3, 0.125, 3.0), (1, "loss", None, 9.0, 3.0)]
    again.commit()
    assert again.take(100) == [] and again.waiting() == 0
    # attempt 1's file written anew (a supervisor re-reading the output): same records, new file
    path = paths.rank_metrics(1, 0)
    path.unlink()
    path.write_bytes(_block(4.0, [("loss", 3, 0.125), ("loss", None, 9.0), ("loss", 4, 0.0625)]))
    assert [(r.step, r.value, r.time) for r in again.take(100)] == [(4, 0.0625, 4.0)]


def test_stream_reads_resource_samples_of_node_zero_and_every_rank_with_all(tmp_path):
    paths = _paths(tmp_path)
    paths.rank_dir(0, 1).mkdir(parents=True)
    paths.rank_metrics(0, 1).write_bytes(_block(1.0, [("loss", 0, 2.0)]))
    paths.node_dir(0, 0).mkdir(parents=True)
    sample = {"time": 5.0, "cpu_percent": 50.0, "mem_used": 2.0, "mem_total": 8.0,
              "gpus": [{"index": 0, "util": 80, "mem_used": 1e9}]}
    paths.node_resources(0, 0).write_text(json.dumps(sample) + "\n" + '{"time": 6.0, "cpu_p')  # a line being written
    only0 = JobStream(paths, all_ranks=False).take(100)
    assert {(r.kind, r.name, r.value) for r in only0} == {
        ("r", "cpu_percent", 50.0), ("r", "mem_used", 2.0), ("r", "mem_percent", 25.0),
        ("r", "gpu0/util", 80.0), ("r", "gpu0/mem_used", 1e9)}
    every = JobStream(paths, all_ranks=True).take(100)
    assert ("m", 1, "loss") in {(r.kind, r.where, r.name) for r in every}


def test_metric_block_sizes_are_bounded_by_take(tmp_path):
    paths = _paths(tmp_path)
    rows = [("loss", i, float(i)) for i in range(1000)]
    paths.rank_metrics(0, 0).write_bytes(_block(1.0, rows))
    stream = JobStream(paths, all_ranks=False)
    seen = []
    while batch := stream.take(300):
        seen += [r.step for r in batch]
        stream.commit()
    assert seen == list(range(1000))
    assert os.path.getsize(paths.rank_metrics(0, 0)) > 0 and array("q", seen) == array("q", range(1000))


class _Flaky:
    """An exporter whose tracker is down for one call, then refuses one batch, then takes all."""

    kind = "mlflow"

    def __init__(self) -> None:
        self.calls = 0
        self.kept: list[tuple[str, int, float]] = []
        self.ending = None

    def open(self, run, state) -> None:
        state.run_id = "r1"

    def params(self, run) -> None:
        pass

    def send(self, points) -> int:
        from phalanx.errors import TrackerRefused, TrackerUnavailable

        self.calls += 1
        if self.calls == 2:
            raise TrackerUnavailable("down for a moment")
        if self.calls == 4:
            raise TrackerRefused("not these", "INVALID_PARAMETER_VALUE")
        self.kept += [(p.key, p.step, p.value) for p in points]
        return 0

    def finish(self, ending) -> None:
        self.ending = ending

    def artifacts(self, files) -> None:
        pass

    def close(self) -> None:
        pass


def test_exporter_sends_each_point_once_in_order_across_failures_and_counts_refused(tmp_path, monkeypatch, capsys):
    from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec
    from phalanx.supervise import exporter

    monkeypatch.setattr(exporter, "BATCH", 10)
    monkeypatch.setattr(exporter, "BACKOFF_MAX", 0.01)
    paths = JobPaths(tmp_path / "home" / "jobs" / "j1")
    paths.rank_dir(0, 0).mkdir(parents=True)
    rows = [("loss", i, float(i)) for i in range(50)]
    paths.rank_metrics(0, 0).write_bytes(_block(1.0, rows[:25]) + _block(2.0, rows[25:]))
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(tmp_path / "t.py"), ()), name="j", workdir=str(tmp_path),
                   track=("mlflow",))
    paths.spec.write_text(json.dumps(spec.to_dict()))
    (paths.track).mkdir()
    paths.track_ended.write_text(json.dumps({"state": "SUCCEEDED", "exit_code": 0}))
    worker = exporter.Worker("mlflow", paths, spec, (0, 0.0), linger=60)
    flaky = worker.exporter = _Flaky()
    worker.run()
    # the batch that met a tracker down is sent again as it was; the refused one is dropped, once
    assert [step for _, step, _ in flaky.kept] == list(range(20)) + list(range(30, 50))
    state = json.loads(paths.track_state("mlflow").read_text())
    assert (state["sent"], state["dropped"], state["waiting"], state["finished"]) == (40, 10, 0, True)
    assert flaky.ending.state == "SUCCEEDED" and state["error"] == ""  # later points went through
    said = capsys.readouterr().err  # the exporter's log says what happened
    assert "mlflow: down for a moment" in said and "mlflow: not these" in said
