"""A strict validator built from botocore's own service model of SageMaker.

botocore checks a request's member names, required members and types before it is sent, but
not the constraints the model also carries: enums (``InstanceType`` is one of ~225 values),
patterns (a job name is ``[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}``), lengths and counts (a metric
regex of at most 500 characters, at most 20 channels). The service rejects those only when
the request reaches it, after phalanx would have uploaded the code. ``check`` walks the
operation's input shape and enforces all of them, here, before anything is sent.

The model's patterns are Java regular expressions matched against the whole value; the two
that use ``\\p{...}`` classes are translated to Python's ``re`` (``_PYTHON_CLASSES``).
"""

from __future__ import annotations

import datetime
import re
from functools import lru_cache
from typing import Any

# Java's POSIX and Unicode classes used by the SageMaker model, as Python character-class parts.
_PYTHON_CLASSES = {
    r"\p{Alnum}": "A-Za-z0-9",
    r"\p{Z}": " \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000",
}


class Invalid(ValueError):
    """A request (or response) that breaks the service model: ``path`` says where."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


@lru_cache(maxsize=None)
def _model(service: str) -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model(service)


@lru_cache(maxsize=None)
def _pattern(java: str) -> re.Pattern[str]:
    text = java
    if r"\p{L}" in text or r"\p{N}" in text:
        # [\p{L}\p{Z}\p{N}...]: letters and numbers are \w (which adds only _, allowed there anyway).
        text = text.replace(r"\p{L}", r"\w").replace(r"\p{N}", "")
    for java_class, python in _PYTHON_CLASSES.items():
        if java_class in text:
            text = text.replace(java_class, python)
    return re.compile(text, re.DOTALL)


def check(operation: str, params: dict[str, Any], service: str = "sagemaker", output: bool = False) -> None:
    """Raise Invalid when ``params`` breaks ``operation``'s input (or, with ``output``, its
    output) shape anywhere: unknown or missing members, types, enums, patterns, min/max."""
    op = _model(service).operation_model(operation)
    shape = op.output_shape if output else op.input_shape
    _walk(shape, params, operation)


def _walk(shape: Any, value: Any, path: str) -> None:
    kind = shape.type_name
    meta = shape.metadata
    if kind == "structure":
        if not isinstance(value, dict):
            raise Invalid(path, f"expected a structure ({shape.name}), got {type(value).__name__}")
        unknown = sorted(set(value) - set(shape.members))
        if unknown:
            raise Invalid(path, f"unknown member(s) {', '.join(unknown)} (valid: {', '.join(shape.members)})")
        missing = [m for m in shape.required_members if m not in value]
        if missing:
            raise Invalid(path, f"missing required member(s) {', '.join(missing)}")
        for name, member in value.items():
            _walk(shape.members[name], member, f"{path}.{name}")
        return
    if kind == "list":
        if not isinstance(value, list):
            raise Invalid(path, f"expected a list, got {type(value).__name__}")
        _bounds(path, len(value), meta, "items")
        for i, item in enumerate(value):
            _walk(shape.member, item, f"{path}[{i}]")
        return
    if kind == "map":
        if not isinstance(value, dict):
            raise Invalid(path, f"expected a map, got {type(value).__name__}")
        _bounds(path, len(value), meta, "entries")
        for key, item in value.items():
            _walk(shape.key, key, f"{path} key {key!r}")
            _walk(shape.value, item, f"{path}[{key!r}]")
        return
    if kind == "string":
        if not isinstance(value, str):
            raise Invalid(path, f"expected a string, got {type(value).__name__}")
        if shape.enum and value not in shape.enum:
            valid = ", ".join(shape.enum[:12]) + (f", ... ({len(shape.enum)} in all)" if len(shape.enum) > 12 else "")
            raise Invalid(path, f"{value!r} is not one of {valid}")
        _bounds(path, len(value), meta, "characters")
        pattern = meta.get("pattern")
        if pattern and not _pattern(pattern).fullmatch(value):
            raise Invalid(path, f"{value!r} does not match the pattern {pattern}")
        return
    if kind in ("integer", "long"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(path, f"expected a whole number, got {type(value).__name__}")
        _bounds(path, value, meta, "")
        return
    if kind in ("float", "double"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Invalid(path, f"expected a number, got {type(value).__name__}")
        _bounds(path, value, meta, "")
        return
    if kind == "boolean":
        if not isinstance(value, bool):
            raise Invalid(path, f"expected true or false, got {type(value).__name__}")
        return
    if kind == "timestamp":
        if not isinstance(value, (datetime.datetime, int, float)) or isinstance(value, bool):
            raise Invalid(path, f"expected a timestamp, got {type(value).__name__}")
        return
    if kind == "blob":
        if not isinstance(value, (bytes, bytearray, str)):
            raise Invalid(path, f"expected bytes, got {type(value).__name__}")
        return
    raise Invalid(path, f"no check for shape type {kind}")


def _bounds(path: str, size: float, meta: dict[str, Any], unit: str) -> None:
    low, high = meta.get("min"), meta.get("max")
    what = f"{size:g} {unit}".strip()
    if low is not None and size < low:
        raise Invalid(path, f"{what}; at least {low} {unit}".rstrip() + " allowed")
    if high is not None and size > high:
        raise Invalid(path, f"{what}; at most {high} {unit}".rstrip() + " allowed")


def enum(shape_path: str, operation: str = "CreateTrainingJob") -> tuple[str, ...]:
    """The enum at a dotted member path of ``operation``'s input, e.g. ``ResourceConfig.InstanceType``."""
    shape = _model("sagemaker").operation_model(operation).input_shape
    for part in shape_path.split("."):
        shape = shape.members[part]
    return tuple(shape.enum)
