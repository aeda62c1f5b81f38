"""Settings, declared once as data. Precedence: default < config file < environment < CLI.

The config file is ``$PHALANX_HOME/config.yaml`` (a flat mapping of the keys below).
Each setting's environment variable is ``PHALANX_<KEY>`` upper-cased.
"""

from __future__ import annotations

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
    Setting("grace", 30.0, float, "Seconds a stopped job gets between SIGTERM and SIGKILL."),
    Setting("ps_limit", 50, int, "Rows `phalanx ps --all` shows unless --limit is given."),
    Setting("state_sync_interval", 60.0, float, "Seconds between uploads of the state directory to --state."),
    Setting("warm", True, lambda text: text.strip().lower() not in ("0", "false", "no", "off", ""),
            "Start local runs and sweep trials from a warm interpreter pool (see README, Warm starts); --cold turns it off per run."),
    Setting("warm_idle", 10.0, float, "Minutes an idle warm pool waits for work before it exits."),
)
_BY_KEY = {s.key: s for s in SETTINGS}


def home() -> Path:
    """The phalanx home directory (``$PHALANX_HOME``, default ``~/.phalanx``)."""
    raw = os.environ.get("PHALANX_HOME") or _BY_KEY["home"].default
    return Path(raw).expanduser().resolve()


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
        raise UsageError(f"{path} must be a mapping of setting: value", "see docs/configuration.md")
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
        return setting.parse(str(values[key]))
    return setting.default
