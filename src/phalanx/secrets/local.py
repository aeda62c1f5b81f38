"""This user's secrets on this machine: one JSON file of mode 0600, owned by the user, in a directory
no one else may write (``$XDG_CONFIG_HOME/phalanx/secrets.json``, default ``~/.config/phalanx/``;
the ``secrets_file`` setting moves it). It lies outside ``$PHALANX_HOME`` on purpose: the home holds
the job store and job directories, which are shared, copied and uploaded; this file never is.

Where the OS keyring is present (the optional ``keyring`` package with a usable backend: GNOME
Keyring, KWallet, macOS Keychain, ...), values go there and the file keeps only names, owners and
dates; otherwise the file holds the values too. The ``secrets_store`` setting picks: ``auto``
(default), ``file`` or ``keyring``. A file whose mode or owner is wrong is refused, in one line,
never read: anyone who could read or replace it could read or replace the values.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..errors import SecretError
from .base import NAME, SCOPED, SecretInfo, SecretStore, check_name, check_value

VERSION = 1
SERVICE = "phalanx"  # the keyring's service name; each secret's name is its user name there


def default_path() -> Path:
    """Where this user's secrets file is (``config.secrets_file``: the ``secrets_file`` setting, else
    under the user's config directory)."""
    from .. import config

    return config.secrets_file()


def usable_keyring() -> Any:
    """The ``keyring`` module when it is installed and has a backend that keeps values (not its
    "fail" backend, which is all a machine without a keyring daemon has); else None."""
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        return None
    try:
        backend = keyring.get_keyring()
    except Exception:  # noqa: BLE001 - a broken keyring configuration is no keyring
        return None
    if isinstance(backend, fail.Keyring) or getattr(backend, "priority", 0) <= 0:
        return None
    return keyring


def open_store() -> "LocalStore":
    """This user's store, as the settings say (``secrets_file``, ``secrets_store``)."""
    from .. import config

    choice = str(config.get("secrets_store") or "auto").strip().lower()
    if choice not in ("auto", "file", "keyring"):
        raise SecretError(f"setting secrets_store is '{choice}'", "use auto, file or keyring")
    ring = None if choice == "file" else usable_keyring()
    if choice == "keyring" and ring is None:
        raise SecretError("setting secrets_store is keyring, but no usable OS keyring is here",
                          "install phalanx[secrets] where a keyring daemon runs, or set secrets_store to auto")
    return LocalStore(default_path(), ring)


class LocalStore(SecretStore):
    """The file at ``path``; values in ``keyring`` (a module) when given, else in the file."""

    def __init__(self, path: Path, keyring: Any = None) -> None:
        self.path = path
        self.keyring = keyring
        self.where = f"the secrets of this user ({path})"

    # -- the interface -------------------------------------------------------------------------

    def set(self, name: str, value: str, owner: str) -> bool:
        check_name(name)
        check_value(value)
        if SCOPED.match(name):
            raise SecretError(f"'{name}' names a project's secret, which lives on a team server",
                              "give a name without '/' for a secret of your own")
        with self._locked():
            data = self._read()
            entries = data["secrets"]
            old = entries.get(name)
            now = time.time()
            entry = {"owner": owner, "created": old["created"] if old else now, "updated": now}
            if self.keyring is not None:
                self.keyring.set_password(SERVICE, name, value)
                entry["where"] = "keyring"
            else:
                entry.update(where="file", value=value)
                if old and old.get("where") == "keyring":
                    self._forget_in_keyring(name)
            entries[name] = entry
            self._write(data)
        return old is None

    def get(self, name: str) -> str:
        if SCOPED.match(name):
            raise SecretError(f"'{name}' names a project's secret, which lives on a team server; none is in use here",
                              "give the name of a secret of your own: phalanx secret list")
        if not NAME.match(name):
            raise SecretError(f"'{name}' cannot name a secret of this machine (letters, digits and _.-)",
                              "names with / or : belong to AWS Secrets Manager: on the sagemaker backend add "
                              "--secrets-from aws")
        entry = self._read()["secrets"].get(name)
        if entry is None:
            raise self.missing(name)
        if entry.get("where") != "keyring":
            return str(entry["value"])
        if self.keyring is None:
            raise SecretError(f"secret '{name}' is kept in the OS keyring, which cannot be reached here",
                              "run where the keyring is (install phalanx[secrets]), or set it again: "
                              f"phalanx secret set {name}")
        value = self.keyring.get_password(SERVICE, name)
        if value is None:
            raise SecretError(f"the OS keyring holds no value for secret '{name}' (removed outside phalanx?)",
                              f"set it again: phalanx secret set {name}")
        return str(value)

    def list(self) -> list[SecretInfo]:
        entries = self._read()["secrets"]
        return [SecretInfo(name, str(e.get("owner", "")), float(e.get("created", 0)), float(e.get("updated", 0)),
                           str(e.get("where", "file"))) for name, e in sorted(entries.items())]

    def remove(self, name: str) -> bool:
        check_name(name)
        with self._locked():
            data = self._read()
            entry = data["secrets"].pop(name, None)
            if entry is None:
                return False
            self._write(data)
        self._forget_in_keyring(name)  # also a copy left there when the value moved to the file
        return True

    # -- the file ------------------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        """The file's content, after checking who may read and replace it. No file: empty."""
        self._check_directory(create=False)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {"version": VERSION, "secrets": {}}
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SecretError(f"{self.path} is a symbolic link; phalanx reads secrets only from a file of its own",
                                  "replace the link with the file itself (mode 600)") from None
            raise SecretError(f"cannot read {self.path}: {exc.strerror}", "check the file's permissions") from None
        with os.fdopen(fd, "rb") as fh:
            self._check_file(os.fstat(fh.fileno()))  # of the file opened, not of whatever the name names later
            raw = fh.read()
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or not isinstance(data.get("secrets"), dict):
                raise ValueError("no 'secrets' mapping")
        except ValueError:
            raise SecretError(f"{self.path} is not a secrets file phalanx wrote",
                              "move it aside; secrets are set again with: phalanx secret set NAME") from None
        if int(data.get("version", 1)) > VERSION:
            raise SecretError(f"{self.path} was written by a newer phalanx", "upgrade phalanx")
        return data

    def _check_file(self, info: os.stat_result) -> None:
        if not stat.S_ISREG(info.st_mode):
            raise SecretError(f"{self.path} is not a regular file", "move it aside")
        if info.st_uid != os.geteuid():
            raise SecretError(f"{self.path} belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()}); "
                              "phalanx will not read secrets from it", "chown it to yourself, or move it aside")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise SecretError(f"{self.path} is open to other users (mode {mode:o}); phalanx will not read secrets "
                              "from it", f"chmod 600 {self.path}, and change the secrets in it if others could read them")

    def _check_directory(self, create: bool) -> None:
        folder = self.path.parent
        if create:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            info = os.stat(folder)
        except FileNotFoundError:
            return
        if info.st_uid not in (os.geteuid(), 0) or stat.S_IMODE(info.st_mode) & 0o022:
            raise SecretError(f"{folder} may be written by other users (mode {stat.S_IMODE(info.st_mode):o}, uid "
                              f"{info.st_uid}), so they could replace the secrets file in it",
                              f"chmod go-w {folder}, or move the file with the secrets_file setting")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time (two ``secret set`` at once both land)."""
        import fcntl

        self._check_directory(create=True)
        fd = os.open(f"{self.path}.lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, data: dict[str, Any]) -> None:
        """Replace the file whole (a reader sees the old one or the new one), born 0600."""
        data["version"] = VERSION
        text = json.dumps(data, indent=1, sort_keys=True) + "\n"
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _forget_in_keyring(self, name: str) -> None:
        if self.keyring is None:
            return
        try:
            self.keyring.delete_password(SERVICE, name)
        except Exception:  # noqa: BLE001 - not there (PasswordDeleteError) is what we want
            pass
