"""Opt-in tests against real clouds; skipped unless asked for (never in CI).

SageMaker (``aws_live``): one ``ml.m5.large`` instance, one short job, on the account your AWS
configuration names. It costs a few cents::

    PHALANX_AWS_LIVE=1 PHALANX_AWS_ROLE=arn:aws:iam::ACCOUNT:role/NAME PHALANX_AWS_S3=s3://bucket/prefix \\
        AWS_PROFILE=... AWS_REGION=... .venv/bin/python -m pytest -m aws_live tests/cluster/test_cloud_live.py

SkyPilot (``sky_live``): one small VM wherever ``PHALANX_SKY_INFRA`` says, run by phalanx in the
SkyPilot environment (``.venv-sky``, built on first use: tests/backends/skypilot/skyenv.py), whose
``sky check`` must pass (it reads your HOME's cloud credentials)::

    PHALANX_SKY_LIVE=1 PHALANX_SKY_INFRA=aws .venv/bin/python -m pytest -m sky_live tests/cluster/test_cloud_live.py
"""

import json
import os
import subprocess

import pytest

from tests.conftest import EXAMPLES, phalanx


@pytest.mark.aws_live
@pytest.mark.skipif(os.environ.get("PHALANX_AWS_LIVE") != "1", reason="opt-in: set PHALANX_AWS_LIVE=1, PHALANX_AWS_ROLE, PHALANX_AWS_S3")
def test_sagemaker_live_one_short_job(phx_home):
    proc = phalanx("run", "--backend", "sagemaker", "--role", os.environ["PHALANX_AWS_ROLE"], "--s3-prefix", os.environ["PHALANX_AWS_S3"],
                   "--instance-type", "ml.m5.large", "--max-run", "900", "--json", "--workdir", str(EXAMPLES),
                   str(EXAMPLES / "hello.py"), timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(proc.stdout[proc.stdout.index("{\n"):])
    status = phalanx("status", record["id"])
    assert "Completed" in status.stdout and "instance-hours" in status.stdout


@pytest.mark.sky_live
@pytest.mark.skipif(os.environ.get("PHALANX_SKY_LIVE") != "1", reason="opt-in: set PHALANX_SKY_LIVE=1 and PHALANX_SKY_INFRA")
def test_skypilot_live_one_small_vm(phx_home):
    from tests.backends.skypilot import skyenv

    proc = subprocess.run([str(skyenv.ensure()), "-m", "phalanx", "run", "--backend", "skypilot", "--infra", os.environ.get("PHALANX_SKY_INFRA", "aws"),
                           "--cpus", "2+", "--workdir", str(EXAMPLES), str(EXAMPLES / "hello.py")], capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
