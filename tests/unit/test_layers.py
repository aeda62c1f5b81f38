"""The layers of phalanx point one way (docs/architecture.md, "Layers").

Every import in ``src/phalanx`` is read from the source (AST: module level, inside functions,
under ``if TYPE_CHECKING``), and the test fails on an import from a lower floor to a higher one,
between two packages on the same floor, or on a cycle, naming the file, the line and the rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# Floors, bottom first. A module may import its own package and anything on a lower floor.
FLOORS: list[tuple[str, ...]] = [
    ("errors",),
    ("core", "config"),  # the job model and the job-directory contract; settings
    ("monitor", "health", "storage", "store"),  # metrics and resources; gang health, the doctor; data channels, state, outputs; SQLite
    ("launch",),  # one node: agent, bootstrap, torchrun argv, host facts
    ("backends",),  # how N node agents start somewhere
    ("supervise",),  # a job's life
    ("sweeps",),  # trials on top of supervise
    ("query", "lists", "sweepview"),  # read-only views; filtered listings (ps, dashboard); a sweep's trial table
    ("jobs", "cleanup"),  # the library's verbs; rm and prune
    ("jobfile", "web"),  # job file + flags -> spec; the dashboard
    ("cli",),
    ("__init__", "__main__"),  # the public API, ``python -m phalanx``
]
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}
PICTURE = " < ".join("|".join(names) for names in FLOORS)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(source: str, module: str, is_package: bool, known: set[str]) -> list[tuple[int, str]]:
    """(line, imported phalanx module) for every import in ``source``, wherever it is."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # ``from . import x``: x may be a module of its own
                sub = f"{target}.{alias.name}"
                found.append((node.lineno, sub if sub in known else target))
    return [(line, name) for line, name in found if name == "phalanx" or name.startswith("phalanx.")]


def floor_of(module: str) -> tuple[str, int]:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    if top not in FLOOR:
        raise AssertionError(f"{module} is on no floor: add '{top}' to FLOORS in tests/unit/test_layers.py "
                             "(and to the picture in docs/architecture.md)")
    return top, FLOOR[top]


def graph(root: Path) -> dict[str, list[tuple[int, str, Path]]]:
    files = {module_name(p, root): p for p in sorted((root / "phalanx").rglob("*.py"))}
    known = set(files)
    out: dict[str, list[tuple[int, str, Path]]] = {}
    for module, path in files.items():
        edges = imports(path.read_text(), module, path.name == "__init__.py", known)
        out[module] = [(line, target, path) for line, target in edges if target != module and target in known]
    return out


def violations(root: Path) -> list[str]:
    problems = []
    edges = graph(root)
    for module, targets in edges.items():
        top, level = floor_of(module)
        for line, target, path in targets:
            their, theirs = floor_of(target)
            if their == top:
                continue
            where = f"{path.relative_to(root)}:{line} imports {target}"
            if theirs > level:
                problems.append(f"{where}: upward, {top} (floor {level}) may not import {their} (floor {theirs}); "
                                f"floors from the bottom: {PICTURE}")
            elif theirs == level:
                problems.append(f"{where}: sideways, {top} and {their} share floor {level} and may not import each "
                                f"other; floors from the bottom: {PICTURE}")
    return problems + cycles(edges, root)


def cycles(edges: dict[str, list[tuple[int, str, Path]]], root: Path) -> list[str]:
    """One message per import cycle (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for _, w, _ in edges.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    messages = []
    for component in found:
        members = set(component)
        links = [f"{path.relative_to(root)}:{line} imports {target}" for m in component
                 for line, target, path in edges[m] if target in members]
        messages.append(f"import cycle between {', '.join(component)}: {'; '.join(links)}; "
                        "move what both need to the lower one, or pass it in")
    return messages


def test_layers_point_one_way_and_nothing_imports_in_a_circle():
    problems = violations(SRC)
    assert not problems, "\n".join(problems)


def test_the_check_finds_upward_imports_and_cycles(tmp_path):
    """The checker itself: a planted upward import (inside a function) and a planted cycle fail."""
    pkg = tmp_path / "phalanx"
    for sub in ("backends", "supervise", "monitor"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "backends" / "x.py").write_text("def f():\n    from ..supervise import job\n")
    (pkg / "supervise" / "job.py").write_text("")
    (pkg / "monitor" / "a.py").write_text("from . import b\n")
    (pkg / "monitor" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n")
    problems = violations(tmp_path)
    assert any(p.startswith("phalanx/backends/x.py:2 imports phalanx.supervise.job: upward, backends (floor 4) "
                            "may not import supervise (floor 5)") for p in problems), problems
    assert any("import cycle between phalanx.monitor.a, phalanx.monitor.b" in p for p in problems), problems
