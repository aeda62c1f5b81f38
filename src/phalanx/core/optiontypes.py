"""Value types of run options: how one value is read from the command line (text) and from a
job file (a YAML value, with the text the user typed), and what it must be to mean something.

Every type answers both ways, so the command line and the job file can never disagree on what
a value means: ``--max-retries three`` and ``max_retries: three`` fail with the same words.
A bad value raises :class:`BadValue` (what was expected); the caller adds where it came from
(``--max-retries`` or ``job.yaml:7: max_retries``). Pure; no I/O.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from typing import Any, Callable

# Beyond any machine or cluster: an error, not a job that waits forever for resources.
MAX_NODES = 100_000
MAX_PROCS_PER_NODE = 1024

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class BadValue(ValueError):
    """A value that does not fit its option: ``expected`` says what would have."""

    def __init__(self, expected: str, hint: str | None = None, at: "tuple[str, Node] | None" = None) -> None:
        super().__init__(expected)
        self.expected = expected
        self.hint = hint
        self.at = at  # inside a list or mapping: (".key" or "[i]", the node that failed)

    def inside(self, step: str, node: "Node") -> "BadValue":
        """The same problem, located one level further in (``env.A``, ``args[2]``)."""
        path, inner = self.at if self.at else ("", node)
        return BadValue(self.expected, self.hint, (step + path, inner))


def _key(key: Any) -> str:
    return key if isinstance(key, str) and re.fullmatch(r"[\w.-]+", key) else show(key)


def show(value: Any, limit: int = 60) -> str:
    """A value as the user wrote it, for messages: strings quoted, YAML's spelling of the rest."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, str):
        text = repr(value)
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{_key(k)}: {show(v, limit)}" for k, v in value.items()) + "}"
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(show(v, limit) for v in value) + "]"
    elif isinstance(value, bytes):
        text = repr(value)
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Node:
    """One value of a job file as typed. ``kind``: scalar, seq (``value`` a list of Nodes) or map
    (``value`` a list of (key, value) Node pairs). ``text``: a scalar's own text when it was
    written plain (``010``, ``1:30``, ``yes``: what the user typed, before YAML reads it as a
    number, a time or a boolean); None when quoted. ``line``: 1-based, 0 when not from a file."""

    value: Any
    text: str | None = None
    line: int = 0
    kind: str = "scalar"

    @property
    def is_mapping(self) -> bool:
        return self.kind == "map"

    @property
    def is_sequence(self) -> bool:
        return self.kind == "seq"

    def plain(self) -> Any:
        """The value as YAML loads it (for messages)."""
        if self.kind == "map":
            return {k.plain(): v.plain() for k, v in self.value}
        if self.kind == "seq":
            return [n.plain() for n in self.value]
        return self.value

    def get(self, key: str) -> "Node | None":
        """The value of ``key`` in a mapping (its last occurrence, as YAML loads it)."""
        found = None
        for k, v in self.value if self.kind == "map" else ():
            if str(k.value) == key:
                found = v
        return found

    @classmethod
    def of(cls, value: Any, line: int = 0) -> "Node":
        """A Node for a Python value given through the library API (no text of its own)."""
        if isinstance(value, dict):
            return cls([(cls.of(k, line), cls.of(v, line)) for k, v in value.items()], None, line, "map")
        if isinstance(value, (list, tuple)):
            return cls([cls.of(v, line) for v in value], None, line, "seq")
        return cls(value, None, line)


def _kind(node: Node) -> str:
    if node.is_mapping:
        return "a mapping "
    if node.is_sequence:
        return "a list "
    return ""


class ValueType:
    """Base: a text is parsed by ``parse``; a job-file scalar by its text; anything else is refused.

    Fields are class attributes (the defaults) that keyword arguments override per instance; plain
    classes rather than dataclasses, because generating a dozen dataclasses costs `phalanx run
    --help` several milliseconds at every start."""

    expected: str = "a value"
    metavar: str = "TEXT"

    def __init__(self, **fields: Any) -> None:
        for name, value in fields.items():
            if not hasattr(type(self), name):
                raise TypeError(f"{type(self).__name__} has no field {name!r}")
            setattr(self, name, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"

    def from_text(self, text: str) -> Any:
        return self.parse(text)

    def from_node(self, node: Node) -> Any:
        if node.kind != "scalar" or node.value is None:
            raise BadValue(self.describe())
        return self.parse(node.text if node.text is not None else str(node.value))

    def parse(self, text: str) -> Any:
        return text

    def describe(self) -> str:
        return self.expected

    def got(self, node: Node) -> str:
        return f"{_kind(node)}{show(node.plain())}"


class Str(ValueType):
    expected: str = "a string"
    allow_empty: bool = False
    longest: int | None = None  # characters

    def parse(self, text: str) -> Any:
        if not self.allow_empty and not text.strip():
            raise BadValue(f"a non-empty {self.expected.removeprefix('a ')}")
        if "\x00" in text:
            raise BadValue(f"{self.expected} without NUL characters")
        if self.longest is not None and len(text) > self.longest:
            raise BadValue(f"{self.expected} of at most {self.longest} characters")
        return text


class Int(ValueType):
    expected: str = "an integer"
    metavar: str = "N"
    low: int | None = 0
    high: int | None = None

    def from_node(self, node: Node) -> Any:
        if isinstance(node.value, (bool, float)):
            raise BadValue(self.describe())
        return super().from_node(node)

    def parse(self, text: str) -> Any:
        word = text.strip()
        if not re.fullmatch(r"[+-]?\d{1,30}", word):
            raise BadValue(self.describe())
        number = int(word)
        if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
            raise BadValue(self.describe())
        return number

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.expected} from {self.low} to {self.high:,}"
        if self.low is not None:
            return f"{self.expected} of at least {self.low}"
        return self.expected


class Float(ValueType):
    """A finite number: ``nan`` and ``inf`` never mean a duration or a count."""

    expected: str = "a number of seconds"
    metavar: str = "SECONDS"
    low: float = 0.0
    positive: bool = False  # strictly above ``low``

    def from_node(self, node: Node) -> Any:
        if isinstance(node.value, bool):
            raise BadValue(self.describe())
        return super().from_node(node)

    def parse(self, text: str) -> Any:
        try:
            number = float(text.strip())
        except ValueError:
            raise BadValue(self.describe()) from None
        if not math.isfinite(number) or number < self.low or (self.positive and number == self.low):
            raise BadValue(self.describe())
        return number

    def describe(self) -> str:
        return f"{self.expected} {'above' if self.positive else 'of at least'} {self.low:g}"


class Bool(ValueType):
    """A real boolean in a job file (``true``/``false``): a string such as ``"false"`` is an error,
    never read as truthy. On the command line a boolean is a flag without a value."""

    expected: str = "true or false"
    metavar: str = ""

    def from_node(self, node: Node) -> Any:
        if isinstance(node.value, bool):
            return node.value
        if isinstance(node.value, str):
            raise BadValue(self.expected, "a boolean is written without quotes")
        raise BadValue(self.expected)

    def parse(self, text: str) -> Any:
        raise BadValue(self.expected)


class Choice(ValueType):
    choices: tuple[str, ...] = ()
    metavar: str = "CHOICE"

    def parse(self, text: str) -> Any:
        if text.strip() not in self.choices:
            raise BadValue(self.describe())
        return text.strip()

    def describe(self) -> str:
        return f"one of {', '.join(self.choices)}"


class Custom(ValueType):
    """A value with its own grammar: ``parser(text)`` returns the value or raises BadValue."""

    parser: Callable[[str], Any] = str

    def from_node(self, node: Node) -> Any:
        if isinstance(node.value, bool):
            raise BadValue(self.describe())
        return super().from_node(node)

    def parse(self, text: str) -> Any:
        return self.parser(text)


class Checked(ValueType):
    """A structured job-file value (a mapping) that its owner checks: ``check(value as YAML loads
    it)`` returns the checked value or raises ``UsageError`` (a backend's own validator: the
    caller puts the file, line and key in front of its message). Not a command-line value."""

    check: Callable[[Any], Any] = staticmethod(lambda value: value)  # type: ignore[assignment]
    expected: str = "a mapping"
    node: bool = False  # check gets the Node itself, to name the line of the key it refuses

    def from_text(self, text: str) -> Any:
        raise BadValue(self.expected, "it is a job-file setting")

    def from_node(self, node: Node) -> Any:
        return self.check(node if self.node else node.plain())


class ListOf(ValueType):
    """A list: a repeatable flag on the command line, a YAML list in a job file. A YAML string
    is split by ``split`` when the option says how (args: like a shell), else it is one item:
    never iterated character by character."""

    item: ValueType = Str()
    split: Callable[[str], list[str]] | None = None
    commas: bool = False  # "1,137" on the command line (and as a job-file string) is two items

    def from_text(self, text: str) -> Any:
        if not self.commas:
            return [self.item.from_text(text)]
        words = [w.strip() for w in text.split(",") if w.strip()]
        try:
            if not words:
                raise BadValue(self.describe())
            return [self.item.from_text(w) for w in words]
        except BadValue:
            raise BadValue(f"{self.describe()} separated by commas, each {self.item.describe()}") from None

    def from_node(self, node: Node) -> Any:
        if node.is_sequence:
            out = []
            for i, item in enumerate(node.value):
                try:
                    out.append(self.item.from_node(item))
                except BadValue as exc:
                    raise exc.inside(f"[{i}]", item) from None
            return out
        if isinstance(node.value, str) and self.split is not None:
            return [self.item.from_text(w) for w in self.split(node.value)]
        if node.is_mapping or node.value is None or isinstance(node.value, bool):
            raise BadValue(self.describe())
        return self.from_text(node.text if node.text is not None else str(node.value))

    def describe(self) -> str:
        return f"a list of {self.item.expected.removeprefix('a ').removeprefix('an ')}s"


class MappingOf(ValueType):
    """``KEY=VALUE`` on the command line (repeatable), a YAML mapping in a job file."""

    key: Callable[[str], str] = str
    item: ValueType = Str(allow_empty=True)
    expected: str = "a mapping"
    metavar: str = "KEY=VALUE"

    def from_text(self, text: str) -> Any:
        name, sep, value = text.partition("=")
        if not sep:
            raise BadValue(self.metavar)
        return {self.key(name.strip() if self.key is not str else name): self.item.from_text(value)}

    def from_node(self, node: Node) -> Any:
        if not node.is_mapping:
            raise BadValue(self.expected)
        out = {}
        for key, value in node.value:
            name = key.text if key.text is not None else str(key.value)
            try:
                checked = self.key(name)
            except BadValue as exc:
                raise exc.inside(f".{name}", key) from None
            try:
                out[checked] = self.item.from_node(value)
            except BadValue as exc:
                raise exc.inside(f".{name}", value) from None
        return out


class SecretRefs(MappingOf):
    """``--secret VAR`` or ``--secret VAR=SECRET`` (repeatable); in a job file a list of those
    (``secrets: [HF_TOKEN]``) or a mapping of variable to secret name. -> {variable: secret name}."""

    expected: str = "a list of secret names (VAR or VAR=SECRET), or a mapping of variable to secret name"
    metavar: str = "VAR[=SECRET]"
    parser: Callable[[str], tuple[str, str]] = staticmethod(lambda text: (text, text))  # type: ignore[assignment]

    def from_text(self, text: str) -> Any:
        var, name = self.parser(text)
        return {var: name}

    def from_node(self, node: Node) -> Any:
        if node.is_mapping:
            out = {}
            for key, value in node.value:
                var = key.text if key.text is not None else str(key.value)
                target = value.text if value.text is not None else value.value
                if not isinstance(target, str):
                    raise BadValue(self.expected).inside(f".{var}", value)
                try:
                    out.update(self.from_text(f"{var}={target}"))
                except BadValue as exc:
                    raise exc.inside(f".{var}", key) from None
            return out
        items = node.value if node.is_sequence else [node]
        out = {}
        for i, item in enumerate(items):
            if item.kind != "scalar" or not isinstance(item.value, str):
                raise BadValue(self.expected).inside(f"[{i}]", item) if node.is_sequence else BadValue(self.expected)
            try:
                out.update(self.from_text(item.value))
            except BadValue as exc:
                raise exc.inside(f"[{i}]", item) if node.is_sequence else exc from None
        return out


def env_name(name: str) -> str:
    if not ENV_NAME.match(name):
        raise BadValue("an environment variable name: letters, digits and _, not starting with a digit",
                       f"{show(name)} is not one")
    return name


def shell_words(text: str) -> list[str]:
    """``"--lr 0.1 --name 'a b'"`` -> ``['--lr', '0.1', '--name', 'a b']`` (POSIX shell rules)."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise BadValue(f"arguments split like a shell ({exc})") from None
