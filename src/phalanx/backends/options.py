"""Backend options, declared once as data: validation, job-file keys, CLI flags and docs
all derive from these declarations (``Backend.options``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import UsageError


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


def validate(backend: str, declared: Sequence[BackendOption], given: Mapping[str, Any]) -> dict[str, Any]:
    """Known keys only, values of the declared type, defaults filled in."""
    by_name = {o.name: o for o in declared}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        valid = ", ".join(o.flag for o in declared) or "none"
        raise UsageError(f"option(s) {', '.join(unknown)} do not apply to the {backend} backend", f"its options: {valid}")
    out: dict[str, Any] = {}
    for option in declared:
        value = given.get(option.name, option.default)
        if value is None:
            out[option.name] = None
            continue
        try:
            if option.multiple:
                items = value if isinstance(value, (list, tuple)) else [value]
                out[option.name] = [option.type(v) for v in items]
            elif option.type is bool:
                out[option.name] = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
            else:
                out[option.name] = option.type(value)
        except (TypeError, ValueError):
            raise UsageError(f"invalid {option.flag} '{value}'", option.help) from None
    return out
