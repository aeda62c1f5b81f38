"""What a script imports and calls, read from its source without running it (``ast``).

Used to infer the framework of a multi-node job given no ``--framework`` (``infer_framework``),
and by the JAX start-up to know whether the script calls ``jax.distributed.initialize`` itself
(``Imports.calls_jax_initialize``).
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field

# Top-level packages that name a framework; torch-family first: torch stays the default.
TORCH_PACKAGES = frozenset({"torch", "lightning", "pytorch_lightning", "accelerate", "deepspeed", "torchvision"})
JAX_PACKAGES = frozenset({"jax", "jaxlib", "flax", "optax", "orbax", "equinox", "haiku"})
TF_PACKAGES = frozenset({"tensorflow", "keras", "tf_keras"})


@dataclass
class Imports:
    modules: set[str] = field(default_factory=set)  # top-level package names, anywhere in the file
    calls_jax_initialize: bool = False


class _Reader(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found = Imports()
        self.jax: set[str] = set()  # names bound to the jax package
        self.dist: set[str] = set()  # names bound to jax.distributed
        self.init: set[str] = set()  # names bound to jax.distributed.initialize

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.modules.add(alias.name.split(".")[0])
            if alias.name == "jax" or (alias.name.startswith("jax.") and not alias.asname):
                self.jax.add(alias.asname or "jax")
            elif alias.name == "jax.distributed" and alias.asname:
                self.dist.add(alias.asname)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and not node.level:
            self.found.modules.add(node.module.split(".")[0])
            for alias in node.names:
                if node.module == "jax" and alias.name == "distributed":
                    self.dist.add(alias.asname or alias.name)
                elif node.module == "jax.distributed" and alias.name == "initialize":
                    self.init.add(alias.asname or alias.name)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in self.init:
            self.found.calls_jax_initialize = True
        elif isinstance(func, ast.Attribute) and func.attr == "initialize":
            owner = func.value
            if isinstance(owner, ast.Name) and owner.id in self.dist:
                self.found.calls_jax_initialize = True
            elif (isinstance(owner, ast.Attribute) and owner.attr == "distributed"
                  and isinstance(owner.value, ast.Name) and owner.value.id in self.jax):
                self.found.calls_jax_initialize = True
        self.generic_visit(node)


def read_imports(path: str) -> Imports | None:
    """The imports of the Python file at ``path``; None when it cannot be read or parsed."""
    try:
        with open(path, "rb") as fh:
            tree = ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    reader = _Reader()
    reader.visit(tree)
    return reader.found


def module_file(module: str, root: str) -> str | None:
    """The file ``python -m MODULE`` would run from ``root`` (sys.path[0]), found without
    importing anything; None when it is not there (an installed module)."""
    base = os.path.join(root, *module.split("."))
    for candidate in (base + ".py", os.path.join(base, "__main__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def infer_framework(path: str) -> tuple[str, str] | None:
    """(``"jax"`` or ``"tf"``, the reason) when the file's imports name JAX or TensorFlow and
    not torch; None otherwise (torch, the default, or no telling)."""
    found = read_imports(path)
    if found is None or found.modules & TORCH_PACKAGES:
        return None
    jax, tf = sorted(found.modules & JAX_PACKAGES), sorted(found.modules & TF_PACKAGES)
    if jax and not tf:
        return "jax", f"it imports {', '.join(jax)}"
    if tf and not jax:
        return "tf", f"it imports {', '.join(tf)}"
    return None
