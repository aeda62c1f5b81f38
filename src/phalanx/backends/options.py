"""Backend options, declared once as data, next to each backend: validation, job-file keys
(``backend_options:``, or a section of the backend's own such as ``sagemaker:``), the flags of
``phalanx run`` and the docs all derive from them (``docs/backends.md``, "Declaring a backend's
options", walks through it).

A backend declares its options in a module that imports nothing heavy (no SDK: ``phalanx
--help`` lists every backend's flags without importing kubernetes, ray or boto3)::

    # my_backend/options.py
    OPTIONS = (BackendOption("namespace", str, "default", "Kubernetes namespace to run in."),)
    SECTIONS = (BackendSection("kubernetes", "Pod settings (mapping).", section_options),)  # optional

and is found by convention (the ``options`` module of the package its backend class lives in),
through ``BUILTIN_OPTIONS`` below, or through the entry-point group ``phalanx.backend_options``
(``kubernetes = "my_backend.options:OPTIONS"``). The backend class sets ``options = OPTIONS``
too, so ``Backend.plan`` validates a spec built by the library API as well.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

from ..core.options import Option
from ..core.optiontypes import BadValue, Bool, Checked, Float, Int, ListOf, Node, Str, ValueType, show
from ..errors import UsageError

ENTRY_POINT_GROUP = "phalanx.backend_options"

# Built-in backends: where each declares its options ("module:ATTRIBUTE"; None: it has none).
BUILTIN_OPTIONS: dict[str, str | None] = {
    "local": None,
    "ssh": "phalanx.backends.ssh.options:OPTIONS",
    "slurm": "phalanx.backends.slurm.sbatch:OPTIONS",
}


@dataclass(frozen=True)
class BackendOption:
    """One option of a backend: ``--name-with-dashes`` on the command line, ``backend_options.name``
    in a job file, ``spec.backend_options["name"]`` for the backend (validated, default filled in).

    ``kind``: what a value must be (``core/optiontypes``: ``Int(low=1)``, ``Float(positive=True)``,
    ``Custom(parser=...)``, ``Checked(check=...)`` for a structured job-file value its backend
    checks itself); without it, ``type`` says (int, float, bool, anything else as text).
    ``cli=False``: a job-file key only (a mapping has no flag)."""

    name: str
    type: type
    default: Any
    help: str
    multiple: bool = False  # a list of values (repeatable flag)
    kind: ValueType | None = None
    cli: bool = True
    metavar: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def value_type(self) -> ValueType:
        item: ValueType = self.kind or {int: Int(low=None), float: Float(expected="a number", low=float("-inf")),
                                        bool: Bool()}.get(self.type, Str())
        return ListOf(item=item) if self.multiple else item

    def as_option(self, backends: Sequence[str], help: str | None = None, default: Any = ...) -> Option:
        """The run option this declares (one flag, a key under ``backend_options:``)."""
        default = (None if self.multiple else self.default) if default is ... else default
        return Option(
            self.name, self.value_type, help or self.help, (self.flag,) if self.cli else (), group="backend",
            default=default, file=f"backend_options.{self.name}", field="backend_options",
            backends=tuple(backends), flag_value=True if self.type is bool else None, metavar=self.metavar,
        )


@dataclass(frozen=True)
class BackendSection:
    """A top-level job-file section of a backend's own (``sagemaker:``): a mapping that
    ``to_options`` (the backend's validator) turns into that backend's options, or refuses with a
    UsageError. Options given by name (``backend_options:``, flags) win over the section's."""

    key: str
    help: str
    to_options: Callable[[Any], dict[str, Any]]
    node: bool = False  # to_options gets the job file's Node (with lines), not the plain mapping

    def as_option(self, backend: str, declared: Sequence[BackendOption]) -> Option:
        def check(value: Any) -> dict[str, Any]:
            return typed(backend, declared, self.to_options(value), prefix=f"{self.key}.")

        return Option(self.key, Checked(check=check, expected="a mapping", node=self.node), self.help, group="backend",
                      file=self.key, field="backend_options", backends=(backend,), expands=True)


def _module(target: str) -> tuple[Any, str]:
    module, _, attr = target.partition(":")
    return importlib.import_module(module), attr or "OPTIONS"


def _load(target: str) -> tuple[BackendOption, ...]:
    value, attr = _module(target)
    for part in attr.split("."):
        value = getattr(value, part)
    return tuple(value)


@lru_cache(maxsize=1)
def _declared() -> dict[str, str | None]:
    from .builtin import BACKENDS as BUILTIN

    found: dict[str, str | None] = {}
    backends = {**installed_entry_points("phalanx.backends"), **BUILTIN}
    for name, target in backends.items():  # by convention: the options module of the backend's package
        package = target.partition(":")[0].rpartition(".")[0]
        if package and package != __package__ and _exists(f"{package}.options"):
            found[name] = f"{package}.options:OPTIONS"
    found.update(installed_entry_points(ENTRY_POINT_GROUP))
    return {**found, **BUILTIN_OPTIONS}


def _exists(module: str) -> bool:
    """Whether ``module`` can be imported (its parent package is imported to find out: keep a
    backend package's ``__init__`` free of SDK imports)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def installed_entry_points(group: str) -> dict[str, str]:
    """``name -> "module:attr"`` of an entry-point group, read from the installed distributions'
    ``entry_points.txt`` directly: ``importlib.metadata`` costs 20 ms (or 150 under load) to
    import, on every ``phalanx run`` and ``run --help``; this costs about 1 ms."""
    import os
    import sys

    found: dict[str, str] = {}
    header = f"[{group}]"
    for base in sys.path:
        try:
            entries = list(os.scandir(base or "."))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(entry.path, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            if header in text:
                for name, value in _section(text, header):
                    found.setdefault(name, value)  # the first on sys.path wins, as for imports
    return found


def _section(text: str, header: str) -> list[tuple[str, str]]:
    pairs, inside = [], False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            inside = line == header
        elif inside and "=" in line and not line.startswith(("#", ";")):
            name, _, value = line.partition("=")
            pairs.append((name.strip(), value.strip()))
    return pairs


def declared(backend: str) -> tuple[BackendOption, ...]:
    """The options ``backend`` declares (none for an unknown backend: the registry says so later)."""
    target = _declared().get(backend)
    return _load(target) if target else ()


def declared_sections(backend: str) -> tuple[BackendSection, ...]:
    """The job-file sections ``backend`` declares: ``SECTIONS`` beside its ``OPTIONS``."""
    target = _declared().get(backend)
    return tuple(getattr(_module(target)[0], "SECTIONS", ())) if target else ()


@lru_cache(maxsize=None)
def backend_options(chosen: str | None = None) -> tuple[Option, ...]:
    """Every backend's options as run options, one per name, then their job-file sections. A name
    several backends declare (``instance_type``) is one flag; its value is read with the rules of
    the ``chosen`` backend (the job's), else of the first that declares it, and checked again by
    the backend the job uses."""
    owners: dict[str, list[tuple[str, BackendOption]]] = {}
    sections: list[Option] = []
    for backend in sorted(_declared()):
        try:
            options = declared(backend)
            sections += [s.as_option(backend, options) for s in declared_sections(backend)]
        except Exception:  # noqa: BLE001 - a broken third-party package must not break phalanx --help
            continue
        for option in options:
            owners.setdefault(option.name, []).append((backend, option))
    out = []
    for name, decls in owners.items():
        names = [b for b, _ in decls]
        lead = next((o for b, o in decls if b == chosen), decls[0][1])
        if len({(o.help, repr(o.default)) for _, o in decls}) == 1:
            out.append(lead.as_option(names))
            continue
        # Different meanings per backend: say each, with its default.
        parts = [f"{b}: {_default_first(o)}" for b, o in decls]
        out.append(lead.as_option(names, help=" ".join(parts), default=None))
    return (*out, *sections)


def _default_first(option: BackendOption) -> str:
    """One backend's part of a shared option's help, its default first."""
    from ..core.options import default_first

    written, text = default_first(option.help)
    default = option.default if option.default not in (None, False, ()) else written
    return f"[default: {default}] {text}" if default is not None else text


def validate(backend: str, declared_options: Sequence[BackendOption], given: Mapping[str, Any]) -> dict[str, Any]:
    """Known keys only, values of the declared type, defaults filled in. Values may be the
    user's text (a job file, the library API) or already typed; both go through the same types."""
    by_name = {o.name: o for o in declared_options}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        valid = ", ".join(o.flag for o in declared_options) or "none"
        raise UsageError(f"option(s) {', '.join(unknown)} do not apply to the {backend} backend", f"its options: {valid}")
    defaults = {o.name: o.default for o in declared_options if o.name not in given}
    return {**typed(backend, declared_options, given), **defaults}


def typed(backend: str, declared_options: Sequence[BackendOption], given: Mapping[str, Any],
          prefix: str = "") -> dict[str, Any]:
    """The ``given`` values, each read with its option's rules (unknown keys refused). ``prefix``
    names them as a job-file section does (``sagemaker.max_run``) instead of by flag."""
    by_name = {o.name: o for o in declared_options}
    out: dict[str, Any] = {}
    for name, value in given.items():
        option = by_name.get(name)
        if option is None:
            valid = ", ".join(o.flag for o in declared_options) or "none"
            raise UsageError(f"option {name} does not apply to the {backend} backend", f"its options: {valid}")
        if value is None:
            out[name] = None
            continue
        try:
            out[name] = _typed(option, value)
        except BadValue as exc:
            hint = f"use {exc.expected}" + (f" ({exc.hint})" if exc.hint else "")
            if prefix:
                raise UsageError(f"{prefix}{name}: expected {exc.expected}, got {show(value)}", exc.hint) from None
            raise UsageError(f"invalid {option.flag} {show(value)}", hint) from None
    return out


def _typed(option: BackendOption, value: Any) -> Any:
    kind = option.value_type
    if option.multiple:
        items = value if isinstance(value, (list, tuple)) else [value]
        return [_typed_one(kind.item if isinstance(kind, ListOf) else kind, v) for v in items]
    return _typed_one(kind, value)


def _typed_one(kind: ValueType, value: Any) -> Any:
    if isinstance(value, str) and not isinstance(kind, (Bool, Checked)):
        return kind.from_text(value)
    return kind.from_node(Node.of(value))
