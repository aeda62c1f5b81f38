"""Real jobs announce their outcomes to a real webhook and a real SMTP server started here:
succeeded, failed with the root cause, retried, stalled, a sweep's end; a broken notifier
costs a warning, never the job."""

from __future__ import annotations

import json
import socket

import pytest

from tests.conftest import phalanx
from tests.local.test_run import _wait_for
from tests.unit.test_notify import SmtpSink, Webhook

pytestmark = pytest.mark.local

SCRIPT = """
import os, sys, time
mode = sys.argv[1]
print("step=1 loss=0.5", flush=True)
if mode == "fail":
    raise RuntimeError("the data loader broke")
if mode == "flaky" and os.environ["PHALANX_ATTEMPT"] == "0":
    sys.exit(7)
if mode == "hang":
    time.sleep(60)
print("step=2 loss=0.25", flush=True)
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


def _events(hook: Webhook) -> list[dict]:
    return [r["body"]["phalanx"] for r in hook.received]


def test_outcomes_reach_a_webhook(phx_home, script, webhook):
    ok = phalanx("run", "--name", "fine", "--notify", webhook.url, str(script), "ok")
    assert ok.returncode == 0
    failed = phalanx("run", "--name", "broken", "--notify", webhook.url, str(script), "fail")
    assert failed.returncode == 1
    flaky = phalanx("run", "--name", "flaky", "--max-retries", "1", "--notify", webhook.url, str(script), "flaky")
    assert flaky.returncode == 0
    stalled = phalanx("run", "--name", "stuck", "--stall-timeout", "2", "--grace", "2", "--notify", webhook.url, str(script), "hang")
    assert stalled.returncode != 0
    events = _events(webhook)
    kinds = [(e["name"], e["kind"]) for e in events]
    assert kinds == [("fine", "succeeded"), ("broken", "failed"), ("flaky", "retried"), ("flaky", "succeeded"), ("stuck", "stalled")]
    broken = events[1]
    assert "rank 0 on node 0: RuntimeError: the data loader broke" in broken["title"]
    assert "Traceback" in broken["detail"] and broken["fields"]["root_cause"]["type"] == "RuntimeError"
    assert "attempt 0 failed (exit 7); retrying (1/1)" in events[2]["title"]
    assert "no output from any rank for" in events[4]["title"]
    assert all(r["body"]["text"].startswith("*job ") for r in webhook.received), "Slack's text field"


def test_a_sweeps_end_and_an_email(phx_home, script, webhook, monkeypatch):
    sink = SmtpSink()
    try:
        env = {"PHALANX_SMTP_HOST": "127.0.0.1", "PHALANX_SMTP_PORT": str(sink.port),
               "PHALANX_NOTIFY": f"mailto:me@example.org, {webhook.url}"}  # the setting: the default targets
        sweep = phalanx("run", "--name", "swept", "--objective", "loss:min", str(script), "[ok, flaky]", env=env)
        assert sweep.returncode == 0, sweep.stderr
        (event,) = _events(webhook)
        assert event["kind"] == "succeeded" and event["title"].startswith("sweep ") and "2/2 trials" in event["title"]
        assert "best loss=0.25" in event["title"] and event["fields"]["sweep"] is True
        (mail,) = sink.messages
        assert mail["to"] == ["me@example.org"] and "2/2 trials" in str(mail["message"]["Subject"])
    finally:
        sink.close()


def test_a_broken_notifier_never_fails_the_job(phx_home, script):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    proc = phalanx("run", "--name", "fine", "--notify", f"http://127.0.0.1:{port}/hook", str(script), "ok")
    assert proc.returncode == 0
    assert f"warning: could not notify http://127.0.0.1:{port}/...: " in proc.stderr
    assert json.loads(phalanx("status", "fine", "--json", check=True).stdout)["state"] == "SUCCEEDED"


def test_a_detached_job_notifies_before_its_supervisor_exits(phx_home, script, webhook):
    job = phalanx("run", "-d", "--name", "away", "--notify", webhook.url, str(script), "fail", check=True).stdout.strip()
    phalanx("wait", job)
    _wait_for(lambda: len(webhook.received) == 1, timeout=30, what="the notification")
    assert _events(webhook)[0]["kind"] == "failed" and _events(webhook)[0]["job"] == job
