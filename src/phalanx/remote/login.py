"""Which server this machine's commands go to: ``phalanx login URL`` keeps the URL and the token
in ``$XDG_CONFIG_HOME/phalanx/login.json`` (default ``~/.config/phalanx/``), readable by its
owner only (mode 0600, written atomically, never world-readable in between). ``PHALANX_SERVER``
and ``PHALANX_TOKEN`` (CI, containers) win over the file; ``PHALANX_CA_CERT`` names the CA
a server's certificate is checked against when the login does not.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError


@dataclass(frozen=True)
class Login:
    url: str
    token: str | None
    ca: str | None = None
    user: str | None = None
    source: str = "file"  # file | environment


def path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "phalanx" / "login.json"


def current() -> Login | None:
    """The login in effect: the environment's, else the file's, else None (this machine's store)."""
    url = os.environ.get("PHALANX_SERVER", "").strip()
    ca = os.environ.get("PHALANX_CA_CERT") or None
    if url:
        return Login(url.rstrip("/"), os.environ.get("PHALANX_TOKEN") or _file_token(url), ca, source="environment")
    data = _read()
    if not data.get("url"):
        return None
    return Login(str(data["url"]), data.get("token"), ca or data.get("ca"), data.get("user"))


def _file_token(url: str) -> str | None:
    """A token saved for this very server, when only ``PHALANX_SERVER`` was given."""
    data = _read()
    return data.get("token") if data.get("url") == url.rstrip("/") else None


def _read() -> dict[str, Any]:
    try:
        data = json.loads(path().read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the login in {path()}: {exc}", "log in again: phalanx login URL") from None
    return data if isinstance(data, dict) else {}


def save(login: Login) -> Path:
    """Write the login, mode 0600 from the first byte on."""
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = target.with_name(f".login.{os.getpid()}.json")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump({"url": login.url, "token": login.token, "ca": login.ca, "user": login.user}, out)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def forget() -> Login | None:
    """Remove the saved login; what it was (None: there was none)."""
    data = _read()
    path().unlink(missing_ok=True)
    return Login(str(data["url"]), None, user=data.get("user")) if data.get("url") else None
