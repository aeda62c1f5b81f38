"""What the store's tables share: the store as they see it, text bound in a form both engines hold
(``TextConnection``, ``bindable``); id prefixes are index ranges: ``keys``."""

from __future__ import annotations

import sqlite3
from typing import Any, Iterable, Protocol

from ..core.state import JobState
from .engine import Engine


class Writer(Protocol):
    """The store as its tables see it (``db.Store``): its engine, and the writes they share."""

    engine: Engine

    def _write(self, sql: str, params: Iterable[Any] = ()) -> int: ...

    def _transition(self, table: str, row_id: str, new: JobState, fields: dict[str, Any]) -> bool: ...


class TextConnection(sqlite3.Connection):
    """A connection whose text parameters are always text SQLite can hold: a string with bytes
    that are not UTF-8 (a file name or argument, read by python as surrogates, PEP 383; see
    ``core/rawtext.py``) is bound as its shown form, each such byte as ``\\xNN``, where sqlite3
    would raise UnicodeEncodeError. A lookup by the same string binds the same form, so it finds
    the row. The exact bytes live where JSON keeps them (``spec_json``, ``params_json``)."""

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:  # type: ignore[override]
        return super().execute(sql, bindable(parameters))

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any], /) -> sqlite3.Cursor:  # type: ignore[override]
        return super().executemany(sql, (bindable(p) for p in seq_of_parameters))


def bindable(parameters: Any) -> Any:
    """Parameters with every text in a form either engine can hold (``TextConnection``; the
    PostgreSQL engine binds through it too)."""
    if isinstance(parameters, dict):
        return {k: _text(v) for k, v in parameters.items()}
    return tuple(_text(v) for v in parameters)


def _text(value: Any) -> Any:
    if type(value) is not str or value.isascii():
        return value
    from ..core.rawtext import escaped

    return escaped(value)
