"""Backend options, declared once as data, next to each backend: validation, job-file keys
(``backend_options:``), the flags of ``phalanx run`` and the docs all derive from them.

A backend declares its options in a module that imports nothing heavy (no SDK: ``phalanx
--help`` lists every backend's flags without importing kubernetes, ray or boto3)::

    # my_backend/options.py
    OPTIONS = (BackendOption("namespace", str, "default", "Kubernetes namespace to run in."),)

and names that module: a built-in one in ``BUILTIN_OPTIONS`` below, an installed one through the
entry-point group ``phalanx.backend_options`` (``kubernetes = "my_backend.options:OPTIONS"``),
beside its ``phalanx.backends`` entry. The backend class sets ``options = OPTIONS`` too, so
``Backend.plan`` validates a spec built by the library API as well.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

from ..core.options import Option
from ..core.optiontypes import BadValue, Bool, Float, Int, ListOf, Node, Str, ValueType, show
from ..errors import UsageError

ENTRY_POINT_GROUP = "phalanx.backend_options"

# Built-in backends: where each declares its options ("module:ATTRIBUTE"; None: it has none).
BUILTIN_OPTIONS: dict[str, str | None] = {
    "local": None,
    "ssh": "phalanx.backends.ssh_options:OPTIONS",
    "slurm": "phalanx.backends.sbatch:OPTIONS",
}


@dataclass(frozen=True)
class BackendOption:
    name: str  # key in JobSpec.backend_options and the job file; the CLI flag is --name-with-dashes
    type: type
    default: Any
    help: str
    multiple: bool = False  # a list of values (repeatable flag)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def value_type(self) -> ValueType:
        item: ValueType = {int: Int(low=None), float: Float(expected="a number", low=float("-inf")),
                           bool: Bool()}.get(self.type, Str())
        return ListOf(item=item) if self.multiple else item

    def as_option(self, backends: Sequence[str]) -> Option:
        """The run option this declares (one flag, a key under ``backend_options:``)."""
        return Option(
            self.name, self.value_type, self.help, (self.flag,), group="backend",
            default=None if self.multiple else self.default, file=f"backend_options.{self.name}",
            field="backend_options", backends=tuple(backends), flag_value=True if self.type is bool else None,
        )


def _load(target: str) -> tuple[BackendOption, ...]:
    module, _, attr = target.partition(":")
    value = importlib.import_module(module)
    for part in (attr or "OPTIONS").split("."):
        value = getattr(value, part)
    return tuple(value)


@lru_cache(maxsize=1)
def _declared() -> dict[str, str | None]:
    from .registry import BUILTIN

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


@lru_cache(maxsize=1)
def backend_options() -> tuple[Option, ...]:
    """Every backend's options as run options, one per name (a name several backends declare,
    such as ``namespace``, is one flag; its value is checked by the backend the job uses)."""
    owners: dict[str, list[str]] = {}
    first: dict[str, BackendOption] = {}
    for backend in sorted(_declared()):
        try:
            options = declared(backend)
        except Exception:  # noqa: BLE001 - a broken third-party package must not break phalanx --help
            continue
        for option in options:
            owners.setdefault(option.name, []).append(backend)
            first.setdefault(option.name, option)
    return tuple(first[name].as_option(owners[name]) for name in first)


def validate(backend: str, declared_options: Sequence[BackendOption], given: Mapping[str, Any]) -> dict[str, Any]:
    """Known keys only, values of the declared type, defaults filled in. Values may be the
    user's text (a job file, the library API) or already typed; both go through the same types."""
    by_name = {o.name: o for o in declared_options}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        valid = ", ".join(o.flag for o in declared_options) or "none"
        raise UsageError(f"option(s) {', '.join(unknown)} do not apply to the {backend} backend", f"its options: {valid}")
    out: dict[str, Any] = {}
    for option in declared_options:
        value = given.get(option.name, option.default)
        if value is None:
            out[option.name] = None
            continue
        try:
            out[option.name] = _typed(option, value)
        except BadValue as exc:
            raise UsageError(f"invalid {option.flag} {show(value)}", f"use {exc.expected}" + (f" ({exc.hint})" if exc.hint else "")) from None
    return out


def _typed(option: BackendOption, value: Any) -> Any:
    kind = option.value_type
    if option.multiple:
        items = value if isinstance(value, (list, tuple)) else [value]
        return [_typed_one(kind.item if isinstance(kind, ListOf) else kind, v) for v in items]
    return _typed_one(kind, value)


def _typed_one(kind: ValueType, value: Any) -> Any:
    if isinstance(value, str) and not isinstance(kind, Bool):
        return kind.from_text(value)
    return kind.from_node(Node.of(value))
