"""AWS Secrets Manager's GetSecretValue from a SageMaker instance, with the standard library only
(``entry.py`` runs in a training image that need not have boto3): ``--secrets-from aws``.

Credentials come as AWS's SDKs find them in a container, in their order: the environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``), the container
credentials endpoint (``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`` on 169.254.170.2, or
``AWS_CONTAINER_CREDENTIALS_FULL_URI`` with ``AWS_CONTAINER_AUTHORIZATION_TOKEN``), then the instance
metadata service (IMDSv2). Requests are signed with Signature Version 4 (AWS's "Create a signed AWS
API request"; ``tests/backends/sagemaker`` compares the signature with botocore's). The endpoint is
``AWS_ENDPOINT_URL_SECRETS_MANAGER``, ``AWS_ENDPOINT_URL``, else the region's.

A value is returned to the caller, never printed, logged or written; errors name the secret and
AWS's error code only.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import urllib.error
import urllib.request
from typing import Mapping
from urllib.parse import urlsplit

SERVICE = "secretsmanager"
TARGET = "secretsmanager.GetSecretValue"
CONTAINER_HOST = "http://169.254.170.2"
IMDS = "http://169.254.169.254"
TIMEOUT = 10.0


class SecretsError(ValueError):
    """A secret that could not be read: its name and why, never a value."""


def get_secret_values(refs: Mapping[str, str], region: str, environ: Mapping[str, str]) -> dict[str, str]:
    """``{VAR: secret name or ARN}`` -> ``{VAR: value}``, read from AWS Secrets Manager in ``region``."""
    if not refs:
        return {}
    creds = credentials(environ)
    endpoint = (environ.get("AWS_ENDPOINT_URL_SECRETS_MANAGER") or environ.get("AWS_ENDPOINT_URL")
                or f"https://secretsmanager.{region}.amazonaws.com")
    return {var: get_secret_value(name, var, region, endpoint, creds) for var, name in sorted(refs.items())}


def get_secret_value(name: str, var: str, region: str, endpoint: str, creds: tuple[str, str, str]) -> str:
    body = json.dumps({"SecretId": name}).encode()
    headers = sign("POST", endpoint, region, body, creds, {"Content-Type": "application/x-amz-json-1.1",
                                                           "X-Amz-Target": TARGET})
    request = urllib.request.Request(endpoint.rstrip("/") + "/", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            data = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        code = _error_code(exc)
        raise SecretsError(f"cannot read secret '{name}' (for {var}) from AWS Secrets Manager: {code}; the training "
                           "job's role needs secretsmanager:GetSecretValue on it") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise SecretsError(f"cannot reach AWS Secrets Manager at {endpoint} for secret '{name}': {exc}") from None
    if "SecretString" in data:
        return str(data["SecretString"])
    import base64

    return base64.b64decode(data.get("SecretBinary") or b"").decode("utf-8", "surrogateescape")


def _error_code(exc: urllib.error.HTTPError) -> str:
    try:
        data = json.loads(exc.read())
        return str(data.get("__type", "")).rsplit("#", 1)[-1] or f"HTTP {exc.code}"
    except (ValueError, OSError):
        return f"HTTP {exc.code}"


def sign(method: str, url: str, region: str, body: bytes, creds: tuple[str, str, str], headers: Mapping[str, str],
         now: datetime.datetime | None = None) -> dict[str, str]:
    """``headers`` with Signature Version 4's (``Host``, ``X-Amz-Date``, the token, ``Authorization``)."""
    key, secret, token = creds
    now = now or datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    parts = urlsplit(url)
    signed_headers = {**{k.lower(): v.strip() for k, v in headers.items()}, "host": parts.netloc, "x-amz-date": amz_date}
    if token:
        signed_headers["x-amz-security-token"] = token
    names = ";".join(sorted(signed_headers))
    canonical = "\n".join([method, parts.path or "/", parts.query, "".join(f"{k}:{signed_headers[k]}\n" for k in sorted(signed_headers)),
                           names, hashlib.sha256(body).hexdigest()])
    scope = f"{day}/{region}/{SERVICE}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    signing = ("AWS4" + secret).encode()
    for part in (day, region, SERVICE, "aws4_request"):
        signing = hmac.new(signing, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(signing, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {**headers, "Host": parts.netloc, "X-Amz-Date": amz_date,
           "Authorization": f"AWS4-HMAC-SHA256 Credential={key}/{scope}, SignedHeaders={names}, Signature={signature}"}
    if token:
        out["X-Amz-Security-Token"] = token
    return out


def credentials(environ: Mapping[str, str]) -> tuple[str, str, str]:
    """(access key, secret key, session token) the way AWS's SDKs find them in a container."""
    if environ.get("AWS_ACCESS_KEY_ID") and environ.get("AWS_SECRET_ACCESS_KEY"):
        return environ["AWS_ACCESS_KEY_ID"], environ["AWS_SECRET_ACCESS_KEY"], environ.get("AWS_SESSION_TOKEN", "")
    url = None
    headers: dict[str, str] = {}
    if environ.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        url = CONTAINER_HOST + environ["AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"]
    elif environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        url = environ["AWS_CONTAINER_CREDENTIALS_FULL_URI"]
        if environ.get("AWS_CONTAINER_AUTHORIZATION_TOKEN"):
            headers["Authorization"] = environ["AWS_CONTAINER_AUTHORIZATION_TOKEN"]
    try:
        if url is not None:
            data = _get_json(url, headers)
        else:
            data = _imds()
        return str(data["AccessKeyId"]), str(data["SecretAccessKey"]), str(data.get("Token") or "")
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        raise SecretsError(f"no AWS credentials on this instance to read secrets with ({type(exc).__name__}: {exc})") from None


def _get_json(url: str, headers: Mapping[str, str]) -> dict[str, object]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=dict(headers)), timeout=TIMEOUT) as answer:
        data = json.loads(answer.read())
    if not isinstance(data, dict):
        raise ValueError("credentials are not a JSON object")
    return data


def _imds() -> dict[str, object]:
    """The instance role's credentials from the metadata service (IMDSv2: a session token first)."""
    put = urllib.request.Request(f"{IMDS}/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    with urllib.request.urlopen(put, timeout=2.0) as answer:
        token = answer.read().decode()
    where = f"{IMDS}/latest/meta-data/iam/security-credentials/"
    with urllib.request.urlopen(urllib.request.Request(where, headers={"X-aws-ec2-metadata-token": token}), timeout=2.0) as answer:
        role = answer.read().decode().split()[0]
    return _get_json(where + role, {"X-aws-ec2-metadata-token": token})
