"""What a script imports, read from its source without running it (``ast``).

Used to infer the framework of a multi-node job given no ``--framework`` (``infer_framework``).
Whether phalanx initializes JAX does not depend on the source (``core/env.initializes_jax``).
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


class _Reader(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found = Imports()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.modules.add(alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and not node.level:
            self.found.modules.add(node.module.split(".")[0])


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
