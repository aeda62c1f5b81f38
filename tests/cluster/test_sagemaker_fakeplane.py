"""SageMaker end to end against the FAKE control plane (``sagemaker_fake.py``: our reading of the
documentation, not SageMaker), moto in server mode for S3 and CloudWatch Logs, and instances run
for real as processes in network namespaces (hostnames algo-1..N, a private /opt/ml each).

What is real here: phalanx's CLI, its boto3 client and requests (strictly validated by the fake),
the bundle and its unpacking by the container command, the in-container entry, torchrun and a
gloo DDP training across two "instances", S3 and CloudWatch Logs (moto), checkpoints restored and
synced. What is not: SageMaker itself.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from tests.conftest import EXAMPLES, ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROLE = "arn:aws:iam::123456789012:role/sm"
PROBE = '''
import json, os, socket, sys
try:
    import psutil  # noqa: F401 - not in a framework image (the plane's python3 blocks it)
    image_like = False
except ImportError:
    image_like = True
data = os.environ["SM_CHANNEL_DATA"]
print("probe " + json.dumps({"host": socket.gethostname(), "rank": os.environ.get("RANK"), "hosts": os.environ["SM_HOSTS"],
      "current": os.environ["SM_CURRENT_HOST"], "state": os.environ["PHALANX_STATE_DIR"], "data": sorted(os.listdir(data)),
      "gpus": os.environ.get("SM_NUM_GPUS"), "ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "argv": sys.argv[1:],
      "channel": open(os.path.join(data, "a.txt")).read().strip(), "image_like": image_like}), flush=True)
if os.environ.get("RANK") == "1":
    raise RuntimeError("rank one gives up: " + sys.argv[-1])
'''


def image_python(root: Path) -> Path:
    """A directory with the ``python3`` of a framework image: this venv's Python (it has torch),
    but without what AWS's images lack and phalanx's own CLI needs (psutil, yaml, typer, rich,
    boto3): importing those fails on the instances, as it would there."""
    blocked = root / "blocked"
    blocked.mkdir()
    for name in ("psutil", "yaml", "typer", "rich", "boto3", "botocore"):
        (blocked / f"{name}.py").write_text(f"raise ImportError('{name} is not in the training image')\n")
    shim = root / "bin"
    shim.mkdir()
    (shim / "python3").write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{blocked}" exec {sys.executable} "$@"\n')
    (shim / "python3").chmod(0o755)
    return shim


@pytest.fixture(scope="module")
def plane(tmp_path_factory, s3_server):
    from tests.cluster import netns
    from tests.cluster.sagemaker_fake import FakeSageMaker

    try:
        network = netns.create(2)
    except (netns.Unavailable, OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot run instances in network namespaces here (needs root and iproute2): {exc}")
    fake = None
    try:
        fake = FakeSageMaker(tmp_path_factory.mktemp("sm-plane"), network, s3_server,
                             [str(image_python(tmp_path_factory.mktemp("image")))], stop_timeout=10.0, step=0.2)
        yield fake
    finally:
        if fake is not None:
            fake.close()
        netns.destroy(network)


@pytest.fixture
def aws(plane, s3_server, phx_home, tmp_path):
    """The environment phalanx runs in: standard AWS configuration pointing at moto and the fake."""
    env = {
        "AWS_ENDPOINT_URL": s3_server, "AWS_ENDPOINT_URL_SAGEMAKER": plane.url, "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "nocfg"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "nocred"), "PHALANX_SM_DESCRIBE_EVERY": "0.5",
        "PHALANX_SM_LOGS_EVERY": "0.5", "PHALANX_HOME": str(phx_home),
    }
    bucket = f"phx-sm-{os.getpid()}-{time.monotonic_ns()}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").create_bucket(Bucket=bucket)
    return env, bucket


def _phalanx(env, *args, timeout=300, cwd=ROOT):
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **env}
    return subprocess.run([sys.executable, "-m", "phalanx", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full)


def _sm(plane):
    return boto3.client("sagemaker", endpoint_url=plane.url, region_name="us-east-1", aws_access_key_id="test",
                        aws_secret_access_key="test")


def _run_args(bucket, *more):
    return ["run", "--backend", "sagemaker", "--role", ROLE, "--instance-type", "ml.c5.xlarge",
            "--s3-prefix", f"s3://{bucket}/phx", "--image", "local/fake:1", *more]


def _job_dir(env, job_id):
    return Path(env["PHALANX_HOME"]) / "jobs" / job_id


def _job_id(proc):
    return json.loads(proc.stdout)["id"]


def test_sagemaker_fakeplane_speaks_the_wire_protocol(plane, aws):
    """The fake itself, through the real boto3 client: statuses, failure reason, names, logs."""
    env, bucket = aws
    sm = _sm(plane)
    request = {
        "TrainingJobName": "phx-proto-a0", "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": "local/fake:1", "TrainingInputMode": "File",
                                   "ContainerEntrypoint": ["/bin/bash", "-c"],
                                   "ContainerArguments": ['echo "hello from $(hostname)"; echo "bad thing" > "$PHALANX_SM_ROOT/opt/ml/output/failure"; exit 3']},
        "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/out"},
        "ResourceConfig": {"InstanceType": "ml.c5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
    }
    sm.create_training_job(**request)
    with pytest.raises(sm.exceptions.ResourceInUse):
        sm.create_training_job(**request)
    with pytest.raises(sm.exceptions.ClientError, match="ValidationException"):
        sm.create_training_job(**{**request, "TrainingJobName": "bad_name"})
    with pytest.raises(sm.exceptions.ClientError, match="Requested resource not found"):
        sm.describe_training_job(TrainingJobName="phx-nope-a0")
    deadline = time.monotonic() + 120
    while (found := sm.describe_training_job(TrainingJobName="phx-proto-a0"))["TrainingJobStatus"] == "InProgress":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert (found["TrainingJobStatus"], found["SecondaryStatus"], found["FailureReason"]) == ("Failed", "Failed", "bad thing\n")
    assert [t["Status"] for t in found["SecondaryStatusTransitions"]] == ["Starting", "Downloading", "Training", "Failed"]
    with pytest.raises(sm.exceptions.ClientError, match="not in InProgress"):
        sm.stop_training_job(TrainingJobName="phx-proto-a0")
    assert "phx-proto-a0" in [s["TrainingJobName"] for s in sm.list_training_jobs(NameContains="proto")["TrainingJobSummaries"]]
    logs = boto3.client("logs", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test")
    streams = logs.describe_log_streams(logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix="phx-proto-a0/")["logStreams"]
    assert len(streams) == 1 and streams[0]["logStreamName"].split("/")[1].startswith("algo-1-")
    events = logs.get_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=streams[0]["logStreamName"], startFromHead=True)
    assert [e["message"] for e in events["events"]] == ["hello from algo-1"]


def test_sagemaker_fakeplane_two_instance_ddp_training(plane, aws):
    """A real 2-instance gloo DDP training: rank logs and metrics per rank here, the checkpoint in
    S3, the model archive back in the job's outputs, SageMaker's status recorded."""
    env, bucket = aws
    proc = _phalanx(env, *_run_args(bucket, "-n", "2x1", "--metric", "loss=loss=([0-9.]+)", "--json", "--workdir", str(EXAMPLES),
                                    str(EXAMPLES / "train_ddp.py"), "--epochs", "1", "--steps-per-epoch", "6", "--checkpoint-every", "3"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(proc.stdout[proc.stdout.index("{\n"):])
    job = _job_dir(env, record["id"])
    assert "epoch=1 step=6 loss=" in (job / "attempt_0" / "rank_0" / "output.log").read_text()  # rank 0 prints
    for rank in (0, 1):
        assert json.loads((job / "attempt_0" / f"rank_{rank}" / "proc.json").read_text())["host"] == f"algo-{rank + 1}"
    from phalanx.core.paths import JobPaths
    from phalanx.monitor.readback import read_metrics

    metrics = read_metrics(JobPaths(job), 0, 0)  # metrics.bin (monitor/metricfile.py)
    assert any(m.get("name") == "loss" or "loss" in m for m in metrics)
    assert (job / "output" / "model.pt").is_file()  # model.tar.gz, merged from both instances, unpacked
    scheduler = json.loads((job / "attempt_0" / "scheduler.json").read_text())
    assert (scheduler["job_id"], scheduler["status"], scheduler["secondary"]) == (f"phx-{record['id']}-a0", "Completed", "Completed")
    assert scheduler["billable_seconds"] >= 1 and scheduler["instance_count"] == 2
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="phx/state/train_ddp/").get("Contents", [])]
    assert keys == ["phx/state/train_ddp/checkpoint.pt"]
    status = _phalanx(env, "status", record["id"])
    assert "Completed" in status.stdout and "instance-hours" in status.stdout, status.stdout
    fetched = _phalanx(env, "download", record["id"], "-o", str(job.parent.parent / "fetched"))
    assert fetched.returncode == 0 and (job.parent.parent / "fetched" / "output" / "model.pt").is_file(), fetched.stdout


def test_sagemaker_fakeplane_entry_environment_failure_and_unchanged_input(plane, aws, tmp_path):
    """The in-container entry: what the script sees (channels, hosts, state dir, args); a rank
    that raises fails the job with SageMaker's FailureReason naming it; the same local input is
    uploaded once."""
    env, bucket = aws
    (tmp_path / "probe.py").write_text(PROBE)
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("channel bytes\n")
    args = _run_args(bucket, "-n", "2x1", "--input", f"data={data}", "--json", "probe.py", "--tag", "{node_rank}")
    first = _phalanx(env, *args, cwd=tmp_path)
    assert first.returncode == 1, first.stderr[-3000:]
    record = json.loads(first.stdout[first.stdout.index("{\n"):])
    job = _job_dir(env, record["id"])
    seen = {}
    for rank in (0, 1):
        line = next(l for l in (job / "attempt_0" / f"rank_{rank}" / "output.log").read_text().splitlines() if l.startswith("probe "))
        seen[rank] = json.loads(line[len("probe "):])
    for rank, probe in seen.items():
        assert probe["host"] == probe["current"] == f"algo-{rank + 1}"
        assert json.loads(probe["hosts"]) == ["algo-1", "algo-2"]
        assert probe["state"].endswith("/opt/ml/checkpoints") and probe["channel"] == "channel bytes"
        assert probe["data"] == ["a.txt"] and probe["gpus"] == "0" and probe["ifname"] == "eth0"
        # {node_rank}-style placeholders are filled in per node wherever phalanx starts each node's
        # processes (docs/environment.md), on SageMaker as here.
        assert probe["argv"] == ["--tag", str(rank)] and probe["image_like"] is True
    cause = record["root_cause"] if isinstance(record.get("root_cause"), dict) else json.loads(record["root_cause"])
    assert cause["rank"] == 1 and "rank one gives up" in cause["message"]
    scheduler = json.loads((job / "attempt_0" / "scheduler.json").read_text())
    assert scheduler["status"] == "Failed" and scheduler["failure_reason"].startswith("rank 1 on node 1 (algo-2) failed: RuntimeError: rank one gives up")
    assert "uploading input 'data'" in (job / "attempt_0" / "node_0" / "agent.log").read_text()
    second = _phalanx(env, *args, cwd=tmp_path)
    job2 = _job_dir(env, json.loads(second.stdout[second.stdout.index("{\n"):])["id"])
    assert "uploading input 'data'" not in (job2 / "attempt_0" / "node_0" / "agent.log").read_text()


def test_sagemaker_fakeplane_spot_interruption_resumes_from_checkpoint(plane, aws):
    env, bucket = aws
    proc = _phalanx(env, *_run_args(bucket, "-n", "2x1", "--spot", "--max-run", "600", "-d", "--json", "--workdir", str(EXAMPLES),
                                    "--name", "spotty", str(EXAMPLES / "train_ddp.py"), "--epochs", "1", "--steps-per-epoch", "40",
                                    "--checkpoint-every", "2", "--sleep", "0.25"))
    assert proc.returncode == 0, proc.stderr
    job_id = _job_id(proc)
    job, name = _job_dir(env, job_id), f"phx-{job_id}-a0"
    log = job / "attempt_0" / "rank_0" / "output.log"
    deadline = time.monotonic() + 240
    while "step=6 " not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, (job / "attempt_0" / "node_0" / "agent.log").read_text()
        time.sleep(0.5)
    plane.interrupt(name)
    done = _phalanx(env, "wait", job_id, "--timeout", "300", timeout=330)
    assert done.returncode == 0, done.stdout + done.stderr
    text = log.read_text()
    resumed = [int(l.split("resumed from step=")[1]) for l in text.splitlines() if "resumed from step=" in l]
    assert resumed and resumed[-1] >= 6, text[-2000:]
    assert "epoch=1 step=40 loss=" in text
    found = _sm(plane).describe_training_job(TrainingJobName=name)
    steps = [t["Status"] for t in found["SecondaryStatusTransitions"]]
    assert steps[:4] == ["Starting", "Downloading", "Training", "Interrupted"] and steps[-1] == "Completed"
    assert found["TrainingJobStatus"] == "Completed"


def test_sagemaker_fakeplane_stop_is_stoptrainingjob(plane, aws):
    env, bucket = aws
    proc = _phalanx(env, *_run_args(bucket, "-n", "2x1", "-d", "--json", "--workdir", str(EXAMPLES), "--grace", "300",
                                    str(EXAMPLES / "train_ddp.py"), "--epochs", "1", "--steps-per-epoch", "500", "--sleep", "0.2"))
    assert proc.returncode == 0, proc.stderr
    job_id = _job_id(proc)
    job = _job_dir(env, job_id)
    log = job / "attempt_0" / "rank_0" / "output.log"
    deadline = time.monotonic() + 240
    while "step=3 " not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    ps = _phalanx(env, "ps")
    assert "RUNNING (Training)" in next(line for line in ps.stdout.splitlines() if line.startswith(job_id)), ps.stdout
    stopped = _phalanx(env, "stop", job_id, timeout=500)  # the default bound: --grace (capped) + 360 s
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "checkpoint saved" in log.read_text()  # the ranks got SIGTERM and their grace
    found = _sm(plane).describe_training_job(TrainingJobName=f"phx-{job_id}-a0")
    assert (found["TrainingJobStatus"], found["SecondaryStatus"]) == ("Stopped", "Stopped")
    assert "capped to 110 s" in (job / "attempt_0" / "node_0" / "agent.log").read_text()
    status = _phalanx(env, "status", job_id)
    assert "CANCELLED" in status.stdout.upper(), status.stdout


@pytest.mark.parametrize("what", ["missing input", "missing bucket"])
def test_sagemaker_fakeplane_bad_input_creates_nothing(plane, aws, tmp_path, what):
    env, bucket = aws
    (tmp_path / "t.py").write_text("print(1)\n")
    extra = ["--input", f"d=s3://{bucket}/no/such/prefix"] if what == "missing input" else []
    prefix = f"s3://{bucket}/phx" if what == "missing input" else "s3://no-such-bucket-here/phx"
    args = ["run", "--backend", "sagemaker", "--role", ROLE, "--s3-prefix", prefix, "--image", "local/fake:1", *extra, "t.py"]
    before = {s["TrainingJobName"] for s in _sm(plane).list_training_jobs(MaxResults=100)["TrainingJobSummaries"]}
    proc = _phalanx(env, *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and ("nothing at" in proc.stderr or "does not exist" in proc.stderr)
    assert not (Path(env["PHALANX_HOME"]) / "jobs").exists() or not any((Path(env["PHALANX_HOME"]) / "jobs").iterdir())
    after = {s["TrainingJobName"] for s in _sm(plane).list_training_jobs(MaxResults=100)["TrainingJobSummaries"]}
    assert after == before


def test_sagemaker_fakeplane_retry_is_a_new_training_job_and_outputs_feed_the_next_job(plane, aws, tmp_path):
    """--max-retries: attempt 1 is training job ...-a1 with the same checkpoint URI, so it resumes
    past the failure; the model archive becomes the job's outputs, and ``--input x=job:ID`` hands
    them to the next job as a channel."""
    env, bucket = aws
    proc = _phalanx(env, *_run_args(bucket, "-n", "2x1", "--max-retries", "1", "--json", "--workdir", str(EXAMPLES), "--name", "retried",
                                    str(EXAMPLES / "train_ddp.py"), "--epochs", "1", "--steps-per-epoch", "6", "--checkpoint-every", "2",
                                    "--fail-at-step", "4", "--fail-rank", "1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(proc.stdout[proc.stdout.index("{\n"):])
    job = _job_dir(env, record["id"])
    sm = _sm(plane)
    first, second = (sm.describe_training_job(TrainingJobName=f"phx-{record['id']}-a{k}") for k in (0, 1))
    assert (first["TrainingJobStatus"], second["TrainingJobStatus"]) == ("Failed", "Completed")
    # SageMaker's FailureReason is the failure file of the instance that ends first. Rank 0, cut off
    # mid-collective, raises too and could end first; its instance waits for the peer's report, so
    # the reason names the rank that raised (entry.cut_off_by_peer). phalanx's root cause too.
    assert first["FailureReason"].startswith("rank 1 on node 1 (algo-2) failed: RuntimeError: injected failure at step 4"), first["FailureReason"]
    assert first["CheckpointConfig"] == second["CheckpointConfig"]
    attempt0 = json.loads((job / "attempts.jsonl").read_text().splitlines()[0])
    assert "rank 1" in attempt0["message"], attempt0
    assert "resumed from step=4" in (job / "attempt_1" / "rank_0" / "output.log").read_text()
    assert (job / "output" / "model.pt").is_file()
    (tmp_path / "check.py").write_text("import os\nprint('prev has', sorted(os.listdir(os.environ['SM_CHANNEL_PREV'])), flush=True)\n")
    chained = _phalanx(env, *_run_args(bucket, "--input", f"prev=job:{record['id']}", "--json", "check.py"), cwd=tmp_path)
    assert chained.returncode == 0, chained.stderr[-3000:]
    chained_job = _job_dir(env, json.loads(chained.stdout[chained.stdout.index("{\n"):])["id"])
    assert "prev has ['model.pt']" in (chained_job / "attempt_0" / "rank_0" / "output.log").read_text()


def test_sagemaker_fakeplane_a_lost_supervisor_is_replaced_without_a_second_training_job(plane, aws):
    env, bucket = aws
    proc = _phalanx(env, *_run_args(bucket, "-n", "2x1", "-d", "--json", "--workdir", str(EXAMPLES), "--name", "orphan",
                                    str(EXAMPLES / "train_ddp.py"), "--epochs", "1", "--steps-per-epoch", "100", "--sleep", "0.2"))
    job_id = _job_id(proc)
    job = _job_dir(env, job_id)
    log = job / "attempt_0" / "rank_0" / "output.log"
    deadline = time.monotonic() + 240
    while "step=2 " not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    status = json.loads(_phalanx(env, "status", job_id, "--json").stdout)
    os.kill(status["supervisor_pid"], 9)
    lost = _phalanx(env, "status", job_id)
    assert "LOST" in lost.stdout and f"SAGEMAKER job phx-{job_id}-a0" in lost.stdout, lost.stdout
    assert "step=2 " in log.read_text(), "status only looks: the logs it found stay (the attach of resume rewrites them)"
    resumed = _phalanx(env, "resume", "--attach", job_id, timeout=300)  # started with -d: here, to watch it end
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    # 100 steps of 0.2 s: the training job still runs when resume looks (three CLI calls under
    # load take seconds; a job that completed meanwhile would be planned again, not watched)
    assert "epoch=1 step=100 loss=" in log.read_text()
    assert not (job / "attempt_1").exists()
    names = {s["TrainingJobName"] for s in _sm(plane).list_training_jobs(NameContains=job_id)["TrainingJobSummaries"]}
    assert names == {f"phx-{job_id}-a0"}


def test_sagemaker_fakeplane_sweep_is_one_training_job_per_trial(plane, aws):
    env, bucket = aws
    proc = _phalanx(env, *_run_args(bucket, "--parallel", "2", "--workdir", str(EXAMPLES), "--name", "swept",
                                    "--metric", "loss=loss=([0-9.]+)", "--objective", "loss:min",
                                    str(EXAMPLES / "train_ddp.py"), "--epochs", "1", "--steps-per-epoch", "4", "--lr", "[0.1, 0.01]"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from phalanx.store import Store

    trials = [r for r in Store(Path(env["PHALANX_HOME"]) / "phalanx.db").list(trials=True) if r.sweep_id]
    assert len(trials) == 2 and all(t.state.value == "SUCCEEDED" and t.backend == "sagemaker" for t in trials)
    names = {s["TrainingJobName"] for s in _sm(plane).list_training_jobs(MaxResults=100)["TrainingJobSummaries"]}
    assert {f"phx-{t.id}-a0" for t in trials} <= names


def test_sagemaker_fakeplane_max_runtime_counts_as_preempted(plane, aws):
    """SageMaker's own time limit (MaxRuntimeExceeded) stops the ranks with SIGTERM: the attempt was
    taken, not broken, so it ends PREEMPTED and `phalanx resume` continues from the checkpoint."""
    env, bucket = aws
    proc = _phalanx(env, *_run_args(bucket, "-n", "1x1", "--max-run", "8", "--json", "--workdir", str(EXAMPLES), "--name", "limited",
                                    str(EXAMPLES / "train_ddp.py"), "--epochs", "1", "--steps-per-epoch", "500", "--sleep", "0.2"))
    record = json.loads(proc.stdout[proc.stdout.index("{\n"):])
    assert record["state"] == "PREEMPTED" and proc.returncode == 143, proc.stdout[-2000:] + proc.stderr[-2000:]
    found = _sm(plane).describe_training_job(TrainingJobName=f"phx-{record['id']}-a0")
    assert (found["TrainingJobStatus"], found["SecondaryStatus"]) == ("Stopped", "MaxRuntimeExceeded")
    assert "MaxRuntimeExceeded" in _phalanx(env, "status", record["id"]).stdout


def test_sagemaker_fakeplane_an_attempt_that_cannot_start_leaves_no_uploads(plane, aws, tmp_path):
    """SageMaker unreachable at CreateTrainingJob: the job fails saying so, and the attempt's code
    upload is removed again (the content-addressed inputs stay: they are complete and reusable)."""
    env, bucket = aws
    with __import__("socket").socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens there once closed
    (tmp_path / "t.py").write_text("print(1)\n")
    proc = _phalanx({**env, "AWS_ENDPOINT_URL_SAGEMAKER": dead}, *_run_args(bucket, "--json", "t.py"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    record = json.loads(proc.stdout[proc.stdout.index("{\n"):])
    cause = record["root_cause"] if isinstance(record.get("root_cause"), dict) else json.loads(record["root_cause"])
    assert "could not start" in cause["message"] and f"phx-{record['id']}-a0" in cause["message"]
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test")
    assert s3.list_objects_v2(Bucket=bucket, Prefix=f"phx/jobs/{record['id']}/").get("KeyCount") == 0


def test_sagemaker_fakeplane_jax_runs_one_process_per_node(plane, aws):
    """--framework jax: no torchrun; the node agent starts one process per rank, with the JAX
    coordinator on algo-1 (an image of your own: AWS publishes no JAX training image)."""
    env, bucket = aws
    proc = _phalanx(env, *_run_args(bucket, "--framework", "jax", "-n", "2x1", "--json", "--workdir", str(EXAMPLES),
                                    str(EXAMPLES / "jax_hello.py")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job = _job_dir(env, json.loads(proc.stdout[proc.stdout.index("{\n"):])["id"])
    for rank in (0, 1):
        text = (job / "attempt_0" / f"rank_{rank}" / "output.log").read_text()
        assert f"jax process_index={rank} process_count=2" in text and "allgather=[0, 1]" in text
