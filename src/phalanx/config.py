"""Settings, declared once as data. Precedence: default < config file < environment < CLI.

The config file is ``$PHALANX_HOME/config.yaml`` (a flat mapping of the keys below).
Each setting's environment variable is ``PHALANX_<KEY>`` upper-cased.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class Setting:
    key: str
    default: Any
    parse: Callable[[str], Any]
    help: str

    @property
    def env_var(self) -> str:
        return f"PHALANX_{self.key.upper()}"


SETTINGS: tuple[Setting, ...] = (
    Setting("home", "~/.phalanx", str, "Directory holding the job store and job directories."),
    Setting("backend", "local", str, "Backend used when --backend is not given."),
    # The store (issue 22): empty for the SQLite file in the home; a team's PostgreSQL by URL.
    Setting("store", "", str, "Where the job store lives: empty for the SQLite file in the home (phalanx.db), "
            "postgresql://USER@HOST:PORT/DATABASE for a team's PostgreSQL (see docs/store.md; a password "
            "belongs in PGPASSWORD, ~/.pgpass or a service, not here)."),
    Setting("store_retry", 30.0, float, "Seconds a PostgreSQL store keeps retrying a lost connection before "
            "giving up (the database restarting)."),
    Setting("grace", 30.0, float, "Seconds a stopped job gets between SIGTERM and SIGKILL."),
    Setting("ps_limit", 50, int, "Rows `phalanx ps --all` shows unless --limit is given."),
    Setting("state_sync_interval", 60.0, float, "Seconds between uploads of the state directory to --state."),
    # The control room (issue 16): notifications, and prices for the estimated cost of jobs.
    Setting("notify", "", str, "Where job and sweep outcomes go when --notify is not given (comma-separated)."),
    Setting("smtp_host", "localhost", str, "SMTP server for mailto: notifications."),
    Setting("smtp_port", 25, int, "Its port."),
    Setting("smtp_security", "none", str, "none, starttls or ssl."),
    Setting("smtp_user", "", str, "SMTP login (none when empty)."),
    Setting("smtp_password", "", str, "SMTP password."),
    Setting("smtp_from", "", str, "The From address (default phalanx@HOST)."),
    Setting("prices", {}, lambda text: _mapping(text, "prices"),
            "Prices per hour: an instance type, a GPU model, or cpu, e.g. {ml.g5.xlarge: 1.41, H100: 2.5, cpu: 0.04}."),
    # Experiment trackers (issue 23)
    Setting("track", "", str, "Trackers every job sends to when --track is not given (comma-separated: mlflow, "
            "tensorboard, wandb)."),
    Setting("track_wait", 5.0, float, "Seconds a job's start waits at most for its MLflow run to exist (so "
            "MLFLOW_RUN_ID reaches the script); a tracker that is down never waits that long."),
    Setting("track_linger", 600.0, float, "Seconds the exporter keeps retrying a tracker that is down after the "
            "job ended; the points then wait on disk (phalanx status says how many)."),
    # Teams (issue 27): the project a job goes to when it names none, how long the audit log keeps
    # what happened, and what a budget check assumes of a job that has never run.
    Setting("project", "", str, "The project jobs are submitted to when --project is not given (else the server's "
            "default for the user, else 'default')."),
    Setting("audit_retention_days", 365.0, float, "Days the audit log keeps an event (0: forever)."),
    Setting("budget_estimate_hours", 1.0, float, "Hours a budget check assumes a job runs when no earlier job of its "
            "name in its project has ended."),
    Setting("warm", True, lambda text: text.strip().lower() not in ("0", "false", "no", "off", ""),
            "Start local runs and sweep trials from a warm interpreter pool (see docs/warm.md); --cold turns it off per run."),
    Setting("warm_idle", 10.0, float, "Minutes an idle warm pool waits for work before it exits."),
    Setting("warm_max_pools", 4, int, "Warm pools of this user at once: a new one stops the least recently used "
            "idle ones beyond this (0: no limit)."),
    Setting("metrics_ignore", "", str, "Names (or globs) the automatic metric pick-up leaves out, comma-separated: "
            "replaces the built-in list (docs/metrics.md); +NAME,... adds to it."),
    # Secrets (issue 27): where this user's secrets are kept (docs/secrets.md)
    Setting("secrets_file", "", str, "This user's secrets file (mode 0600; default $XDG_CONFIG_HOME/phalanx/secrets.json, "
            "~/.config/phalanx/secrets.json): outside the phalanx home on purpose."),
    Setting("secrets_store", "auto", str, "Where secret values go: auto (the OS keyring when one is usable, else the "
            "secrets file), file or keyring."),
)
_BY_KEY = {s.key: s for s in SETTINGS}


def _mapping(text: str, key: str) -> dict[str, float]:
    """A YAML mapping of name -> number (the config file's value arrives as its repr, which
    YAML reads too; the environment variable as YAML or JSON)."""
    import yaml

    from .errors import UsageError

    try:
        data = yaml.safe_load(text) if text.strip() else {}
        if not isinstance(data, dict):
            raise ValueError(text)
        return {str(k): float(v) for k, v in data.items()}
    except (yaml.YAMLError, ValueError, TypeError):
        raise UsageError(f"setting '{key}' must map names to numbers, not {text[:60]!r}",
                         f"e.g. {key}: {{H100: 2.5, cpu: 0.04}} in config.yaml") from None


def home() -> Path:
    """The phalanx home directory (``$PHALANX_HOME``, default ``~/.phalanx``). Raises UsageError
    when it cannot be one: a file is in the way, or its path is not UTF-8 (the store keeps paths
    as text)."""
    raw = os.environ.get("PHALANX_HOME") or _BY_KEY["home"].default
    path = Path(raw).expanduser().resolve()
    _check_home(path, "PHALANX_HOME" if os.environ.get("PHALANX_HOME") else "the phalanx home")
    return path


def secrets_file() -> Path:
    """This user's secrets file (``phalanx.secrets.local``): the ``secrets_file`` setting, else under
    the user's config directory (``$XDG_CONFIG_HOME``, default ``~/.config``). Here, below every
    floor, because code snapshots and bundles must leave it out wherever it lies."""
    given = str(get("secrets_file") or "")
    if given:
        return Path(given).expanduser().absolute()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base).absolute() / "phalanx" / "secrets.json"


def secrets_filter() -> Callable[[Path], bool]:
    """A test of whether a file is the secrets file, its lock or a copy being written
    (``.secrets.json.N.tmp``): what code snapshots and bundles leave out. Reads the setting once."""
    target = secrets_file()
    folder = os.path.realpath(target.parent)
    names = (target.name, f"{target.name}.lock")

    def matches(path: Path) -> bool:
        if path.name not in names and not path.name.startswith(f".{target.name}."):
            return False
        return os.path.realpath(path.parent) == folder

    return matches


def _check_home(path: Path, what: str) -> None:
    from .errors import UsageError

    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8, shown as core/rawtext.py shows them
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise UsageError(f"{what} {shown} is not UTF-8 text (the job store records paths as text)",
                         "set PHALANX_HOME to a directory whose path is UTF-8") from None
    for place in (path, *path.parents):  # the home, or the first of its parents that exists
        try:
            is_dir = place.is_dir()
            exists = is_dir or place.exists()
            if exists and not is_dir:  # made between the two looks (another thread creating the home)?
                is_dir = place.is_dir()
        except OSError:
            continue
        if not exists:
            continue
        if not is_dir:
            where = "is a file, not a directory" if place == path else f"cannot be created: {place} is a file"
            raise UsageError(f"{what} {path} {where}",
                             "set PHALANX_HOME to a directory (phalanx creates it), or move the file aside")
        return


def user() -> str:
    """Who phalanx acts for in this process: the login name (what a local job records as its
    ``user_name``, what ``ps --mine`` means; a team server passes its own user instead)."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid without a name (some containers)
        return str(os.getuid())


def _file_values() -> dict[str, Any]:
    path = home() / "config.yaml"
    if not path.exists():
        return {}
    import yaml

    from .errors import UsageError

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"cannot parse {path}: {exc}".splitlines()[0], "fix the YAML syntax") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} must be a mapping of setting: value", "see docs/settings.md")
    unknown = sorted(set(data) - set(_BY_KEY))
    if unknown:
        known = ", ".join(_BY_KEY)
        raise UsageError(f"unknown setting(s) {', '.join(unknown)} in {path}", f"known settings: {known}")
    return data


def get(key: str) -> Any:
    """Resolve one setting: environment beats the config file, which beats the default."""
    setting = _BY_KEY[key]
    if setting.env_var in os.environ:
        return setting.parse(os.environ[setting.env_var])
    values = _file_values()
    if key in values:
        value = values[key]
        return setting.parse(json.dumps(value) if isinstance(value, (dict, list)) else str(value))
    return setting.default
