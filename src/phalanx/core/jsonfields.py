"""Typed access to the JSON objects of ``core/contracts.py``: errors that name the file and the
field, and the format version every contract file carries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

from ..errors import ContractError

VERSION = 1  # of every file in core/contracts.py; a file without one is version 1
HINT = "the file was not written by this phalanx version (or was edited); move it aside to go on"

_MISSING: Any = object()


class Fields:
    """Typed access to one JSON object, with errors that name the file and the field."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise ContractError(f"{where}: expected a JSON object, got {type(data).__name__}", HINT)
        self.data, self.where = data, where
        version = data.get("version", 1)
        if not isinstance(version, int) or isinstance(version, bool):
            self.fail("version", "a whole number", version)
        if version > VERSION:
            raise ContractError(f"{where} was written by a newer phalanx (format {version}, this one reads {VERSION})",
                                "upgrade phalanx to read it")

    def fail(self, key: str, expected: str, value: Any) -> NoReturn:
        raise ContractError(f"{self.where}: '{key}' must be {expected}, not {value!r}", HINT)

    def whole(self, key: str, default: Any = _MISSING) -> Any:
        value = self.data.get(key, default)
        if value is _MISSING:
            self.fail(key, "present (a whole number)", None)
        if value is None and default is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(key, "a whole number", value)
        return value

    def number(self, key: str, default: Any = _MISSING) -> Any:
        value = self.data.get(key, default)
        if value is _MISSING:
            self.fail(key, "present (a number)", None)
        if value is None and default is None:
            return None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            self.fail(key, "a number", value)
        return float(value)

    def text(self, key: str, default: Any = _MISSING) -> Any:
        value = self.data.get(key, default)
        if value is _MISSING:
            self.fail(key, "present (a string)", None)
        if value is None and default is None:
            return None
        if not isinstance(value, str):
            self.fail(key, "a string", value)
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            self.fail(key, "true or false", value)
        return value

    def items(self, key: str) -> list[Any]:
        value = self.data.get(key) or []
        if not isinstance(value, list):
            self.fail(key, "a list", value)
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.data.get(key) or {}
        if not isinstance(value, dict):
            self.fail(key, "an object", value)
        return value



def load(path: Path) -> Any:
    """The JSON in ``path``; None when the file does not exist."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ContractError(f"{path} is not valid JSON ({exc})", HINT) from None
