"""A rank's metrics on disk: compact blocks of columns (``rank_<r>/metrics.bin``), and the JSON
lines older phalanx versions wrote (``metrics.jsonl``), read alike.

The collector appends one block per poll (one ``write``), holding the values it found since the
previous poll, grouped by metric name::

    block   := "PXM1" | u8 flags | u32 size | u32 crc32(body) | body | u32 size
    body    := f64 time | u32 sections | section...       (zlib-compressed when flags & 1)
    section := u16 name length | name (UTF-8) | u32 n |
               u32 seq[n] | i64 step[n] | i64 epoch[n]     (each column's bytes as planes)
               f64 value[n]                                 (as is)

``time`` is when the collector read the lines (within one poll interval of when they were
printed), ``seq`` the record's place in the block (so records come back in the order they were
printed, across names), ``step``/``epoch`` are :data:`NONE` where the line had none. Columns
are little-endian. Integer columns are stored as byte planes (every value's first byte, then
every second byte, ...): neighbouring steps differ in their low byte only, so the other planes
are runs zlib all but erases. Values are stored as they are: printed numbers repeat, and zlib
finds whole repeated values. A million printed lines take a few MB instead of 190 MB of JSON.

The size at both ends lets a reader walk back from the end (the recent records, for hints);
the CRC lets it tell a block being written from a complete one. A block never spans polls, and
each block names its own metrics, so reading can start at any block boundary (``offset``).
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

MAGIC = b"PXM1"
NONE = -(2**63)  # a step or epoch the line did not have
_HEAD = struct.Struct("<4sBII")  # magic, flags, body size, crc32
_FOOT = struct.Struct("<I")
_SECTION = struct.Struct("<H")
_COUNT = struct.Struct("<I")
_TIME = struct.Struct("<d")
_COMPRESSED = 1
COMPRESS_FROM = 96  # bytes of body below which zlib's own header costs more than it saves
_SWAP = sys.byteorder == "big"


@dataclass
class Columns:
    """One metric's records of one block (or, read back, of a whole file)."""

    seq: array = field(default_factory=lambda: array("I"))
    steps: array = field(default_factory=lambda: array("q"))
    epochs: array = field(default_factory=lambda: array("q"))
    values: array = field(default_factory=lambda: array("d"))


@dataclass
class Block:
    time: float
    columns: dict[str, Columns]
    end: int  # file offset just after the block


def encode_block(time: float, columns: dict[str, Columns]) -> bytes:
    """One block holding ``columns`` (name -> its records), read at ``time``."""
    parts = [_TIME.pack(time), _COUNT.pack(len(columns))]
    for name, col in columns.items():
        raw = name.encode("utf-8", errors="replace")[:0xFFFF]
        parts += [_SECTION.pack(len(raw)), raw, _COUNT.pack(len(col.values)),
                  _planes(col.seq), _planes(col.steps), _planes(col.epochs), _bytes(col.values)]
    body = b"".join(parts)
    flags = 0
    if len(body) >= COMPRESS_FROM:
        packed = zlib.compress(body, 1)
        if len(packed) < len(body):
            body, flags = packed, _COMPRESSED
    return _HEAD.pack(MAGIC, flags, len(body), zlib.crc32(body)) + body + _FOOT.pack(len(body))


def _bytes(column: array) -> bytes:
    if _SWAP:
        column = array(column.typecode, column)
        column.byteswap()
    return column.tobytes()


def _planes(column: array) -> bytes:
    raw, width = _bytes(column), column.itemsize
    return b"".join(raw[i::width] for i in range(width))


def _unplanes(data: bytes, typecode: str, n: int) -> array:
    width = array(typecode).itemsize
    raw = bytearray(n * width)
    for i in range(width):
        raw[i::width] = data[i * n:(i + 1) * n]
    column = array(typecode)
    column.frombytes(bytes(raw))
    if _SWAP:
        column.byteswap()
    return column


def _decode_body(body: bytes, names: Iterable[str] | None) -> tuple[float, dict[str, Columns]]:
    wanted = None if names is None else set(names)
    time = _TIME.unpack_from(body, 0)[0]
    count = _COUNT.unpack_from(body, 8)[0]
    pos, columns = 12, {}
    for _ in range(count):
        size = _SECTION.unpack_from(body, pos)[0]
        name = body[pos + 2:pos + 2 + size].decode("utf-8", errors="replace")
        pos += 2 + size
        n = _COUNT.unpack_from(body, pos)[0]
        pos += 4
        ends = (pos + 4 * n, pos + 12 * n, pos + 20 * n, pos + 28 * n)
        if wanted is None or name in wanted:
            values = array("d")
            values.frombytes(body[ends[2]:ends[3]])
            if _SWAP:
                values.byteswap()
            columns[name] = Columns(_unplanes(body[pos:ends[0]], "I", n), _unplanes(body[ends[0]:ends[1]], "q", n),
                                    _unplanes(body[ends[1]:ends[2]], "q", n), values)
        pos = ends[3]
    return time, columns


def _parse(data: bytes, base: int, names: Iterable[str] | None) -> Iterator[Block]:
    """Complete blocks in ``data`` (which starts at file offset ``base`` on a block boundary).
    Stops at a block still being written; skips over anything that is no block (a torn write
    followed by good blocks) to the next one that is."""
    pos = 0
    while pos + _HEAD.size + _FOOT.size <= len(data):
        magic, flags, size, crc = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + size + _FOOT.size
        if magic == MAGIC and end <= len(data):
            body = data[pos + _HEAD.size:end - _FOOT.size]
            if zlib.crc32(body) == crc and _FOOT.unpack_from(data, end - _FOOT.size)[0] == size:
                if flags & _COMPRESSED:
                    body = zlib.decompress(body)
                time, columns = _decode_body(body, names)
                yield Block(time, columns, base + end)
                pos = end
                continue
        if magic == MAGIC and end > len(data) and data.find(MAGIC, pos + 1) < 0:
            return  # the last block is still being written: read it next time
        following = data.find(MAGIC, pos + 1)
        if following < 0:
            return
        pos = following


def read_blocks(path: Path, offset: int = 0, names: Iterable[str] | None = None) -> tuple[list[Block], int]:
    """Complete blocks from ``offset`` (a block boundary: 0, or an earlier call's result), only
    the columns of ``names`` if given; returns them and the offset to continue from."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return [], offset
    blocks = list(_parse(data, offset, names))
    return blocks, blocks[-1].end if blocks else offset


def iter_blocks(path: Path, offset: int = 0) -> Iterator[Block]:
    """Complete blocks from ``offset`` (a block boundary), each decoded only when the caller gets
    to it: a reader that stops early (an exporter sending a bounded batch) decodes no more."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return
    yield from _parse(data, offset, None)


def tail_blocks(path: Path, max_bytes: int) -> list[Block]:
    """The last blocks of ``path``, about ``max_bytes`` of them (at least one)."""
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, 2)
            start = end
            while start > 0 and end - start < max_bytes:
                fh.seek(max(0, start - _FOOT.size))
                size = _FOOT.unpack(fh.read(_FOOT.size))[0] if start >= _FOOT.size else -1
                begin = start - _FOOT.size - size - _HEAD.size
                fh.seek(max(0, begin))
                if begin < 0 or fh.read(4) != MAGIC:
                    break  # not a block boundary (one being written): start from what was found
                start = begin
            if start == end and end:  # no complete block found from the end: read it all
                start = 0
            fh.seek(start)
            data = fh.read()
    except OSError:
        return []
    return list(_parse(data, start, None))


# -- records: what readers that want one dict per value get ---------------------------------


def block_records(block: Block, rank: int, attempt: int) -> list[dict[str, Any]]:
    """The block's records in the order they were printed, as ``metrics.jsonl`` held them."""
    out: list[tuple[int, dict[str, Any]]] = []
    t = round(block.time, 3)
    for name, col in block.columns.items():
        for seq, step, epoch, value in zip(col.seq, col.steps, col.epochs, col.values):
            out.append((seq, {"name": name, "value": value, "step": None if step == NONE else step,
                              "epoch": None if epoch == NONE else epoch, "rank": rank, "attempt": attempt, "time": t}))
    out.sort(key=lambda pair: pair[0])
    return [r for _, r in out]


def legacy(path: Path) -> bool:
    """A ``metrics.jsonl`` of an older phalanx (JSON lines), rather than blocks."""
    return path.suffix == ".jsonl"


def read_records(path: Path, rank: int, attempt: int, offset: int = 0,
                 names: Iterable[str] | None = None) -> tuple[list[dict[str, Any]], int]:
    """Records of either format from ``offset``; returns them and the offset to continue from."""
    if legacy(path):
        records, offset = read_jsonl(path, offset)
        wanted = None if names is None else set(names)
        return [r for r in records if wanted is None or r.get("name") in wanted], offset
    blocks, offset = read_blocks(path, offset, names)
    return [r for b in blocks for r in block_records(b, rank, attempt)], offset


def iter_records(path: Path, rank: int, attempt: int) -> Iterator[dict[str, Any]]:
    """Every record of a file (either format), a block (or a line) at a time: for exports,
    which must not hold millions of dicts at once."""
    if legacy(path):
        try:
            with open(path, "rb") as fh:
                for line in fh:
                    if line.endswith(b"\n"):  # a line still being written is not a record yet
                        yield from _parse_lines(line)
        except OSError:
            return
        return
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return
    for block in _parse(data, 0, None):
        yield from block_records(block, rank, attempt)


def tail_records(path: Path, rank: int, attempt: int, max_bytes: int) -> list[dict[str, Any]]:
    """The latest records of either format (the last ``max_bytes`` or so)."""
    if legacy(path):
        return tail_jsonl(path, max_bytes)
    return [r for b in tail_blocks(path, max_bytes) for r in block_records(b, rank, attempt)]


# -- series: what charts and summaries read (no dict per value) -----------------------------


@dataclass
class Series:
    """One metric of one file: steps and epochs (:data:`NONE` where missing), values, times."""

    steps: array = field(default_factory=lambda: array("q"))
    epochs: array = field(default_factory=lambda: array("q"))
    values: array = field(default_factory=lambda: array("d"))
    times: array = field(default_factory=lambda: array("d"))

    def extend(self, col: Columns, time: float) -> None:
        self.steps.extend(col.steps)
        self.epochs.extend(col.epochs)
        self.values.extend(col.values)
        self.times.extend(array("d", [time]) * len(col.values))


def read_series(path: Path, offset: int = 0, names: Iterable[str] | None = None) -> tuple[dict[str, Series], int]:
    """Every metric of a file (either format) as columns, names in order of first appearance;
    returns them and the offset to continue from."""
    out: dict[str, Series] = {}
    if legacy(path):
        records, offset = read_records(path, 0, 0, offset, names)
        for r in records:
            name, value = r.get("name"), r.get("value")
            if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            s = out.get(name) or out.setdefault(name, Series())
            s.steps.append(_int_or_none(r.get("step")))
            s.epochs.append(_int_or_none(r.get("epoch")))
            s.values.append(float(value))
            time = r.get("time")
            s.times.append(float(time) if isinstance(time, (int, float)) else 0.0)
        return out, offset
    blocks, offset = read_blocks(path, offset, names)
    for block in blocks:
        for name, col in block.columns.items():
            (out.get(name) or out.setdefault(name, Series())).extend(col, block.time)
    return out, offset


def _int_or_none(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else NONE


def write_jsonl(records: Iterable[dict[str, Any]], out: Any) -> int:
    """Records as JSON lines (the export format); returns how many."""
    count = 0
    for r in records:
        out.write(json.dumps(r, separators=(",", ":")) + "\n")
        count += 1
    return count


# -- JSON lines (older metrics files; resource samples) ---------------------------------------


def _parse_lines(data: bytes) -> list[dict[str, Any]]:
    """JSON lines -> dicts; fast path parses all lines in one call, junk lines are dropped."""
    text = data.decode("utf-8", errors="replace")
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        return []
    try:
        parsed = json.loads("[" + ",".join(lines) + "]")
        if all(isinstance(r, dict) for r in parsed):
            return parsed
    except ValueError:
        pass
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def read_jsonl(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines of ``path`` from ``offset``; returns (records, new offset)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return [], offset
    cut = data.rfind(b"\n") + 1  # a line still being written is read next time
    return _parse_lines(data[:cut]), offset + cut


def tail_jsonl(path: Path, max_bytes: int = 1 << 18) -> list[dict[str, Any]]:
    """The complete JSON lines within the last ``max_bytes`` of ``path`` (recent records only)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            start = max(0, size - max_bytes)
            fh.seek(start)
            data = fh.read()
    except OSError:
        return []
    if start:
        data = data[data.find(b"\n") + 1:]  # the first line is cut by the window
    return _parse_lines(data[: data.rfind(b"\n") + 1])
