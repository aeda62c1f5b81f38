"""Secret values masked in what the ranks print: every occurrence becomes ``********``.

Masking is on the byte stream, not on lines: a value written in two pieces (two ``write`` calls,
a flush between them), inside a progress bar redrawn with ``\\r``, or across a read boundary is
still found, because the end of what came so far is held back while it could be the start of a
value, and released once the next bytes show it is not (or when the stream ends).

Which environment variables hold secrets is said by name in ``PHALANX_SECRET_VARS`` (comma-
separated), so a process that has the values (a rank, its bootstrap) knows what to mask without
any record holding them. Standard library only: every worker's bootstrap imports this.
"""

from __future__ import annotations

import os

MASK = b"********"
VARS_ENV = "PHALANX_SECRET_VARS"
HELD_MASKED = 5  # held bytes at the end of a stream from this many on are masked


def secret_values(environ: "os._Environ[str] | dict[str, str]") -> list[bytes]:
    """The values of the variables ``PHALANX_SECRET_VARS`` names, as bytes (empty ones skipped)."""
    names = [n for n in environ.get(VARS_ENV, "").split(",") if n]
    return [os.fsencode(environ[n]) for n in names if environ.get(n)]


class Masker:
    """Feed bytes in order, get them back masked; ``flush`` at the end of the stream."""

    def __init__(self, values: "list[bytes]") -> None:
        # Longest first: where two values start at the same place, the longer is masked whole.
        self.values = sorted({v for v in values if v}, key=len, reverse=True)
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        if not self.values:
            return data
        buf = self._held + data
        out = bytearray()
        at = 0
        while True:
            found, value = -1, b""
            for candidate in self.values:
                where = buf.find(candidate, at)
                if where != -1 and (found == -1 or where < found):
                    found, value = where, candidate
            if found == -1:
                break
            out += buf[at:found]
            out += MASK
            at = found + len(value)
        rest = buf[at:]
        keep = self._could_start(rest)
        out += rest[: len(rest) - keep]
        self._held = rest[len(rest) - keep:] if keep else b""
        return bytes(out)

    def flush(self) -> bytes:
        """What was held back, now that no more bytes come: a value's first few bytes as written
        (a public prefix such as ``hf_`` says nothing), a longer start of one masked (a process
        killed while it printed a value must not leave most of it in the log)."""
        held, self._held = self._held, b""
        return MASK if len(held) >= HELD_MASKED else held

    def _could_start(self, rest: bytes) -> int:
        """The length of the longest end of ``rest`` that a value begins with (no value is in ``rest``)."""
        best = 0
        for value in self.values:
            for size in range(min(len(value) - 1, len(rest)), best, -1):
                if rest.endswith(value[:size]):
                    best = size
                    break
        return best


def mask_text(text: str, values: "list[bytes]") -> str:
    """``text`` with every value masked (a whole text: nothing held back)."""
    if not values:
        return text
    masker = Masker(values)
    raw = text.encode("utf-8", "surrogateescape")
    return (masker.feed(raw) + masker.flush()).decode("utf-8", "surrogateescape")
