"""Notifications: a job's or sweep's outcome sent where ``--notify`` says.

Targets (``--notify`` is repeatable; the ``notify`` setting is the default, comma-separated):

- ``https://...`` / ``http://...``: a webhook; POSTs Slack-compatible JSON (``{"text": ...}``,
  what Slack's incoming webhooks and most chat bridges read) with the event's fields under
  ``"phalanx"`` for other receivers;
- ``mailto:ADDR[,ADDR]``: an email through the SMTP server of the settings ``smtp_host``,
  ``smtp_port``, ``smtp_security`` (``none``, ``starttls``, ``ssl``), ``smtp_user``,
  ``smtp_password`` and ``smtp_from``;
- ``desktop``: ``notify-send`` (libnotify) when it is installed; nothing otherwise.

Events: ``succeeded``, ``failed`` (with the root cause), ``diverged`` (``--on-nan``), ``timeout``
(``--max-duration``, ``--idle-timeout``), ``stalled``, ``preempted``, ``retried`` (an attempt
failed, was preempted, stalled or diverged, and runs again), ``cancelled``, and a sweep's end.
A job's end carries a summary line: how far it got, in how long, its final metrics.
Sending never fails a job: each target gets a few seconds, and a failure is one warning line.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from ..core.grammar import notify_target, notify_targets
from ..core.optiontypes import BadValue
from ..errors import UsageError

TIMEOUT = 10.0  # seconds one target may take


@dataclass(frozen=True)
class Event:
    kind: str  # succeeded | failed | diverged | timeout | stalled | preempted | retried | cancelled | sweep
    title: str  # one line: "job 3f2a9c01 'resnet' failed: rank 1 (exit code 1): RuntimeError: ..."
    job: str
    name: str
    state: str
    detail: str = ""  # more lines: the traceback, a sweep's best trial
    url: str | None = None  # where to look: the dashboard page when it is known
    fields: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        return self.title + ("\n" + self.detail if self.detail else "")


def parse_target(text: str) -> str:
    """One ``--notify`` target, checked (UsageError on one that does not parse)."""
    try:
        return notify_target(text)
    except BadValue as exc:
        raise _usage(text, exc) from None


def parse_targets(texts: Iterable[str]) -> tuple[str, ...]:
    """Targets given one by one or comma-separated (the setting), checked, each once."""
    out: list[str] = []
    for text in texts:
        try:
            found = notify_targets(text)
        except BadValue as exc:
            raise _usage(text, exc) from None
        out += [t for t in found if t not in out]
    return tuple(out)


def _usage(text: str, exc: BadValue) -> UsageError:
    return UsageError(f"invalid --notify '{text}'" + (f": {exc.hint}" if exc.hint else ""), f"use {exc.expected}")


def default_targets() -> tuple[str, ...]:
    """The ``notify`` setting's targets (checked)."""
    from .. import config

    raw = str(config.get("notify") or "")
    return parse_targets([raw]) if raw.strip() else ()


# -- sending ---------------------------------------------------------------------------------


def send(targets: Iterable[str], event: Event, warn: Callable[[str], None] | None = None,
         timeout: float = TIMEOUT) -> dict[str, str | None]:
    """Send ``event`` to every target, in parallel; blocks at most about ``timeout`` seconds.
    Returns target -> None (sent) or the problem. Never raises."""
    targets = list(targets)
    results: dict[str, str | None] = {}

    def one(target: str) -> None:
        try:
            _sender(target)(target, event, timeout)
            results[target] = None
        except Exception as exc:  # noqa: BLE001 - a notifier must never take the job down
            results[target] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=one, args=(t,), name="phalanx-notify", daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 2)
    for target in targets:
        problem = results.get(target, f"no answer within {timeout:g}s")
        results[target] = problem
        if problem and warn is not None:
            warn(f"warning: could not notify {_shown(target)}: {problem}")
    return results


def _shown(target: str) -> str:
    """A target as a log line may show it: a webhook's path often is its secret."""
    parts = urlsplit(target)
    return f"{parts.scheme}://{parts.netloc}/..." if parts.scheme in ("http", "https") else target


def _sender(target: str) -> Callable[[str, Event, float], None]:
    if target == "desktop":
        return _desktop
    if target.startswith("mailto:"):
        return _email
    return _webhook


def payload(event: Event) -> dict[str, Any]:
    """The webhook's JSON: Slack's ``text`` (mrkdwn) and the event's fields."""
    text = f"*{event.title}*"
    if event.detail:
        text += "\n```" + event.detail[-2500:] + "```"
    if event.url:
        text += f"\n<{event.url}|open in the dashboard>"
    return {"text": text, "phalanx": {k: v for k, v in asdict(event).items() if v not in (None, "", {})}}


def _webhook(target: str, event: Event, timeout: float) -> None:
    import urllib.request

    body = json.dumps(payload(event)).encode()
    request = urllib.request.Request(target, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "phalanx"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the user's own URL
        if response.status >= 300:
            raise OSError(f"HTTP {response.status}")


def _email(target: str, event: Event, timeout: float) -> None:
    import smtplib
    import socket
    from email.message import EmailMessage

    from .. import config

    message = EmailMessage()
    message["Subject"] = f"[phalanx] {event.title}"[:200]
    message["From"] = str(config.get("smtp_from") or f"phalanx@{socket.gethostname()}")
    message["To"] = ", ".join(target[len("mailto:"):].split(","))
    message.set_content(event.text() + (f"\n\n{event.url}" if event.url else "") + "\n")
    host, port = str(config.get("smtp_host")), int(config.get("smtp_port"))
    security = str(config.get("smtp_security"))
    smtp_class = smtplib.SMTP_SSL if security == "ssl" else smtplib.SMTP
    with smtp_class(host, port, timeout=timeout) as smtp:
        if security == "starttls":
            smtp.starttls()
        user = config.get("smtp_user")
        if user:
            smtp.login(str(user), str(config.get("smtp_password") or ""))
        smtp.send_message(message)


def _desktop(target: str, event: Event, timeout: float) -> None:
    import shutil

    from ..backends.commands import run

    if shutil.which("notify-send") is None:
        return  # no desktop here (a server): nothing to show it on, and nothing to warn about
    urgency = "critical" if event.kind in ("failed", "stalled", "diverged") else "normal"
    done = run(["notify-send", "--app-name=phalanx", f"--urgency={urgency}", event.title, event.detail[-500:]],
               timeout=timeout)
    if done.returncode != 0:
        raise OSError(done.stderr.strip() or f"notify-send exited with {done.returncode}")
