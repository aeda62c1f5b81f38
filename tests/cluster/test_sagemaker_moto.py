"""phalanx's AWS door (``backends/sagemaker/client.py``) against moto in server mode: the
incremental CloudWatch tail with nextForwardToken, and local inputs uploaded once per content."""

import time

import pytest

from phalanx.backends.sagemaker.client import Aws
from phalanx.backends.sagemaker.layout import JobS3
from phalanx.backends.sagemaker.uploads import local_digest, upload_channel
from phalanx.core.paths import HomePaths

pytestmark = pytest.mark.cluster


@pytest.fixture
def aws(s3_server, monkeypatch):
    for key, value in {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    return Aws("us-east-1")


def test_log_tail_is_incremental(aws):
    group, stream = "/aws/sagemaker/TrainingJobs", f"phx-tail{time.monotonic_ns()}-a0/algo-1-1700000000"
    logs = aws.client("logs")
    try:
        logs.create_log_group(logGroupName=group)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    logs.create_log_stream(logGroupName=group, logStreamName=stream)
    assert aws.log_streams(group, stream.split("/")[0] + "/") == [stream]
    logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=[{"timestamp": int(time.time() * 1000), "message": m} for m in ("a", "b")])
    pages = list(aws.log_events(group, stream, None))
    assert [m for messages, _ in pages for m in messages] == ["a", "b"]
    token = pages[-1][1]
    assert [m for messages, _ in aws.log_events(group, stream, token) for m in messages] == []
    logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=[{"timestamp": int(time.time() * 1000), "message": "c"}])
    assert [m for messages, _ in aws.log_events(group, stream, token) for m in messages] == ["c"]
    assert aws.log_streams(group, "phx-nothing-here/") == []


def test_a_local_input_is_uploaded_once_per_content(aws, tmp_path):
    bucket = f"phx-up-{time.monotonic_ns()}"
    aws.client("s3").create_bucket(Bucket=bucket)
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("one")
    (data / "sub" / "b.txt").write_text("two")
    cache, s3, said = HomePaths(tmp_path / "home").sagemaker_digests, JobS3(f"s3://{bucket}/phx", "j1"), []
    digest = local_digest(str(data), cache, remember=True)
    assert upload_channel(aws, s3, "d", str(data), digest, said.append) is True
    assert upload_channel(aws, s3, "d", str(data), local_digest(str(data), cache), said.append) is False
    keys = sorted(o["Key"] for o in aws.client("s3").list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == [f"phx/channels/{digest}.json", f"phx/channels/{digest}/a.txt", f"phx/channels/{digest}/sub/b.txt"]
    (data / "a.txt").write_text("changed")
    assert local_digest(str(data), cache) != digest
    aws.delete_prefix(f"s3://{bucket}/phx/channels/{digest}/")
    assert sorted(o["Key"] for o in aws.client("s3").list_objects_v2(Bucket=bucket)["Contents"]) == [f"phx/channels/{digest}.json"]
    assert len(said) == 1
