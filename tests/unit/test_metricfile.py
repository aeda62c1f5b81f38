"""The compact metrics file: what the collector writes reads back exactly, older JSON-lines files
read the same everywhere, and torn or half-written blocks are never read as data."""

from __future__ import annotations

import io
import json
import math
import random
import struct
import subprocess
import sys

import pytest

from phalanx.core.paths import JobPaths
from phalanx.core.spec import parse_metric
from phalanx.monitor.metricfile import NONE, Columns, encode_block, read_blocks, read_series, tail_blocks
from phalanx.monitor.metrics import MetricsCollector, read_metrics
from phalanx.monitor.readback import export_jsonl, rank_series, read_since, recent_records
from phalanx.monitor.report import metrics_report, recent_metrics, status_summary_lines


@pytest.fixture
def paths(tmp_path) -> JobPaths:
    return JobPaths(tmp_path / "job")


def log(paths: JobPaths, text: str, attempt: int = 0, rank: int = 0) -> None:
    path = paths.rank_log(attempt, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write(text)


def training_log(lines: int, seed: int = 0) -> str:
    """What a training script prints: noisy losses with 4 decimals, an accuracy, steps, epochs."""
    rnd = random.Random(seed)
    return "".join(f"epoch {i // 1000} step {i} loss={2.5 * math.exp(-i / 4000) + 0.1 * rnd.random():.4f} "
                   f"acc={min(1.0, i / 5000 + 0.05 * rnd.random()):.4f} lr=0.001\n" for i in range(lines))


def legacy_copy(paths: JobPaths, records: list[dict], attempt: int = 0, rank: int = 0) -> None:
    """The same records as an older phalanx wrote them: metrics.jsonl, no metrics.bin."""
    paths.rank_metrics(attempt, rank).unlink()
    paths.rank_metrics_jsonl(attempt, rank).write_text("".join(json.dumps(r) + "\n" for r in records))


def test_records_read_back_in_printed_order_with_steps_epochs_and_gaps(paths):
    log(paths, "loss=0.5 acc=0.1\nstep 3 loss=0.4\nepoch 2 acc=0.2 loss=0.3\nstep 99999999999999999999999 loss=0.2\n")
    assert MetricsCollector(paths, 0).poll() == 6
    got = [(r["name"], r["value"], r["step"], r["epoch"]) for r in read_metrics(paths)]
    assert got == [("loss", 0.5, None, None), ("acc", 0.1, None, None), ("loss", 0.4, 3, None),
                   ("acc", 0.2, 3, 2), ("loss", 0.3, 3, 2), ("loss", 0.2, None, 2)]  # a step past 64 bits is none


def test_a_file_is_a_fraction_of_its_log_and_series_are_exact(paths):
    text = training_log(20000)
    log(paths, text)
    MetricsCollector(paths, 0, [parse_metric("loss=loss=([0-9.]+)")]).poll(final=True)
    size, log_size = paths.rank_metrics(0, 0).stat().st_size, paths.rank_log(0, 0).stat().st_size
    assert size < 0.25 * log_size, (size, log_size)
    series = rank_series(paths, 0, 0)
    assert list(series) == ["loss", "acc", "lr"]
    printed = [float(line.split("loss=")[1].split()[0]) for line in text.splitlines()]
    assert list(series["loss"].values) == printed
    assert list(series["loss"].steps) == list(range(20000))
    assert list(series["acc"].epochs) == [i // 1000 for i in range(20000)]


def test_older_jsonl_files_read_the_same_everywhere(paths):
    log(paths, "step=1 loss=0.9 acc=0.1\nstep=2 loss=0.5\nloss=0.7\n")
    MetricsCollector(paths, 0).poll()
    records = read_metrics(paths)

    job_paths = paths

    class Record:  # what the report reads of a JobRecord (``paths``: its job directory)
        id, job_dir, nnodes, nproc_per_node, attempt, paths = "abc", str(job_paths.root), 1, 1, 0, job_paths

    report, status = metrics_report(Record()), status_summary_lines(Record())
    exported = io.StringIO()
    export_jsonl(paths, exported)
    legacy_copy(paths, records)
    assert read_metrics(paths) == records
    assert metrics_report(Record()) == report and status_summary_lines(Record()) == status
    assert report["metrics"]["loss"] == {"last": 0.7, "min": 0.5, "max": 0.9, "count": 3, "last_step": 2,
                                         "sparkline": report["metrics"]["loss"]["sparkline"]}
    assert recent_metrics(paths, 0) == records
    assert read_since(paths, 0, 0, 0, ["acc"])[0] == [r for r in records if r["name"] == "acc"]
    again = io.StringIO()
    export_jsonl(paths, again)
    assert again.getvalue() == exported.getvalue()
    assert [json.loads(line) for line in exported.getvalue().splitlines()] == records


def test_the_dashboard_charts_both_formats_alike(paths):
    pytest.importorskip("starlette")
    from phalanx.web import series as data  # the dashboard's chart data (web/series.py)

    log(paths, "val=3\nstep=1 loss=0.9\nstep=2 loss=0.5\n")
    MetricsCollector(paths, 0).poll()

    job = paths

    class Record:  # what the dashboard reads of a JobRecord (``paths``: its job directory)
        id, job_dir, nnodes, nproc_per_node, attempt, paths = "abc", str(job.root), 1, 1, 0, job

    chart = data.metric_series(Record())
    assert chart["metrics"]["loss"][0]["x"] == [1.0, 2.0] and chart["metrics"]["loss"][0]["y"] == [0.9, 0.5]
    assert chart["metrics"]["val"][0]["x_kind"] == "index"
    legacy_copy(paths, read_metrics(paths))
    data._cache.clear()
    assert data.metric_series(Record()) == chart


def test_incremental_reads_follow_the_file(paths):
    c = MetricsCollector(paths, 0)
    log(paths, "step=1 loss=1\n")
    c.poll()
    got, offset = read_since(paths, 0, 0)
    assert [r["value"] for r in got] == [1.0]
    log(paths, "step=2 loss=2 acc=5\n")
    c.poll()
    got, offset = read_since(paths, 0, 0, offset, ["loss"])
    assert [r["value"] for r in got] == [2.0]
    assert read_since(paths, 0, 0, offset) == ([], offset)


def test_blocks_being_written_or_torn_are_never_data(paths):
    path = paths.rank_metrics(0, 0)
    path.parent.mkdir(parents=True)
    blocks = [encode_block(float(t), {"loss": Columns(values=_d([t]), steps=_q([t]), epochs=_q([NONE]), seq=_i([0]))})
              for t in range(3)]
    path.write_bytes(blocks[0] + blocks[1][:-7])  # the second block is still being written
    found, offset = read_blocks(path)
    assert [b.time for b in found] == [0.0] and offset == len(blocks[0])
    assert [b.time for b in tail_blocks(path, 1 << 16)] == [0.0]
    path.write_bytes(blocks[0] + blocks[1][:-7] + blocks[2])  # it never completed (a full disk), the next did
    assert [b.time for b in read_blocks(path)[0]] == [0.0, 2.0]
    flipped = bytearray(blocks[0])
    flipped[20] ^= 0xFF  # a damaged body fails its CRC
    path.write_bytes(bytes(flipped) + blocks[1])
    assert [b.time for b in read_blocks(path)[0]] == [1.0]
    assert [b.time for b in read_blocks(path, len(blocks[0]))[0]] == [1.0]


def test_recent_records_come_from_the_last_blocks(paths):
    c = MetricsCollector(paths, 0)
    for step in range(50):
        log(paths, f"step={step} loss={step}\n")
        c.poll()
    recent = recent_records(paths, 0, 0, 200)
    assert recent and recent[-1]["step"] == 49 and len(recent) < 50
    assert [r["step"] for r in recent] == list(range(50 - len(recent), 50))


def test_a_new_collector_replaces_what_an_earlier_one_left(paths):
    log(paths, "step=1 loss=1\n")
    MetricsCollector(paths, 0).poll()
    paths.rank_metrics_jsonl(0, 0).write_text('{"name": "loss", "value": 9, "step": 1}\n')
    MetricsCollector(paths, 0).poll()  # a supervisor that re-attaches reads the output again
    assert [r["value"] for r in read_metrics(paths)] == [1.0]
    assert not paths.rank_metrics_jsonl(0, 0).exists()


def test_a_write_that_fails_leaves_no_torn_block(paths, tmp_path):
    """A real failed write (file size limit, as on a full disk): the file is cut back to its
    last complete block, and the next poll appends cleanly."""
    log(paths, "step=1 loss=1\n")
    program = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from phalanx.core.paths import JobPaths\n"
        "from phalanx.monitor.metrics import MetricsCollector\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "paths = JobPaths(Path(sys.argv[1]))\n"
        "c = MetricsCollector(paths, 0)\n"
        "c.poll()\n"
        "size = paths.rank_metrics(0, 0).stat().st_size\n"
        "with open(paths.rank_log(0, 0), 'a') as fh:\n"
        "    fh.write(''.join(f'step={i} loss={i * 0.37 % 1:.6f} x{i}=1\\n' for i in range(20000)))\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    c.poll()\n"
        "except OSError as exc:\n"
        "    print('failed', exc.errno, paths.rank_metrics(0, 0).stat().st_size == size)\n"
    )
    out = subprocess.run([sys.executable, "-c", program, str(paths.root)], capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[0] == "failed" and out.stdout.split()[-1] == "True", out.stdout + out.stderr
    assert [r["value"] for r in read_metrics(paths)] == [1.0]


def test_json_export_covers_every_rank(paths):
    log(paths, "step=1 loss=0.5\n", rank=0)
    log(paths, "step=1 loss=0.6\n", rank=1)
    MetricsCollector(paths, 0).poll()
    out = io.StringIO()
    assert export_jsonl(paths, out) == 2
    assert [(r["rank"], r["value"]) for r in map(json.loads, out.getvalue().splitlines())] == [(0, 0.5), (1, 0.6)]
    assert read_series(paths.rank_metrics(0, 1))[0]["loss"].values.tolist() == [0.6]


def _d(v):
    from array import array

    return array("d", [float(x) for x in v])


def _q(v):
    from array import array

    return array("q", v)


def _i(v):
    from array import array

    return array("I", v)


def test_block_layout_is_little_endian_and_self_describing():
    block = encode_block(1.5, {"a": Columns(values=_d([2.0]), steps=_q([7]), epochs=_q([NONE]), seq=_i([0]))})
    magic, flags, size, _crc = struct.unpack_from("<4sBII", block)
    assert magic == b"PXM1" and flags == 0 and len(block) == 13 + size + 4
    assert struct.unpack_from("<d", block, 13)[0] == 1.5
