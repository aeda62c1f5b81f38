"""A sweep's objective, checked before any trial starts: it must be a metric the job declares
(``--metric NAME=REGEX``) or one the automatic pick-up can take from what the script prints,
matched as a whole name (``loss`` is not ``val_loss``). An objective nothing reports would
waste every trial; the sweep runner fails a sweep in which none did anyway.

What the script can print is read from its source, never run: every string it writes (plain,
``%``-formatted, ``str.format``, f-strings with ``{name=}``) is filled with a number where a value
goes and read the way the pick-up reads a line (``monitor/autometrics.py``), and names a trainer
library logs from the script's own words count too: a dict's keys (``{'loss': ...}`` printed,
``trainer.log({...})``), the first argument of a ``log`` call (Lightning's
``self.log("val_loss", ...)``), ``dict(loss=...)``. With ``transformers`` imported, the HF Trainer's
own metrics and its ``eval_``/``train_``/``test_`` prefixes count as well.
"""

from __future__ import annotations

import ast
import difflib
import re
import sys
from pathlib import Path

from ..core.spec import EntrypointKind, JobSpec
from ..errors import UsageError

_SOURCE_FILES = 2000  # .py files read to find an objective's name: a project, not a site-packages
_SOURCE_BYTES = 20 << 20
# The HF Trainer's own metrics and the prefixes it puts before a compute_metrics() key.
_HF_METRICS = frozenset({"loss", "grad_norm", "learning_rate", "runtime", "samples_per_second", "steps_per_second"})
_HF_PREFIXES = ("eval_", "train_", "test_", "predict_")
_PLACEHOLDER = re.compile(r"%(?:\([^)]*\))?[-+ 0#]*(?:\d+|\*)?(?:\.\d+)?[diouxXeEfFgGcrsa]|\{[^{}]*\}")
_NAME = re.compile(r"[A-Za-z_][\w@./-]{0,99}")


def check_objective(spec: JobSpec, name: str) -> None:
    """UsageError unless ``name`` is a declared metric or one the script can print (see above)."""
    if any(m.name == name for m in spec.metrics):
        return
    if not spec.auto_metrics:
        raise UsageError(f"--objective '{name}' is not a metric phalanx reads",
                         f"add --metric {name}=REGEX, or allow automatic metrics")
    files = source_files(spec)
    if not files:
        return  # a command phalanx cannot read: trust the user
    seen, imports = printed(_read(files[0]) or "", files[0])
    hf = "transformers" in imports
    for path in files[1:]:  # the project's modules the script imports (a few: parsed, never run)
        found, more = printed(_read(path) or "", path)
        seen |= found
        hf = hf or "transformers" in more
    if name in seen or _hf_metric(name, seen, hf):
        return
    seen = {n for n in seen if n not in ("step", "epoch")}
    close = difflib.get_close_matches(name, sorted(seen), n=1, cutoff=0.6)
    shown = files[0].name + (f" or the {len(files) - 1} module(s) of the project it imports" if len(files) > 1 else "")
    listed = sorted(seen)
    who = f"{files[0].name} prints" if len(files) == 1 else "they print"
    prints = f"{who} {', '.join(listed[:8])}{', ...' if len(listed) > 8 else ''}" if listed \
        else f"nothing in {shown} prints NAME=VALUE"
    raise UsageError(f"--objective '{name}': no --metric defines it and nothing in {shown} prints it as a metric, "
                     f"so no trial would report it ({prints})",
                     (f"did you mean --objective {close[0]}? " if close else "check the name, ")
                     + f"or add --metric {name}=REGEX for what the script prints")


def _hf_metric(name: str, found: set[str], hf: bool) -> bool:
    """A metric the HF Trainer itself logs, or a key of the script's compute_metrics() it prefixes."""
    if not hf:
        return False
    if name in _HF_METRICS:
        return True
    return any(name.startswith(p) and (name[len(p):] in _HF_METRICS or name[len(p):] in found) for p in _HF_PREFIXES)


def printed(source: str, path: Path | str = "<source>") -> tuple[set[str], set[str]]:
    """The metric names the script's source can print, and the top-level modules it imports."""
    from ..monitor.autometrics import names_in

    try:
        tree = ast.parse(source, str(path))
    except (SyntaxError, ValueError):
        return set(), set()
    names: set[str] = set()
    imports: set[str] = set()
    inside: set[int] = set()  # the string parts of f-strings, read with their f-string
    saved: set[int] = set()  # dicts handed to a save call: a checkpoint's keys (model, optimizer), not metrics
    for node in ast.walk(tree):  # breadth first: a call before the dicts in its arguments
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "0" for v in node.values)
            inside.update(id(v) for v in node.values)
            names.update(n for line in text.splitlines() for n in names_in(line))
        elif isinstance(node, ast.Dict) and id(node) not in saved:
            names.update(str(k.value) for k in node.keys if isinstance(k, ast.Constant) and _is_name(k))
        elif isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if "save" in called.lower():
                saved.update(id(a) for a in node.args if isinstance(a, ast.Dict))
            if called == "dict":
                names.update(k.arg for k in node.keywords if k.arg)
            elif "log" in called.lower() and node.args and _is_name(node.args[0]):
                names.add(node.args[0].value)  # type: ignore[attr-defined]
        elif isinstance(node, ast.Import):
            imports.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imports.add(node.module.partition(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside:
            text = _PLACEHOLDER.sub("0", node.value)
            text = re.sub(r"([=:])[ \t]*$", r"\1 0", text, flags=re.MULTILINE)  # print("loss:", x)
            names.update(n for line in text.splitlines() for n in names_in(line))
    return names, imports


def _is_name(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(_NAME.fullmatch(node.value))


def source_files(spec: JobSpec) -> list[Path]:
    """The entrypoint's source first, then the project's modules it imports, directly or through
    each other (the script may print from one): found under the script's directory, the working
    directory and its ``src/``, as Python would find them. Installed packages are not read, nor the
    project's other files (its tests may print any name)."""
    entry, workdir = spec.entrypoint, Path(spec.workdir)
    first: Path | None = None
    if entry.kind is EntrypointKind.SCRIPT:
        first = Path(entry.target) if Path(entry.target).is_absolute() else workdir / entry.target
    elif entry.kind is EntrypointKind.MODULE:
        first = _module_file(entry.target, workdir)
    elif Path(entry.target).is_file() or (workdir / entry.target).is_file():
        first = Path(entry.target) if Path(entry.target).is_file() else workdir / entry.target
    if first is None or not _is_text(first):
        return []
    roots = [r for r in dict.fromkeys([first.parent, workdir, workdir / "src"]) if r.is_dir()]
    files, size, at = [first], 0, 0
    while at < len(files) and len(files) < _SOURCE_FILES and size <= _SOURCE_BYTES:
        path = files[at]
        at += 1
        for found in _imported(path, roots):
            if found not in files:
                files.append(found)
                size += _size(found)
    return files


def _imported(path: Path, roots: list[Path]) -> list[Path]:
    """The project files the imports of ``path`` name (modules, their packages' ``__init__.py``)."""
    try:
        tree = ast.parse(_read(path) or "", str(path))
    except (SyntaxError, ValueError):
        return []
    wanted: list[tuple[list[Path], str]] = []  # (where to look, dotted name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            wanted.extend((roots, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            bases = roots if not node.level else [path.parents[node.level - 1]] if node.level <= len(path.parents) else []
            module = node.module or ""
            wanted.extend((bases, f"{module}.{alias.name}".strip(".")) for alias in node.names if alias.name != "*")
            if module:
                wanted.append((bases, module))
    found: list[Path] = []
    for bases, dotted in wanted:
        parts = [p for p in dotted.split(".") if p]
        for base in bases:
            for depth in range(1, len(parts) + 1):
                rel = Path(*parts[:depth])
                for candidate in (base / rel.with_suffix(".py"), base / rel / "__init__.py"):
                    if candidate.is_file() and candidate not in found:
                        found.append(candidate)
    return found


def _module_file(module: str, workdir: Path) -> Path | None:
    """Where ``python -m module`` would find it, without importing anything."""
    rel = Path(*module.split("."))
    for base in [workdir, *map(Path, sys.path[1:])]:
        for candidate in (base / rel.with_suffix(".py"), base / rel / "__main__.py"):
            if candidate.is_file():
                return candidate
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _is_text(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return b"\x00" not in f.read(4096)
    except OSError:
        return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
