"""Request bodies checked against a schema before anything acts on them, with a one-line error
naming the field (``spec.resources.nnodes: expected an integer, not "two"``). A small subset of
JSON Schema, written as Python data: ``type`` (one name or a list), ``properties`` and
``required`` of an object (no other keys unless ``extra``), ``items`` of an array, ``max`` the
length of a string or an array, ``min`` of a number."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError

Schema = dict[str, Any]
_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
                                       "integer": (int,), "number": (int, float), "null": (type(None),)}
HINT = "see the API in docs/server.md"


def check(value: Any, schema: Schema, where: str = "request") -> Any:
    """``value`` when it matches ``schema``; UsageError naming the first field that does not."""
    kinds = schema.get("type", "any")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if "any" not in kinds and not any(_is(value, k) for k in kinds):
        raise UsageError(f"{where}: expected {' or '.join(_names(kinds))}, not {_shown(value)}", HINT)
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        for key in schema.get("required", ()):
            if key not in value:
                raise UsageError(f"{where}: '{key}' is missing", HINT)
        if not schema.get("extra", False):
            unknown = sorted(k for k in value if k not in props)
            if unknown:
                raise UsageError(f"{where}: unknown field '{unknown[0]}'", f"fields: {', '.join(sorted(props))}")
        for key, sub in props.items():
            if key in value:
                check(value[key], sub, f"{where}.{key}")
    if isinstance(value, (list, str)) and "max" in schema and len(value) > schema["max"]:
        raise UsageError(f"{where}: longer than {schema['max']}", HINT)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            check(item, schema["items"], f"{where}[{i}]")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and "min" in schema and value < schema["min"]:
        raise UsageError(f"{where}: must be at least {schema['min']}, not {value}", HINT)
    return value


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[kind])


def _names(kinds: list[str]) -> list[str]:
    return [{"object": "an object", "array": "a list", "integer": "an integer", "null": "null"}.get(k, f"a {k}")
            for k in kinds]


def _shown(value: Any) -> str:
    import json

    kind = {dict: "an object", list: "a list", bool: "a boolean", type(None): "null"}.get(type(value))
    return kind or json.dumps(value)[:40]


def obj(required: tuple[str, ...] = (), extra: bool = False, **properties: Schema) -> Schema:
    return {"type": "object", "properties": properties, "required": list(required), "extra": extra}


STRING: Schema = {"type": "string", "max": 4096}
OPT_STRING: Schema = {"type": ["string", "null"], "max": 4096}
BOOL: Schema = {"type": "boolean"}
OPT_NUMBER: Schema = {"type": ["number", "null"], "min": 0}
OPT_COUNT: Schema = {"type": ["integer", "null"], "min": 0}
ENTRY: Schema = {"type": "array", "max": 4}
TREE: Schema = obj(("files",), root=STRING, files={"type": "array", "items": ENTRY, "max": 200_000})
SPEC: Schema = obj(("entrypoint",), extra=True, entrypoint=obj(("kind", "target"), extra=True, kind=STRING,
                                                                target=STRING))
SUBMIT: Schema = obj(("spec",), spec=SPEC, code={"type": ["object", "null"], **{k: v for k, v in TREE.items() if k != "type"}},
                     inputs={"type": "object", "extra": True, "properties": {}}, detach=BOOL,
                     ranks={"type": ["array", "null"], "items": {"type": "integer", "min": 0}, "max": 100_000},
                     settings={"type": ["object", "null"], "extra": True, "properties": {}})
MISSING: Schema = obj(("objects",), objects={"type": "array", "max": 200_000,
                                             "items": {"type": "array", "max": 2}})
WAIT: Schema = obj((), timeout=OPT_NUMBER, progress=BOOL)
STOP: Schema = obj((), timeout=OPT_NUMBER, now=BOOL)
RESUME: Schema = obj((), detach=BOOL, ranks=SUBMIT["properties"]["ranks"])
PRUNE: Schema = obj(("older_than",), older_than=STRING, states={"type": "array", "items": STRING, "max": 20},
                    dry_run=BOOL)
SECRET: Schema = obj(("value",), value={"type": "string", "max": 65536})
