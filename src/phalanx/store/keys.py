"""Keys of the store's reads: id prefixes as index ranges, listing cursors, active states."""

from __future__ import annotations

from typing import Any, Sequence

from ..core.rawtext import escaped
from ..core.state import TERMINAL, JobState
from ..errors import UsageError

# The states of jobs that have not ended, named: few rows, found through the state index.
ACTIVE: tuple[str, ...] = tuple(s.value for s in JobState if s not in TERMINAL)


def prefix_range(prefix: str) -> tuple[str, str]:
    """``[low, high)`` holding exactly the texts that start with ``prefix``, so a lookup by
    prefix is a range of the id index (SQLite compares TEXT as UTF-8 bytes, which keeps
    code point order; a LIKE with ESCAPE reads every row instead). A prefix with bytes that are
    not UTF-8 is the range of its shown form, as the store holds such text (``sql.TextConnection``)."""
    prefix = escaped(prefix)
    stem = prefix
    while stem and ord(stem[-1]) >= 0x10FFFF:
        stem = stem[:-1]  # nothing sorts after U+10FFFF: the range ends after the shorter stem
    if not stem:
        return prefix, "\U0010ffff" * 2
    last = ord(stem[-1]) + 1
    if 0xD800 <= last <= 0xDFFF:  # surrogates are no text: skip over them
        last = 0xE000
    return prefix, stem[:-1] + chr(last)


def encode_cursor(created_at: float, row_id: str) -> str:
    """A listing position: after (created_at, id), newest first. ``repr`` keeps the float exact."""
    return f"{created_at!r}~{row_id}"


def decode_cursor(cursor: str) -> tuple[float, str]:
    created, sep, row_id = cursor.partition("~")
    try:
        if not sep:
            raise ValueError(cursor)
        return float(created), row_id
    except ValueError:
        raise UsageError(f"invalid page cursor '{cursor}'", "pass the 'next' value of the previous page") from None


def scope(projects: Sequence[str] | None) -> tuple[str, list[Any]]:
    """The condition (and its parameters) that keeps a lookup inside ``projects`` (None: all)."""
    if projects is None:
        return "", []
    if not projects:
        return " AND 0 = 1", []
    return f" AND project IN ({', '.join('?' for _ in projects)})", list(projects)
