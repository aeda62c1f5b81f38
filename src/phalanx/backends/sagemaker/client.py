"""The one door to AWS for the SageMaker backend: SageMaker, S3 and CloudWatch Logs through boto3.

boto3 is imported here only, inside functions, so ``phalanx --help``/``ps``/``status`` never load
it. Configuration is AWS's standard one: ``--profile``/``AWS_PROFILE``, ``--region``/``AWS_REGION``
(or the profile's), credentials from the usual chain, and per-service endpoints such as
``AWS_ENDPOINT_URL_SAGEMAKER`` (the tests point those at moto and at the fake control plane).
"""

from __future__ import annotations

import os
from typing import Any, Iterator

from ...errors import BackendError, MissingDependency, UsageError


def _botocore_session(profile: str | None) -> Any:
    try:
        import botocore.session
    except ImportError:
        raise MissingDependency("boto3", "sagemaker") from None
    try:
        return botocore.session.Session(profile=profile)
    except Exception as exc:  # noqa: BLE001 - botocore's ProfileNotFound and friends
        raise UsageError(f"AWS profile '{profile}': {exc}", "check --profile / AWS_PROFILE and ~/.aws/config") from None


def region(opts: dict[str, Any]) -> str:
    """The region jobs go to: ``--region``, else the standard AWS configuration. Reads only the
    environment and the config files (no network). Raises UsageError when none is set."""
    if opts.get("region"):
        return str(opts["region"])
    if os.environ.get("AWS_REGION"):  # the other SDKs' spelling; botocore reads AWS_DEFAULT_REGION
        return os.environ["AWS_REGION"]
    session = _botocore_session(opts.get("profile"))
    try:
        found = session.get_config_variable("region")
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"cannot read the AWS configuration: {exc}", "check AWS_PROFILE and ~/.aws/config") from None
    if not found:
        raise UsageError("no AWS region is configured for the sagemaker backend",
                         "give --region, set AWS_REGION, or set region in the profile (~/.aws/config)")
    return str(found)


class Aws:
    """Clients for one region and profile, made on first use."""

    def __init__(self, region_name: str, profile: str | None = None) -> None:
        self.region = region_name
        self.profile = profile
        self._clients: dict[str, Any] = {}

    def client(self, service: str) -> Any:
        if service not in self._clients:
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise MissingDependency("boto3", "sagemaker") from None
            session = boto3.Session(profile_name=self.profile, region_name=self.region)
            config = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=10, read_timeout=60)
            self._clients[service] = session.client(service, config=config)
        return self._clients[service]

    # -- checks before anything is created ------------------------------------------------

    def check_credentials(self) -> None:
        import boto3

        try:
            creds = boto3.Session(profile_name=self.profile, region_name=self.region).get_credentials()
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"cannot load AWS credentials: {exc}", "check AWS_PROFILE, ~/.aws/credentials or aws sso login") from None
        if creds is None:
            raise UsageError("no AWS credentials found for the sagemaker backend",
                             "configure them (aws configure, AWS_PROFILE, aws sso login, or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)")

    def check_bucket(self, bucket: str, what: str) -> None:
        try:
            self.client("s3").head_bucket(Bucket=bucket)
        except Exception as exc:  # noqa: BLE001
            code = _code(exc)
            if code in ("404", "NoSuchBucket", "NotFound"):
                raise UsageError(f"bucket '{bucket}' ({what}) does not exist", "create it, or give another with --s3-prefix") from None
            raise UsageError(f"cannot reach bucket '{bucket}' ({what}): {_message(exc)}",
                             "check the credentials, the region and the endpoint") from None

    def check_secret(self, name: str, var: str) -> None:
        """``--secret VAR=NAME --secrets-from aws``: the secret exists in Secrets Manager (DescribeSecret:
        its metadata only; the instances read the value with the training job's role)."""
        from ...errors import SecretError

        try:
            self.client("secretsmanager").describe_secret(SecretId=name)
        except Exception as exc:  # noqa: BLE001
            code = _code(exc)
            if code == "ResourceNotFoundException":
                raise SecretError(f"no secret '{name}' (for {var}) in AWS Secrets Manager ({self.region})",
                                  "create it there (aws secretsmanager create-secret --name NAME --secret-string ...), "
                                  "or check the name and --region") from None
            raise SecretError(f"cannot look up secret '{name}' (for {var}) in AWS Secrets Manager: {_message(exc)}",
                              "check the credentials (secretsmanager:DescribeSecret) and the region") from None

    def prefix_exists(self, uri: str) -> bool:
        bucket, key = _split(uri)
        answer = self.client("s3").list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
        return bool(answer.get("KeyCount"))

    # -- S3 -----------------------------------------------------------------------------------

    def upload(self, path: str, uri: str) -> None:
        bucket, key = _split(uri)
        self.client("s3").upload_file(path, bucket, key)

    def put(self, uri: str, data: bytes) -> None:
        bucket, key = _split(uri)
        self.client("s3").put_object(Bucket=bucket, Key=key, Body=data)

    def exists(self, uri: str) -> bool:
        bucket, key = _split(uri)
        try:
            self.client("s3").head_object(Bucket=bucket, Key=key)
            return True
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def download(self, uri: str, path: str) -> bool:
        """False when there is no such object."""
        bucket, key = _split(uri)
        try:
            self.client("s3").download_file(bucket, key, path)
            return True
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def delete_prefix(self, uri: str) -> None:
        bucket, key = _split(uri)
        s3 = self.client("s3")
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                s3.delete_objects(Bucket=bucket, Delete={"Objects": keys})

    # -- SageMaker ------------------------------------------------------------------------------

    def create_training_job(self, request: dict[str, Any]) -> str:
        try:
            return str(self.client("sagemaker").create_training_job(**request)["TrainingJobArn"])
        except Exception as exc:  # noqa: BLE001
            raise BackendError(f"SageMaker did not take training job {request['TrainingJobName']}: {_message(exc)}",
                               "fix what it names; `phalanx run --dry-run` prints the request") from None

    def describe(self, name: str) -> dict[str, Any] | None:
        """DescribeTrainingJob, or None when SageMaker does not know the job."""
        try:
            return dict(self.client("sagemaker").describe_training_job(TrainingJobName=name))
        except Exception as exc:  # noqa: BLE001
            if _code(exc) == "ValidationException" and "not found" in _message(exc).lower():
                return None
            raise

    def stop(self, name: str) -> None:
        try:
            self.client("sagemaker").stop_training_job(TrainingJobName=name)
        except Exception as exc:  # noqa: BLE001 - a job that has ended cannot be stopped: fine
            if _code(exc) != "ValidationException":
                raise

    # -- CloudWatch Logs --------------------------------------------------------------------------

    def log_streams(self, group: str, prefix: str) -> list[str]:
        logs = self.client("logs")
        names: list[str] = []
        try:
            for page in logs.get_paginator("describe_log_streams").paginate(logGroupName=group, logStreamNamePrefix=prefix):
                names += [s["logStreamName"] for s in page.get("logStreams", [])]
        except Exception as exc:  # noqa: BLE001 - the group appears with the first instance's output
            if _code(exc) != "ResourceNotFoundException":
                raise
        return sorted(names)

    def log_events(self, group: str, stream: str, token: str | None) -> Iterator[tuple[list[str], str | None]]:
        """Pages of (messages, next token) from ``token`` on, until a page brings nothing new."""
        logs = self.client("logs")
        while True:
            kwargs: dict[str, Any] = {"logGroupName": group, "logStreamName": stream, "startFromHead": True}
            if token:
                kwargs["nextToken"] = token
            page = logs.get_log_events(**kwargs)
            nxt = page.get("nextForwardToken")
            messages = [e["message"] for e in page.get("events", [])]
            yield messages, nxt
            if not messages or nxt == token:
                return
            token = nxt


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _message(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Message") or exc)

