"""Throughput of phalanx's data transfers against direct copies, against one S3-compatible server.

    .venv/bin/python bench/bench_data.py [--mb 200] [--repeats 3] [--files 1] [--json OUT]

Starts ``moto_server`` on 127.0.0.1, creates a channel of ``--mb`` MB (one file, or ``--files``
files of equal size) and an output of the same size, then times, round-robin:

- download: phalanx staging an input channel (cold cache) | s3fs ``fs.get(recursive=True)`` |
  boto3 ``download_file`` (s3transfer, what ``aws s3 cp`` runs) | the ``aws s3 cp --recursive``
  CLI when it is installed; plus phalanx staging again with a warm cache;
- upload: phalanx uploading a job's outputs and logs (with the sha256 manifest) |
  s3fs ``fs.put(recursive=True)`` | boto3 ``upload_file`` | ``aws s3 cp --recursive``.

Each round runs the contenders in a rotated order. Every contender runs in its own process (the same interpreter), so none profits from another's
connection pool or warmed imports; the time includes that process's start-up, measured
separately and reported. Ratios are medians against s3fs. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
BUCKET = "bench"

# Each contender is a small program run as ``python -c``; argv: src dst. Prints nothing.
PROGRAMS = {
    "phalanx stage (cold cache)": """
import sys
from pathlib import Path
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Channel, Entrypoint, EntrypointKind, JobSpec
from phalanx.storage.channels import stage
spec = JobSpec(Entrypoint(EntrypointKind.COMMAND, "true"), channels=(Channel("data", sys.argv[1], sys.argv[1]),))
stage(HomePaths(Path(sys.argv[2]) / "phalanx"), spec, lambda s: None)
""",
    "phalanx stage (warm cache)": """
import sys
from pathlib import Path
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Channel, Entrypoint, EntrypointKind, JobSpec
from phalanx.storage.channels import stage
spec = JobSpec(Entrypoint(EntrypointKind.COMMAND, "true"), channels=(Channel("data", sys.argv[1], sys.argv[1]),))
stage(HomePaths(Path(sys.argv[2]) / "phalanx"), spec, lambda s: None)
""",
    "s3fs get": """
import sys, s3fs
s3fs.S3FileSystem().get(sys.argv[1], sys.argv[2] + "/s3fs/", recursive=True)
""",
    "boto3 download_file": """
import os, sys, boto3
bucket, _, prefix = sys.argv[1][5:].partition("/")
s3 = boto3.client("s3")
for obj in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]:
    dst = os.path.join(sys.argv[2], "boto3", obj["Key"])
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    s3.download_file(bucket, obj["Key"], dst)
""",
    "phalanx upload outputs": """
import sys
from pathlib import Path
from phalanx.core.paths import JobPaths
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec
from phalanx.storage.outputs import upload_job
spec = JobSpec(Entrypoint(EntrypointKind.COMMAND, "true"), name="bench", output_uri=sys.argv[2])
problem = upload_job(spec, JobPaths(Path(sys.argv[1])), "job0", lambda s: None)
assert problem is None, problem
""",
    "s3fs put": """
import sys, s3fs
s3fs.S3FileSystem().put(sys.argv[1], sys.argv[2] + "/s3fs", recursive=True)
""",
    "boto3 upload_file": """
import os, sys, boto3
bucket, _, prefix = sys.argv[2][5:].partition("/")
s3 = boto3.client("s3")
for dirpath, _, files in os.walk(sys.argv[1]):
    for name in files:
        path = os.path.join(dirpath, name)
        s3.upload_file(path, bucket, f"{prefix}/boto/{os.path.relpath(path, sys.argv[1])}")
""",
    "python start-up (imports)": """
import s3fs, boto3, phalanx.storage.channels, phalanx.storage.outputs
""",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto(workdir: Path) -> tuple[subprocess.Popen, str]:
    exe = shutil.which("moto_server") or str(Path(PY).parent / "moto_server")
    port = free_port()
    log = open(workdir / "moto.log", "wb")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("moto_server did not start")


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, cwd=ROOT)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed: {argv[:3]}...\n{proc.stdout.decode()}{proc.stderr.decode()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200, help="size of the channel and of the output (MB)")
    parser.add_argument("--files", type=int, default=1, help="split the data into this many files")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write every sample here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="phx-bench-data-"))
    moto, url = start_moto(work)
    env = {**os.environ, "AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_DEFAULT_REGION": "us-east-1", "PYTHONPATH": str(ROOT / "src")}
    aws = shutil.which("aws")
    try:
        # The data: one job directory whose output is --mb MB, uploaded once as the channel too.
        job = work / "job"
        out = job / "output"
        out.mkdir(parents=True)
        size = args.mb * 1_000_000 // args.files
        for i in range(args.files):
            with open(out / f"part-{i:04d}.bin", "wb") as fh:
                fh.write(os.urandom(size))
        (job / "attempt_0" / "rank_0").mkdir(parents=True)
        (job / "attempt_0" / "rank_0" / "output.log").write_text("a log line\n" * 100)
        channel = f"s3://{BUCKET}/channel"
        setup = (f"import s3fs; fs = s3fs.S3FileSystem(); fs.mkdir('{BUCKET}'); "
                 f"fs.put('{out}', '{channel[5:]}', recursive=True)")
        subprocess.run([PY, "-c", setup], env=env, check=True)

        down = {label: [PY, "-c", PROGRAMS[label], channel, str(work / "dl")]
                for label in ("phalanx stage (cold cache)", "phalanx stage (warm cache)", "boto3 download_file", "s3fs get")}
        up = {label: [PY, "-c", PROGRAMS[label], str(job) if label.startswith("phalanx") else str(out), f"s3://{BUCKET}/up"]
              for label in ("phalanx upload outputs", "boto3 upload_file", "s3fs put")}
        if aws:
            down["aws s3 cp"] = [aws, "s3", "cp", "--quiet", "--recursive", channel, str(work / "dl" / "aws")]
            up["aws s3 cp"] = [aws, "s3", "cp", "--quiet", "--recursive", str(out), f"s3://{BUCKET}/up/aws"]
        # s3fs last: the baseline of each group
        down = {k: down[k] for k in sorted(down, key=lambda k: k == "s3fs get")}
        up = {k: up[k] for k in sorted(up, key=lambda k: k == "s3fs put")}
        startup = [PY, "-c", PROGRAMS["python start-up (imports)"]]

        samples: dict[str, list[float]] = {}
        for rnd in range(args.repeats + 1):  # round 0 warms caches (page cache, moto)
            for group in (down, up):
                labels = list(group)
                if rnd:  # rotate the order each round: no contender always follows the same one
                    shift = rnd % len(labels)
                    labels = labels[shift:] + labels[:shift]
                    if "phalanx stage (warm cache)" in labels:  # warm right after cold
                        labels.remove("phalanx stage (warm cache)")
                        labels.insert(labels.index("phalanx stage (cold cache)") + 1, "phalanx stage (warm cache)")
                for label in labels:
                    argv = group[label]
                    if group is down and label != "phalanx stage (warm cache)":  # untimed: a cold start
                        gone = work / "dl" / label.split()[0]
                        shutil.rmtree(gone / "cache" if label.startswith("phalanx") else gone, ignore_errors=True)
                    elapsed = timed(argv, env)
                    if rnd:
                        samples.setdefault(f"{id(group)}:{label}", []).append(elapsed)
            elapsed = timed(startup, env)
            if rnd:
                samples.setdefault("python start-up (imports)", []).append(elapsed)
            print(f"round {rnd}/{args.repeats}" + (" (warm-up)" if rnd == 0 else ""), file=sys.stderr)

        rows = []
        for group, base in ((down, "s3fs get"), (up, "s3fs put")):
            for label in group:
                got = samples[f"{id(group)}:{label}"]
                med = statistics.median(got)
                rows.append({"group": "download" if group is down else "upload", "command": label, "median_s": med,
                             "min_s": min(got), "MB_per_s": args.mb / med,
                             "ratio": med / statistics.median(samples[f"{id(group)}:{base}"]), "samples_s": got})
        start_med = statistics.median(samples["python start-up (imports)"])
        print(f"\n{args.mb} MB in {args.files} file(s), {args.repeats} rounds, moto_server on 127.0.0.1; "
              f"{platform.python_version()}, {os.cpu_count()} CPUs; python start-up + imports {start_med:.2f}s (included)\n")
        print(f"{'group':<9} {'command':<28} {'median s':>8} {'min s':>7} {'MB/s':>7} {'ratio':>6}")
        for r in rows:
            print(f"{r['group']:<9} {r['command']:<28} {r['median_s']:8.2f} {r['min_s']:7.2f} {r['MB_per_s']:7.1f} {r['ratio']:6.2f}")
        if args.json:
            Path(args.json).write_text(json.dumps({"mb": args.mb, "files": args.files, "rows": rows,
                                                   "startup_s": start_med}, indent=2))
    finally:
        moto.terminate()
        moto.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
