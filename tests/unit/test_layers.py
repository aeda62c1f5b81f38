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
    ("monitor", "health", "storage", "store", "track", "secrets"),  # metrics and resources; progress, stragglers, anomalies, the doctor; data channels, state, outputs; the store; tracker exporters; secrets (values never in a record)
    ("launch",),  # one node: agent, bootstrap, torchrun argv, host facts
    ("backends",),  # how N node agents start somewhere
    ("supervise",),  # a job's life
    ("sweeps",),  # trials on top of supervise
    ("api",),  # the face: views (query, lists, ps, jobview, sweepview, attach), verbs (jobs, cleanup, users), face; views never act
    ("jobfile", "web", "remote"),  # job file + flags -> spec; the dashboard; the face over HTTP (a client)
    ("server",),  # the team server: the face behind HTTP, identity, the dashboard for a team
    ("cli",),
    ("__init__", "__main__"),  # the public API, ``python -m phalanx``
]
# Inside the face (``api``): views read and never act, verbs act, and ``face`` puts both behind one
# object. A view may import neither a verb nor the face; every module of ``api`` is one of the three.
VIEWS = {"query", "lists", "sweepview", "ps", "jobview", "attach", "usage", "failure"}
VERBS = {"jobs", "cleanup", "users", "projects", "audit", "teamface", "faceverbs", "sweepjobs", "serversecrets"}
FACES = {"face", "wire"}
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
    return problems + views_never_act(edges, root) + cycles(edges, root)


def views_never_act(edges: dict[str, list[tuple[int, str, Path]]], root: Path) -> list[str]:
    problems = []
    for module, targets in edges.items():
        parts = module.split(".")
        if parts[1:2] != ["api"] or len(parts) < 3:
            continue
        kind = parts[2]
        if kind not in VIEWS | VERBS | FACES:
            problems.append(f"{module} is neither a view nor a verb of the face: add '{kind}' to VIEWS (it reads "
                            "only) or VERBS (it acts) in tests/unit/test_layers.py")
            continue
        for line, target, path in targets:
            their = target.split(".")
            if kind in VIEWS and their[1:2] == ["api"] and len(their) > 2 and their[2] in VERBS | FACES:
                problems.append(f"{path.relative_to(root)}:{line} imports {target}: views never act; the view "
                                f"{kind} may not import the verb module {their[2]}")
    return problems


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


def test_the_check_finds_a_view_that_acts(tmp_path):
    pkg = tmp_path / "phalanx"
    (pkg / "api").mkdir(parents=True)
    for name in ("__init__", "api/__init__", "api/jobs"):
        (pkg / f"{name}.py").write_text("")
    (pkg / "api" / "query.py").write_text("def f():\n    from . import jobs\n")
    problems = violations(tmp_path)
    assert any(p.startswith("phalanx/api/query.py:2 imports phalanx.api.jobs: views never act") for p in problems), problems


def test_every_import_of_phalanx_names_a_module_that_exists():
    """mypy is told to ignore missing imports (for optional third-party packages), so it would not
    see ``from .core.x import y`` written one level short in a module that moved: this does."""
    files = {module_name(p, SRC): p for p in sorted((SRC / "phalanx").rglob("*.py"))}
    missing = []
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if (target == "phalanx" or target.startswith("phalanx.")) and target not in files:
                missing.append(f"{path.relative_to(SRC)}:{node.lineno} imports {target}, which does not exist")
    assert not missing, "\n".join(missing)
