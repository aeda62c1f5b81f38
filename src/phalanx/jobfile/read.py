"""Reading a job file: YAML text -> a tree of ``Node``s that keep each value's line and the text
the user typed, checked against the keys the option table declares.

Every problem is one ``UsageError`` naming the file and line: ``job.yaml:7: max_retries:
expected an integer, got 'three'``; a YAML syntax error carries line and column; an unknown
key gets a "did you mean"; a binary file is refused before YAML sees it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..core.optiontypes import Node
from ..errors import UsageError

MAX_BYTES = 1 << 20  # a job file is a page of settings, not data


@dataclass(frozen=True)
class JobFile:
    path: str  # as given (messages name it so)
    root: Node  # a mapping

    @property
    def base_dir(self) -> Path:
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
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"job file '{path}' not found", "check the path given to -f")
    data = p.read_bytes()[: MAX_BYTES + 1]
    if len(data) > MAX_BYTES:
        raise UsageError(f"job file '{path}' is larger than {MAX_BYTES >> 20} MiB", "a job file holds settings; pass data with --input")
    bad = data.find(b"\x00")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = exc.start if bad < 0 else min(bad, exc.start)
        text = ""
    if bad >= 0:
        raise UsageError(f"job file '{path}' is not a text file (byte 0x{data[bad]:02x} at offset {bad})",
                         "a job file is YAML text, e.g. script: train.py")
    return text


def load(path: str, valid: Iterable[str], sections: dict[str, Iterable[str]], cli_only: dict[str, str]) -> JobFile:
    """Parse and check the keys: ``valid`` top-level keys, ``sections`` (key -> its own keys),
    ``cli_only`` (a key -> the flag it would be on the command line, for a better message)."""
    text = read_text(path)
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
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
            if root is None:
                return None
            loader.construct_document(root)  # the safe loader's checks (tags it refuses) before ours
            return _convert(loader, root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        problem = " ".join(str(exc.problem or exc.context or "").split())
        raise UsageError(f"{where}: not valid YAML: {problem}", "fix the syntax (quote values with : or # in them)") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {' '.join(str(exc).split())}", "fix the syntax") from None


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
