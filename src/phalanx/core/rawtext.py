"""Text that came from bytes: file names and arguments that are not UTF-8.

Python reads such bytes (``sys.argv``, ``os.listdir``, ``git ls-files`` decoded as python does)
into ``str`` with each undecodable byte as a lone surrogate, U+DC80 to U+DCFF (PEP 383's
``surrogateescape``). Those strings go back to the same bytes through ``os.fsencode`` and every
``os`` call, so the snapshot, the launch files (JSON escapes them) and the script's ``sys.argv``
keep them as they were. What cannot hold them is text for people and text-only stores: a
terminal under a strict UTF-8 locale, SQLite's TEXT columns, a UTF-8 HTTP body. There they are
shown, never dropped nor raised on:

- ``escaped`` / ``unescaped``: each undecodable byte as ``\\xNN`` (as ``ls -b`` shows it), and back;
- ``shell_join`` / ``shell_split``: a command line whose words with such bytes are quoted as bash's
  ``$'...'`` (pasted into a shell, it gives the bytes back), and read back;
- ``show_streams``: stdout and stderr that write such text as ``escaped`` does (the CLI's).

Standard library only; nothing here but ``show_streams`` has effects.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Iterable


def is_clean(text: str) -> bool:
    """Whether ``text`` is plain Unicode (no byte that was not UTF-8, no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def to_bytes(text: str) -> bytes:
    """The bytes ``text`` was read from (``os.fsencode`` on POSIX, whatever the locale); a
    surrogate that stands for no byte (from JSON, say) as the three bytes UTF-8 would give it."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def escaped(text: str) -> str:
    """``text`` with each undecodable byte as ``\\xNN``; plain text unchanged."""
    if is_clean(text):
        return text
    return to_bytes(text).decode("utf-8", "backslashreplace")


def shell_quote(word: str) -> str:
    """One word as a shell would need it: ``shlex.quote``, or ``$'...'`` (bash, zsh, ksh; POSIX
    since 2024) for a word holding bytes that are not UTF-8, so that pasting it gives those bytes."""
    if is_clean(word):
        return shlex.quote(word)
    out = []
    for char in to_bytes(word).decode("utf-8", "surrogateescape"):
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char in "\\'":
            out.append("\\" + char)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        else:
            out.append(char)
    return "$'" + "".join(out) + "'"


def shell_join(words: Iterable[str]) -> str:
    """``shlex.join`` that keeps bytes that are not UTF-8 (see ``shell_quote``)."""
    return " ".join(shell_quote(w) for w in words)




def shell_split(command: str) -> list[str]:
    """``shlex.split`` that also reads bash's ``$'...'`` words, so it reads back what
    ``shell_join`` wrote: ``\\xNN`` gives its byte again. Raises ValueError as shlex does."""
    if "$'" not in command:
        return shlex.split(command)
    words: list[str] = []
    word: list[bytes] | None = None  # the word being read, as bytes; None between words
    i, n = 0, len(command)
    while i < n:
        char = command[i]
        if char.isspace():
            if word is not None:
                words.append(b"".join(word).decode("utf-8", "surrogateescape"))
                word = None
            i += 1
            continue
        word = word if word is not None else []
        if command.startswith("$'", i):
            i = _ansi_c(command, i + 2, word)
        elif char in "'\"":
            end = command.find(char, i + 1)
            while char == '"' and end > 0 and command[end - 1] == "\\":
                end = command.find(char, end + 1)
            if end < 0:
                raise ValueError("No closing quotation")
            body = command[i + 1:end]
            word.append(to_bytes(re.sub(r'\\([$`"\\])', r"\1", body) if char == '"' else body))
            i = end + 1
        elif char == "\\" and i + 1 < n:
            word.append(to_bytes(command[i + 1]))
            i += 2
        else:
            word.append(to_bytes(char))
            i += 1
    if word is not None:
        words.append(b"".join(word).decode("utf-8", "surrogateescape"))
    return words


def _ansi_c(command: str, i: int, word: list[bytes]) -> int:
    """Read the body of a ``$'...'`` word from ``i`` into ``word``; returns where it ends."""
    simple = {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\", "'": b"'", '"': b'"', "a": b"\a", "b": b"\b",
              "e": b"\x1b", "f": b"\f", "v": b"\v"}
    while i < len(command):
        char = command[i]
        if char == "'":
            return i + 1
        if char == "\\" and i + 1 < len(command):
            code = command[i + 1]
            hexes = re.match(r"[0-9a-fA-F]{1,2}", command[i + 2:i + 4]) if code == "x" else None
            if hexes:
                word.append(bytes([int(hexes.group(0), 16)]))
                i += 2 + len(hexes.group(0))
                continue
            word.append(simple.get(code, to_bytes("\\" + code)))
            i += 2
            continue
        word.append(to_bytes(char))
        i += 1
    raise ValueError("No closing quotation")


SHOWN = "phalanx.shown"  # an error handler for text streams: ``escaped`` for what they cannot encode


def _shown(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    bad = error.object[error.start:error.end]
    return "".join(f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else c.encode("ascii", "backslashreplace")
                   .decode("ascii") for c in bad), error.end


def show_streams(*streams: object) -> None:
    """Make text ``streams`` (stdout, stderr) write what their encoding cannot hold as
    ``escaped`` does, instead of raising (stdout under a UTF-8 locale) or showing the surrogate
    (stderr's ``\\udce9``): a terminal is shown ``caf\\xe9.txt``."""
    import codecs

    try:
        codecs.lookup_error(SHOWN)
    except LookupError:
        codecs.register_error(SHOWN, _shown)
    for stream in streams:
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) in ("strict", "backslashreplace"):
            reconfigure(errors=SHOWN)


def unescaped(text: str) -> str:
    """What ``escaped`` was given: each ``\\xNN`` of a byte from 0x80 up as that byte again."""
    if "\\x" not in text:
        return text
    raw = re.sub(r"\\x([89a-fA-F][0-9a-fA-F])", lambda m: chr(0xDC00 + int(m.group(1), 16)), text)
    return to_bytes(raw).decode("utf-8", "surrogateescape")


def escaped_all(data: Any) -> Any:
    """``data`` (JSON-like: dicts, lists, strings) with every string ``escaped``."""
    if isinstance(data, str):
        return escaped(data)
    if isinstance(data, dict):
        return {escaped_all(k): escaped_all(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [escaped_all(v) for v in data]
    return data
