"""SageMaker and secrets (docs/secrets.md): without ``--secrets-from aws`` a job with secrets is
refused, with it the request (strictly validated against botocore's model) holds no value and each
instance's part names where to read them; the standard-library signer on the instance signs as
botocore does; ``Aws.check_secret`` and the instance's read against moto's Secrets Manager (a
fake of AWS, in this process)."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest

from phalanx.backends.registry import get_backend
from phalanx.backends.sagemaker import awssecrets, schema
from phalanx.backends.sagemaker.plan import request_of
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources
from phalanx.errors import SecretError, UsageError

ROLE = "arn:aws:iam::123456789012:role/sm"
CANARY = "sm-canary-Zf83kQ1x"


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch, tmp_path):
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SECRETS_MANAGER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def _spec(**options) -> JobSpec:
    return JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/work/train.py"), Resources(2, 1), name="train", backend="sagemaker",
                   python="python3", workdir="/work", secrets={"HF_TOKEN": "prod/ml/hf", "DB": "arn:aws:secretsmanager:"
                                                               "us-east-1:123456789012:secret:db-AbCdEf"},
                   backend_options={"role": ROLE, "s3_prefix": "s3://bkt/phx", **options})


def _plan(spec: JobSpec, tmp: Path):
    backend = get_backend("sagemaker")
    return backend.plan(spec, "job1234", 0, HomePaths(tmp / "home"), backend.facts(spec))


def test_secrets_without_secrets_from_aws_are_refused_saying_why(tmp_path):
    with pytest.raises(UsageError) as exc:
        _plan(_spec(), tmp_path)
    text = str(exc.value)
    assert "the sagemaker backend does not carry secret values (DB, HF_TOKEN)" in text
    assert "DescribeTrainingJob" in text and "add --secrets-from aws" in text and "\n" not in text


def test_with_secrets_from_aws_the_request_holds_no_value_and_each_node_says_where_to_read(tmp_path):
    plan = _plan(_spec(secrets_from="aws"), tmp_path)
    request = request_of(plan)
    schema.check("CreateTrainingJob", request)
    assert request["Environment"] == {"PHALANX_JOB_ID": "job1234", "PHALANX_ATTEMPT": "0"}
    for node in plan.nodes:
        assert node.secrets == {"HF_TOKEN": "prod/ml/hf", "DB": "arn:aws:secretsmanager:us-east-1:123456789012:secret:db-AbCdEf"}
        assert node.env["PHALANX_SECRETS_FROM"] == "aws" and node.env["PHALANX_SECRETS_REGION"] == "us-east-1"
        assert node.env["PHALANX_SECRET_VARS"] == "DB,HF_TOKEN" and "HF_TOKEN" not in node.env
    assert "HF_TOKEN=<secret>" in plan.render()


def test_the_signature_is_botocores(monkeypatch):
    """The instance signs GetSecretValue itself (no boto3 in the image): the same request signed by
    botocore's SigV4Auth has the same Authorization header."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    now = datetime.datetime(2026, 3, 1, 12, 30, 45, tzinfo=datetime.timezone.utc)
    body = json.dumps({"SecretId": "prod/ml/hf"}).encode()
    url = "https://secretsmanager.eu-west-1.amazonaws.com/"
    base = {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": "secretsmanager.GetSecretValue"}
    for token in ("", "FQoGZXIvYXdzEXAMPLETOKEN"):
        ours = awssecrets.sign("POST", url, "eu-west-1", body, ("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG", token), base, now)
        request = AWSRequest("POST", url, data=body, headers={**base, "X-Amz-Date": now.strftime("%Y%m%dT%H%M%SZ")})
        import botocore.auth

        monkeypatch.setattr(botocore.auth.datetime, "datetime", type("Fixed", (datetime.datetime,), {
            "utcnow": staticmethod(lambda: now.replace(tzinfo=None)), "now": staticmethod(lambda tz=None: now)}))
        SigV4Auth(Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG", token or None), "secretsmanager", "eu-west-1").add_auth(request)
        assert ours["Authorization"] == request.headers["Authorization"], token
        assert ours.get("X-Amz-Security-Token") == (token or None)


def test_the_instance_reads_each_secret_and_the_submit_checks_they_exist(monkeypatch):
    """Against moto's Secrets Manager (a fake of AWS, its server on loopback in this process):
    ``check_secret`` (DescribeSecret through boto3, before the job is recorded) and the instance's
    read (``entry.fetch_secrets``: its own signed HTTP requests)."""
    import boto3
    from moto.server import ThreadedMotoServer

    from phalanx.backends.base import free_port
    from phalanx.backends.sagemaker.client import Aws
    from phalanx.backends.sagemaker.entry import fetch_secrets

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        boto3.client("secretsmanager", region_name="us-east-1").create_secret(Name="prod/ml/hf", SecretString=CANARY)
        Aws("us-east-1").check_secret("prod/ml/hf", "HF_TOKEN")
        with pytest.raises(SecretError, match=r"no secret 'prod/ml/nope' \(for X\) in AWS Secrets Manager \(us-east-1\)"):
            Aws("us-east-1").check_secret("prod/ml/nope", "X")
        node = {"secrets": {"HF_TOKEN": "prod/ml/hf"}, "env": {"PHALANX_SECRETS_FROM": "aws", "PHALANX_SECRETS_REGION": "us-east-1"}}
        environ = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ENDPOINT_URL": endpoint}
        assert fetch_secrets(node, environ) == {"HF_TOKEN": CANARY}
        with pytest.raises(ValueError) as exc:
            fetch_secrets({**node, "secrets": {"HF_TOKEN": "prod/ml/nope"}}, environ)
        assert str(exc.value).startswith("cannot read secret 'prod/ml/nope' (for HF_TOKEN) from AWS Secrets Manager: "
                                         "ResourceNotFoundException")
        assert CANARY not in str(exc.value)
    finally:
        server.stop()
    assert fetch_secrets({"env": {}}, {}) == {}


def test_instance_credentials_come_from_the_container_endpoint(monkeypatch):
    """No keys in the environment: the container credentials endpoint (a local HTTP server here,
    standing in for 169.254.170.2) gives them, as AWS's SDKs read it."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen: list[str] = []

    class Creds(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.headers.get("Authorization", ""))
            body = json.dumps({"AccessKeyId": "AK", "SecretAccessKey": "SK", "Token": "TK"}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Creds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v2/credentials"
        creds = awssecrets.credentials({"AWS_CONTAINER_CREDENTIALS_FULL_URI": url, "AWS_CONTAINER_AUTHORIZATION_TOKEN": "tok"})
        assert creds == ("AK", "SK", "TK") and seen == ["tok"]
    finally:
        server.shutdown()
    with pytest.raises(awssecrets.SecretsError, match="no AWS credentials on this instance"):
        awssecrets.credentials({"AWS_CONTAINER_CREDENTIALS_FULL_URI": url})
    assert os.environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") is None
