"""Reading a job file: YAML text -> a tree of ``Node``s that keep each value's line and the text
the user typed, checked against the keys the option table declares.

Every problem is one ``UsageError`` naming the file and line: ``job.yaml:7: max_retries:
expected an integer, got 'three'``; a YAML syntax error carries line and column; an unknown
key gets a "did you mean"; a binary file is refused before YAML sees it.

``-`` reads the job file from standard input. A job file is a page of settings, and one may come
from someone else (a server accepting them), so its reading is bounded: at most ``MAX_BYTES``,
nested at most ``MAX_DEPTH`` levels, at most ``MAX_VALUES`` values once its aliases (``*name``)
are expanded, no alias inside the value it names. Each is checked before the value is built, so
an alias bomb (nine levels of ``&a [*b, *b, ...]``) or 50,000 nested brackets is refused at
once, in one line (docs/limits.md).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..core.optiontypes import Node
from ..errors import UsageError

MAX_BYTES = 1 << 20  # a job file is a page of settings, not data
MAX_DEPTH = 32  # levels of nesting (a Kubernetes pod section needs about 8)
MAX_VALUES = 100_000  # scalars, lists and mappings, once aliases are expanded
STDIN = "<stdin>"  # how messages name a job file read from standard input (-f -)


@dataclass(frozen=True)
class JobFile:
    path: str  # as given (messages name it so); STDIN for -f -
    root: Node  # a mapping

    @property
    def base_dir(self) -> Path:
        """Where the file's relative paths start: its directory (the current one for stdin or a
        pipe such as ``<(envsubst < job.yaml)``)."""
        if self.path == STDIN or not Path(self.path).is_file():
            return Path.cwd()
        return Path(self.path).resolve().parent

    def node(self, key: str) -> Node | None:
        """The value at ``key`` (``sweep.trials``: inside ``sweep``), or None when not set."""
        node: Node | None = self.root
        for part in key.split("."):
            node = node.get(part) if node is not None and node.is_mapping else None
        return node

    def where(self, node: Node, key: str) -> str:
        return f"{self.path}:{node.line}: {key}" if node.line else f"{self.path}: {key}"

    def keys(self) -> list[str]:
        return [str(k.value) for k, _ in self.root.value]


def read_text(path: str) -> str:
    """The job file's text (``-``: standard input); refused when missing, a directory, larger
    than ``MAX_BYTES`` or not UTF-8 text."""
    data = _read_bytes(path)
    name = STDIN if path == "-" else path
    if len(data) > MAX_BYTES:
        raise UsageError(f"job file '{name}' is larger than {MAX_BYTES >> 20} MiB", "a job file holds settings; pass data with --input")
    bad = data.find(b"\x00")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = exc.start if bad < 0 else min(bad, exc.start)
        text = ""
    if bad >= 0:
        raise UsageError(f"job file '{name}' is not a text file (byte 0x{data[bad]:02x} at offset {bad})",
                         "a job file is YAML text, e.g. script: train.py")
    return text


def _read_bytes(path: str) -> bytes:
    """At most ``MAX_BYTES + 1`` bytes of the file, of a pipe (``-f <(envsubst < job.yaml)``)
    or of standard input (``-``)."""
    import sys

    if path == "-":
        return sys.stdin.buffer.read(MAX_BYTES + 1)
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"job file '{path}' is a directory", f"give the YAML file in it, e.g. -f {p / 'job.yaml'}")
    try:
        with open(p, "rb") as fh:
            return fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"job file '{path}' not found", "check the path given to -f (- reads standard input)") from None
    except OSError as exc:
        raise UsageError(f"cannot read job file '{path}': {exc.strerror}", "check the path given to -f") from None


def load(path: str, valid: Iterable[str], sections: dict[str, Iterable[str]], cli_only: dict[str, str]) -> JobFile:
    """Parse and check the keys: ``valid`` top-level keys, ``sections`` (key -> its own keys),
    ``cli_only`` (a key -> the flag it would be on the command line, for a better message)."""
    text = read_text(path)
    path = STDIN if path == "-" else path
    root = parse(text, path)
    if root is None or not root.is_mapping:
        raise UsageError(f"job file '{path}' must be a mapping of keys to values", "e.g. script: train.py")
    job = JobFile(path, root)
    _check_keys(job, root, "", list(valid), cli_only)
    for section, keys in sections.items():
        node = job.node(section)
        if node is None:
            continue
        if not node.is_mapping:
            raise UsageError(f"{job.where(node, section)}: expected a mapping, got {show_node(node)}",
                             f"e.g. {section}: {{{next(iter(keys), 'key')}: ...}}")
        _check_keys(job, node, section + ".", list(keys), {})
    return job


def parse(text: str, path: str) -> Node | None:
    import yaml

    try:
        loader = _loader()(text)
        try:
            root = loader.get_single_node()  # nesting bounded while scanning and composing (_loader)
            if root is None:
                return None
            _measure(root, 1, {}, set(), path)  # before anything is expanded
            loader.construct_document(root)  # the safe loader's checks (tags it refuses) before ours
            return _convert(loader, root)
        finally:
            loader.dispose()
    except _TooDeep as exc:
        raise UsageError(f"{_where(path, exc.mark)}: nested more than {MAX_DEPTH} levels deep",
                         "a job file holds settings: flatten the value") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(str(exc.problem or exc.context or "").split())
        raise UsageError(f"{_where(path, mark)}: not valid YAML: {problem}", "fix the syntax (quote values with : or # in them)") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {' '.join(str(exc).split())}", "fix the syntax") from None


def _where(path: str, mark: Any) -> str:
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path


class _TooDeep(Exception):
    def __init__(self, mark: Any) -> None:
        super().__init__()
        self.mark = mark


def _loader() -> Any:
    """PyYAML's safe loader, composing at most ``MAX_DEPTH`` levels (its composer recurses once
    per level: 50,000 brackets would end in RecursionError) and scanning at most that many open
    brackets (it looks ahead for keys at every open one: thousands cost seconds). Made on first
    use (yaml is lazy)."""
    global _LOADER
    if _LOADER is None:
        import yaml

        class Bounded(yaml.SafeLoader):
            depth = 0

            def fetch_flow_collection_start(self, TokenClass: Any) -> None:
                if self.flow_level >= MAX_DEPTH:
                    raise _TooDeep(self.get_mark())
                super().fetch_flow_collection_start(TokenClass)

            def compose_node(self, parent: Any, index: Any) -> Any:
                if self.depth >= MAX_DEPTH and not self.check_event(yaml.AliasEvent):
                    raise _TooDeep(self.peek_event().start_mark)
                self.depth += 1
                try:
                    return super().compose_node(parent, index)
                finally:
                    self.depth -= 1

        _LOADER = Bounded
    return _LOADER


_LOADER: Any = None


def _measure(node: Any, depth: int, seen: dict[int, tuple[int, int]], open_: set[int], path: str) -> tuple[int, int]:
    """(values, levels) of ``node`` with its aliases expanded, each shared node measured once:
    refuses (UsageError) past ``MAX_VALUES`` or ``MAX_DEPTH``, or an alias inside its own value,
    before anything is built (a billion laughs is 30 nodes composed, 10^9 expanded)."""
    import yaml

    key = id(node)
    if key in seen:
        values, levels = seen[key]
        if depth + levels - 1 > MAX_DEPTH:
            raise _TooDeep(node.start_mark)
        return values, levels
    if key in open_:
        raise UsageError(f"{path}:{node.start_mark.line + 1}: an alias (*name) is used inside the value it names",
                         "a job file's values are finite: remove that alias")
    if isinstance(node, yaml.ScalarNode):
        return 1, 1
    if depth > MAX_DEPTH:
        raise _TooDeep(node.start_mark)
    children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
    open_.add(key)
    values, levels = 1, 1
    for child in children:
        more, deeper = _measure(child, depth + 1, seen, open_, path)
        values, levels = values + more, max(levels, deeper + 1)
        if values > MAX_VALUES:
            raise UsageError(f"{path}:{node.start_mark.line + 1}: more than {MAX_VALUES:,} values once its aliases "
                             "(*name) are expanded", "a job file holds settings, not data: pass data with --input")
    open_.discard(key)
    seen[key] = (values, levels)
    return values, levels


def _convert(loader: Any, node: Any) -> Node:
    import yaml

    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # merge keys (<<: *base)
        return Node([(_convert(loader, k), _convert(loader, v)) for k, v in node.value], None, line, "map")
    if isinstance(node, yaml.SequenceNode):
        return Node([_convert(loader, n) for n in node.value], None, line, "seq")
    value = loader.construct_object(node, deep=True)
    return Node(value, node.value if node.style is None else None, line)


def _check_keys(job: JobFile, node: Node, prefix: str, valid: list[str], cli_only: dict[str, str]) -> None:
    seen: dict[str, int] = {}
    for key_node, _ in node.value:
        key = key_node.value
        if not isinstance(key, str):
            raise UsageError(f"{job.path}:{key_node.line}: keys are names, got {show_node(key_node)}", "e.g. grace: 30")
        if key in seen:
            raise UsageError(f"{job.path}:{key_node.line}: {prefix}{key} is set twice (first on line {seen[key]})",
                             "keep one")
        seen[key] = key_node.line
        if key in valid:
            continue
        if key in cli_only:
            raise UsageError(f"{job.path}:{key_node.line}: unknown key {prefix}{key}",
                             f"{cli_only[key]} is a command-line option only")
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        hint = f"did you mean {prefix}{close[0]}?" if close else f"valid keys: {', '.join(sorted(valid))}"
        raise UsageError(f"{job.path}:{key_node.line}: unknown key {prefix}{key}", hint)


def show_node(node: Node) -> str:
    from ..core.optiontypes import show

    kind = {"map": "a mapping ", "seq": "a list "}.get(node.kind, "")
    return kind + show(node.plain())
