"""Notifications against real servers started here: an HTTP server (a webhook) and an SMTP
server (a small stdlib SMTP sink on a real socket), both on 127.0.0.1."""

from __future__ import annotations

import email
import email.policy
import json
import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from phalanx.errors import UsageError
from phalanx.supervise.notify import Event, parse_target, parse_targets, payload, send


class Webhook:
    """A real HTTP server recording what was POSTed; ``status`` is what it answers."""

    def __init__(self, status: int = 200) -> None:
        self.received: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.received.append({"path": self.path, "type": self.headers["Content-Type"], "body": json.loads(body)})
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T000/B000/secret"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class SmtpSink:
    """A real SMTP server (the commands of RFC 5321 a client sends) keeping every message."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        sink = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                self.wfile.write(b"220 sink ESMTP\r\n")
                sender, rcpt, data = None, [], None
                while True:
                    line = self.rfile.readline()
                    if not line:
                        return
                    command = line.decode().strip()
                    upper = command.upper()
                    if upper.startswith(("EHLO", "HELO")):
                        self.wfile.write(b"250-sink\r\n250 8BITMIME\r\n")
                    elif upper.startswith("MAIL FROM:"):
                        sender = command[10:].strip("<> ")
                        self.wfile.write(b"250 ok\r\n")
                    elif upper.startswith("RCPT TO:"):
                        rcpt.append(command[8:].strip("<> "))
                        self.wfile.write(b"250 ok\r\n")
                    elif upper == "DATA":
                        self.wfile.write(b"354 go ahead\r\n")
                        lines = []
                        while True:
                            data_line = self.rfile.readline()
                            if data_line in (b".\r\n", b".\n", b""):
                                break
                            lines.append(data_line[1:] if data_line.startswith(b"..") else data_line)
                        data = b"".join(lines)
                        sink.messages.append({"from": sender, "to": rcpt, "message": email.message_from_bytes(data, policy=email.policy.default)})
                        self.wfile.write(b"250 queued\r\n")
                    elif upper == "QUIT":
                        self.wfile.write(b"221 bye\r\n")
                        return
                    else:
                        self.wfile.write(b"250 ok\r\n")

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture
def smtp(monkeypatch, tmp_path):
    sink = SmtpSink()
    monkeypatch.setenv("PHALANX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PHALANX_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("PHALANX_SMTP_PORT", str(sink.port))
    monkeypatch.setenv("PHALANX_SMTP_FROM", "phalanx@test.example")
    yield sink
    sink.close()


EVENT = Event("failed", "job 3f2a9c01 'resnet' failed: rank 1 on node 0: RuntimeError: boom", "3f2a9c01", "resnet",
              "FAILED", "Traceback (most recent call last):\n  File \"train.py\", line 3\nRuntimeError: boom",
              fields={"exit_code": 1})


def test_webhook_gets_slack_compatible_json(webhook):
    assert send([webhook.url], EVENT) == {webhook.url: None}
    (got,) = webhook.received
    assert got["type"] == "application/json" and got["path"] == "/services/T000/B000/secret"
    body = got["body"]
    assert body["text"].startswith("*job 3f2a9c01 'resnet' failed: rank 1 on node 0: RuntimeError: boom*")
    assert "```Traceback" in body["text"], "the traceback as a code block"
    assert body["phalanx"]["kind"] == "failed" and body["phalanx"]["fields"] == {"exit_code": 1}
    assert payload(EVENT) == body


def test_email_through_a_real_smtp_server(smtp):
    assert send(["mailto:me@example.org,ops@example.org"], EVENT) == {"mailto:me@example.org,ops@example.org": None}
    (got,) = smtp.messages
    assert got["from"] == "phalanx@test.example" and got["to"] == ["me@example.org", "ops@example.org"]
    message = got["message"]
    assert str(message["Subject"]).strip() == "[phalanx] job 3f2a9c01 'resnet' failed: rank 1 on node 0: RuntimeError: boom"
    assert "RuntimeError: boom" in message.get_content()


def test_a_failing_notifier_is_a_warning_never_an_error(smtp):
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))
    port = refused.getsockname()[1]
    refused.close()  # nothing listens there now
    broken = Webhook(status=500)
    warnings: list[str] = []
    try:
        url = f"http://127.0.0.1:{port}/hook"
        results = send([url, broken.url, "mailto:me@example.org"], EVENT, warn=warnings.append, timeout=3)
    finally:
        broken.close()
    assert results["mailto:me@example.org"] is None and len(smtp.messages) == 1, "the others still went out"
    assert "Connection refused" in results[url] and "500" in results[broken.url]
    assert len(warnings) == 2 and all(w.startswith("warning: could not notify http://127.0.0.1:") for w in warnings)
    assert not any("secret" in w for w in warnings), "a webhook's path (its secret) stays out of the log"


@pytest.mark.parametrize("text, message", [
    ("ftp://host/x", "invalid --notify 'ftp://host/x'"),
    ("https://", "no host in the URL"),
    ("http://host:port/x", "the port is not a number"),
    ("mailto:nobody", "'nobody' is not an email address"),
    ("mailto:", "is not an email address"),
    ("slack", "invalid --notify 'slack'"),
])
def test_a_target_that_does_not_parse_says_the_fix(text, message):
    with pytest.raises(UsageError, match=message) as err:
        parse_target(text)
    assert "mailto:" in str(err.value) or "e.g." in str(err.value)


def test_targets_from_the_setting_keep_mailto_lists_together():
    assert parse_targets(["https://hooks.example/x, mailto:a@x.org,b@x.org, desktop"]) == (
        "https://hooks.example/x", "mailto:a@x.org,b@x.org", "desktop")


def test_desktop_without_notify_send_is_silent(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert send(["desktop"], EVENT) == {"desktop": None}
