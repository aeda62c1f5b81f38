"""SageMaker: the overhead phalanx adds on top of the platform, against the fake control plane
(tests/cluster/sagemaker_fake.py: our reading of the docs) and moto S3 + CloudWatch Logs.

1. submit -> CreateTrainingJob: from the command's start to the plane receiving the request.
   phalanx: `phalanx run -d --backend sagemaker ... first_line.py` (checks, bundle, upload, request).
   by hand: a Python script that uploads a tar.gz of the same code with boto3 and sends the same
   CreateTrainingJob request (taken from phalanx's --dry-run, its command replaced by a plain
   `python3 script.py`), which is what a user without phalanx would write.
2. instance start -> first rank line: from the plane starting the container's command to the script's
   first line (one instance, one process). phalanx: bundle unpack + in-container entry + node agent +
   bootstrap; by hand: `python3 script.py` straight from the code channel.
3. an unchanged 100 MB local input uploaded the second time (content digest cached by size and
   mtime, one HEAD request) vs the first time.

Needs root (network namespaces). `.venv/bin/python bench/bench_sagemaker.py [--repeats 3]`
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.cluster import netns  # noqa: E402
from tests.cluster.sagemaker_fake import FakeSageMaker  # noqa: E402

ROLE = "arn:aws:iam::123456789012:role/sm"
SCRIPT = "import time\nprint(f'first t={time.time():.6f}', flush=True)\n"
HAND = '''
import json, sys, time, boto3
start = float(sys.argv[1]); request = json.loads(open(sys.argv[2]).read())
s3 = boto3.client("s3")
s3.upload_file(sys.argv[3], sys.argv[4], sys.argv[5])
boto3.client("sagemaker").create_training_job(**request)
'''


def moto(tmp: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    exe = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=open(tmp / "moto.log", "wb"), stderr=subprocess.STDOUT)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}"


def wait_done(plane: FakeSageMaker, name: str) -> None:
    while True:
        job = plane.jobs.get(name)
        if job is not None and job.status in ("Completed", "Failed", "Stopped"):
            return
        time.sleep(0.1)


def first_line(inst) -> float:
    text = inst.log.read_text()
    return float(re.search(r"first t=([0-9.]+)", text).group(1))


def run_phalanx(plane, env, tmp: Path, code: Path, n: int) -> tuple[float, float, str]:
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "phalanx", "run", "--backend", "sagemaker", "--role", ROLE, "--image", "local/x:1",
                           "--s3-prefix", f"s3://bench/p{n}", "-d", "--json", "--name", f"first{n}", "first.py"],
                          cwd=code, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    name = f"phx-{json.loads(proc.stdout)['id']}-a0"
    wait_done(plane, name)
    job = plane.jobs[name]
    inst = plane.history(name)[0]
    return job.created - start, first_line(inst) - inst.spawned, name


def run_hand(plane, env, tmp: Path, code: Path, template: dict, n: int) -> tuple[float, float]:
    request = json.loads(json.dumps(template))
    request["TrainingJobName"] = f"hand-{n}-{os.getpid()}"
    request["InputDataConfig"] = [{"ChannelName": "code", "DataSource": {"S3DataSource": {
        "S3DataType": "S3Prefix", "S3Uri": f"s3://bench/hand{n}/", "S3DataDistributionType": "FullyReplicated"}}}]
    request["AlgorithmSpecification"]["ContainerArguments"] = [
        'R="${PHALANX_SM_ROOT:-}";cd "$R/opt/ml/input/data/code"&&tar -xzf code.tar.gz&&exec python3 first.py']
    (tmp / "request.json").write_text(json.dumps(request))
    with tarfile.open(tmp / "code.tar.gz", "w:gz") as tar:
        tar.add(code / "first.py", arcname="first.py")
    start = time.time()
    subprocess.run([sys.executable, "-c", HAND, str(start), str(tmp / "request.json"), str(tmp / "code.tar.gz"), "bench",
                    f"hand{n}/code.tar.gz"], env=env, check=True, timeout=300)
    wait_done(plane, request["TrainingJobName"])
    inst = plane.history(request["TrainingJobName"])[0]
    return plane.jobs[request["TrainingJobName"]].created - start, first_line(inst) - inst.spawned


def upload_twice(env: dict, tmp: Path) -> tuple[float, float]:
    os.environ.update(env)
    from phalanx.backends.sagemaker.client import Aws
    from phalanx.backends.sagemaker.layout import JobS3
    from phalanx.backends.sagemaker.uploads import local_digest, upload_channel
    from phalanx.core.paths import HomePaths

    data = tmp / "big"
    data.mkdir()
    (data / "blob.bin").write_bytes(os.urandom(100 << 20))
    home, s3, aws = HomePaths(tmp / "uphome"), JobS3("s3://bench/up", "b"), Aws("us-east-1")
    times = []
    for _ in range(2):
        start = time.perf_counter()
        upload_channel(aws, s3, "big", str(data), local_digest(str(data), home.sagemaker_digests, remember=True), lambda _: None)
        times.append(time.perf_counter() - start)
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sm-"))
    server, url = moto(tmp)
    network = netns.create(1)
    plane = FakeSageMaker(tmp / "plane", network, url, [str(Path(sys.executable).parent)], stop_timeout=5, step=0.0)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, "AWS_ENDPOINT_URL": url,
           "AWS_ENDPOINT_URL_SAGEMAKER": plane.url, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "PHALANX_HOME": str(tmp / "home"), "PHALANX_SM_DESCRIBE_EVERY": "0.5", "PHALANX_SM_LOGS_EVERY": "0.5"}
    try:
        import boto3

        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
                     aws_secret_access_key="test").create_bucket(Bucket="bench")
        code = tmp / "code"
        code.mkdir()
        (code / "first.py").write_text(SCRIPT)
        submit = {"phalanx": [], "hand": []}
        start = {"phalanx": [], "hand": []}
        template = None
        for n in range(args.repeats):
            s, f, name = run_phalanx(plane, env, tmp, code, n)
            submit["phalanx"].append(s)
            start["phalanx"].append(f)
            template = template or plane.jobs[name].request
            s, f = run_hand(plane, env, tmp, code, template, n)
            submit["hand"].append(s)
            start["hand"].append(f)
        first, second = upload_twice(env, tmp)
        med = {k: {w: statistics.median(v) for w, v in d.items()} for k, d in (("submit", submit), ("start", start))}
        print(f"{'measure':<40} {'phalanx':>9} {'by hand':>9} {'ratio':>7}")
        for key, label in (("submit", "submit -> CreateTrainingJob (s)"), ("start", "instance start -> first rank line (s)")):
            print(f"{label:<40} {med[key]['phalanx']:>9.3f} {med[key]['hand']:>9.3f} {med[key]['phalanx'] / med[key]['hand']:>7.2f}")
        print(f"{'100 MB local input, upload (s)':<40} {second:>9.3f} {first:>9.3f} {second / first:>7.3f}   (second time vs first)")
        print(f"repeats {args.repeats}; medians; raw: {json.dumps({'submit': submit, 'start': start})}")
    finally:
        plane.close()
        netns.destroy(network)
        server.terminate()
        server.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
