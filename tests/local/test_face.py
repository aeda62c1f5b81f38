"""The face (``phalanx.api.face``) answers in JSON: every view and verb's result survives
``json.dumps``/``json.loads`` unchanged, so a server can send it as it is and a remote client
renders what a local one does. Real jobs (a small script, no torch), the local face."""

from __future__ import annotations

import json

import pytest

from phalanx.api.face import LocalFace
from phalanx.api.ps import PsRequest
from tests.conftest import phalanx

pytestmark = pytest.mark.local

SCRIPT = """
import os, sys
for step in range(1, 4):
    print(f"step={step} loss={1.0 / step:.3f}", flush=True)
sys.exit(int(os.environ.get("FAIL", "0")))
"""


def _same_as_json(value):
    assert json.loads(json.dumps(value)) == value, "not plain JSON data"
    return value


def test_every_view_and_verb_answers_in_json(phx_home, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    phalanx("run", "--cold", "--name", "ok", str(script), check=True)
    failed = phalanx("run", "--cold", "--name", "bad", "--env", "FAIL=3", str(script))
    assert failed.returncode == 3
    phalanx("run", "--cold", "--name", "sw", str(script), "--x", "[1, 2]", check=True)

    face = LocalFace()
    rows = [_same_as_json(r) for r in face.ps(PsRequest(all=True)).rows]
    kinds = sorted(r.get("kind", "job") for r in rows)
    assert kinds == ["job", "job", "sweep"], rows
    status = _same_as_json(face.status("bad"))
    assert status["kind"] == "job" and status["state"] == "FAILED" and status["exit_code"] == 3
    assert status["ranks"][0]["exitcode"] == 3 and status["actions"] == ["resume", "retry", "delete"]
    sweep = _same_as_json(face.status("sw"))
    assert sweep["kind"] == "sweep" and len(sweep["trials"]) == 2 and sweep["table"]["rows"]
    assert _same_as_json(face.trials("sw"))["rows"][0]["trial"] is not None
    metrics = _same_as_json(face.metrics("ok"))
    assert metrics["metrics"]["loss"]["last"] == pytest.approx(0.333)
    lines: list[str] = []
    assert face.metric_records("ok", lines.append) > 0 and all(json.loads(line) for line in "".join(lines).splitlines())
    assert _same_as_json(face.top("ok"))["terminal"] is True
    assert _same_as_json(face.artifacts("ok"))["files"] == []
    assert _same_as_json(face.usage("name"))
    done = _same_as_json(face.wait("ok"))
    assert done["kind"] == "job" and done["wait_code"] == 0
    assert _same_as_json(face.stop("ok"))["state"] == "SUCCEEDED", "stopping a finished job changes nothing"
    logged: list[str] = []
    face.logs("ok", logged.append)
    assert "step=3 loss=0.333" in "".join(logged)
    removed = _same_as_json(face.rm(["bad"], dry_run=True))
    assert removed["jobs"] == 1 and removed["dry_run"] is True
