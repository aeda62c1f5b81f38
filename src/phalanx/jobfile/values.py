"""What the user gave (command line and job file) -> typed values, through the option table.

The command line beats the job file, the job file beats the default; mappings (``env``,
``inputs``, ``metrics``) merge key by key. Both sources go through the same value types
(``core/optiontypes.py``), so they accept and refuse the same things, in the same words.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from ..core.options import RUN_OPTIONS, Option
from ..core.optiontypes import BadValue, Bool, ListOf, MappingOf, Node, show
from ..errors import UsageError
from .read import JobFile, load, show_node

def all_options(backend: str | None = None) -> tuple[Option, ...]:
    """The run options and every backend's (those are declared next to each backend); a name
    several backends share is read with ``backend``'s rules."""
    from ..backends.options import backend_options

    return RUN_OPTIONS + backend_options(backend)


class RunOptions:
    """What ``phalanx run`` (or a library caller) was given. ``words``: the script or command and
    its arguments; every other keyword is an option of the table (``core/options.py``) by name,
    its value the user's text (or a list of texts for a repeatable flag), or an already typed
    value from Python code; None (or an empty list) means 'not given'. ``backend_options``:
    the backend's own options by name (the CLI passes them so)."""

    def __init__(self, words: Iterable[str] = (), backend_options: dict[str, Any] | None = None, **given: Any) -> None:
        known = {o.name for o in RUN_OPTIONS}
        unknown = sorted(set(given) - known)
        if unknown:
            raise TypeError(f"RunOptions got unknown option(s) {', '.join(unknown)}")
        self.words = list(words)
        self.given = {k: v for k, v in given.items() if _is_given(v)}
        self.backend_options = {k: v for k, v in (backend_options or {}).items() if _is_given(v)}

    def __getattr__(self, name: str) -> Any:
        if name in ("given", "backend_options", "words"):
            raise AttributeError(name)
        if name in {o.name for o in RUN_OPTIONS}:
            return self.given.get(name)
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"RunOptions(words={self.words!r}, {', '.join(f'{k}={v!r}' for k, v in self.given.items())})"


def _is_given(value: Any) -> bool:
    return value is not None and not (isinstance(value, (list, tuple, dict)) and not value)


@dataclass
class Values:
    """Typed values by option name (given or default), and which were given where."""

    values: dict[str, Any] = field(default_factory=dict)
    from_cli: set[str] = field(default_factory=set)
    from_file: set[str] = field(default_factory=set)
    file: JobFile | None = None
    lines: dict[str, int] = field(default_factory=dict)  # option -> its line in the job file
    cli: dict[str, Any] = field(default_factory=dict)  # typed, from the command line only
    # Said once everything is checked (a warning before an error would make two lines).
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # the same, said without "warning:"

    def __getitem__(self, name: str) -> Any:
        return self.values.get(name)

    def given(self, name: str) -> bool:
        return name in self.from_cli or name in self.from_file

    def where(self, name: str) -> str:
        """How to name the option in a message: its flag, or the job file's line and key."""
        if name in self.from_cli or self.file is None or name not in self.from_file:
            option = next((o for o in all_options() if o.name == name), None)
            return option.main_flag if option else name
        option = next(o for o in all_options() if o.name == name)
        return f"{self.file.path}:{self.lines.get(name, 0)}: {option.file_key}"


def file_schema() -> tuple[list[str], dict[str, list[str]], dict[str, str]]:
    """The job file's keys, from the option table: top-level keys, sections (``sweep``,
    ``backend_options``) with theirs, and command-line-only options (key -> flag, for messages)."""
    options = all_options()
    top = [o.file_key for o in options if o.file_key and "." not in o.file_key]
    sections: dict[str, list[str]] = {}
    for o in options:
        if o.file_key and "." in o.file_key:
            section, _, key = o.file_key.partition(".")
            sections.setdefault(section, []).append(key)
    cli_only = {o.name: o.main_flag for o in options if o.file_key is None and o.flags}
    return [*top, *sections], sections, cli_only


def load_job_file(path: str) -> JobFile:
    """The job file at ``path``, its keys checked against the option table."""
    top, sections, cli_only = file_schema()
    return load(path, top, dict(sections), cli_only)


def resolve(opts: RunOptions) -> Values:
    """Every option's typed value: command line over job file over default. Raises UsageError."""
    working_dir()
    job = load_job_file(opts.job_file) if opts.job_file else None
    declared = {o.name for o in all_options() if o.group == "backend"}
    unknown = sorted(set(opts.backend_options) - declared)
    if unknown:
        raise UsageError(f"no backend has the option(s) {', '.join(unknown)}", "see: phalanx run --help")
    out = Values(file=job)
    for option in all_options(_backend_named(opts, job)):
        raw = opts.backend_options.get(option.name) if option.group == "backend" else opts.given.get(option.name)
        node = job.node(option.file_key) if job is not None and option.file_key else None
        from_file = _from_node(option, node, job) if node is not None else None
        from_cli = _from_cli(option, raw) if raw is not None else None
        if node is not None:
            out.from_file.add(option.name)
            out.lines[option.name] = node.line
        if raw is not None:
            out.from_cli.add(option.name)
            out.cli[option.name] = from_cli
        out.values[option.name] = _merge(option, from_file, from_cli, node is not None, raw is not None)
    return out


def working_dir() -> str:
    """The current directory, which a job runs in and relative paths start from; a directory
    deleted under the shell that is still in it is refused in words."""
    import os

    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UsageError("the working directory no longer exists (it was removed after the shell entered it)",
                         "cd to an existing directory and run again") from None


def _backend_named(opts: RunOptions, job: JobFile | None) -> str | None:
    """The backend the job names (the command line's, else the file's), before anything is typed."""
    raw = opts.given.get("backend")
    if raw is None and job is not None:
        node = job.node("backend")
        raw = node.value if node is not None else None
    return raw if isinstance(raw, str) else None


def _merge(option: Option, from_file: Any, from_cli: Any, in_file: bool, in_cli: bool) -> Any:
    if isinstance(option.type, MappingOf) and in_file and in_cli:
        return {**from_file, **from_cli}
    if in_cli:
        return from_cli
    if in_file:
        return from_file
    return option.default


def _from_cli(option: Option, raw: Any) -> Any:
    """A command-line value (text, a list of texts, or a typed value from Python code)."""
    label = option.main_flag
    items = list(raw) if isinstance(raw, (list, tuple)) and option.repeatable else [raw]
    parsed: list[Any] = []
    for item in items:
        try:
            if isinstance(item, str) and not isinstance(option.type, Bool):
                parsed.append(option.type.from_text(item))
            elif isinstance(option.type, (ListOf, MappingOf)) and not isinstance(item, str):
                parsed.append(option.type.from_node(Node.of(item)))
            else:
                parsed.append(option.type.from_node(Node.of(item)))
        except BadValue as exc:
            hint = f"use {exc.expected}" + (f" ({exc.hint})" if exc.hint else "")
            raise UsageError(f"invalid {label} {show(item)}", hint) from None
    if isinstance(option.type, MappingOf):
        merged: dict[str, Any] = {}
        for part in parsed:
            merged.update(part)
        return merged
    if isinstance(option.type, ListOf) and option.repeatable:
        return [v for part in parsed for v in part]
    return parsed[0]


def _from_node(option: Option, node: Node, job: JobFile | None) -> Any:
    try:
        return option.type.from_node(node)
    except UsageError as exc:  # a backend's own validator (a Checked value): placed in the file
        key = option.file_key or option.name
        line = getattr(exc, "line", 0) or node.line  # a validator that read the Node names the inner key's line
        if exc.message.startswith((f"{key}:", f"{key}.")):  # it names the key itself
            raise UsageError(f"{job.path}:{line}: {exc.message}" if job else exc.message, exc.hint) from None
        raise UsageError(f"{job.where(node, key) if job else key}: {exc.message}", exc.hint) from None
    except BadValue as exc:
        path, inner = exc.at if exc.at else ("", node)
        key = (option.file_key or option.name) + path
        where = job.where(inner, key) if job else key
        raise UsageError(f"{where}: expected {exc.expected}, got {show_node(inner)}", exc.hint) from None
