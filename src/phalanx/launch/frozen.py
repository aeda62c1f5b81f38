"""Frozen code, live paths: a worker runs the code as it was submitted, under the user's file names.

At submit, the snapshot (``storage/snapshot.py``) copies the code under ROOT (the directory the
job was submitted from) into CODE_DIR. The worker runs in the user's own directory, so relative
paths, files written to cwd and paths built from ``__file__`` are what python would give; only
the bytes of Python code come from the copy. ``Freezer(CODE_DIR, ROOT).install()``:

- serves every module that ``sys.path`` finds under ROOT from its copy, under its original name:
  ``__file__``, ``__spec__.origin`` and ``co_filename`` (so tracebacks, logs, ``inspect``) name
  ``ROOT/pkg/mod.py``; the source and its bytecode cache are read and written in CODE_DIR;
- leaves to python, live from ROOT, whatever the copy lacks: compiled extensions, files the
  snapshot left out, namespace packages, modules created after submit;
- makes ``linecache`` (tracebacks, pdb, ``inspect.getsource``, warnings) read those files from
  the copy, so a traceback shows the line that ran, not a later edit.

``run_script`` then runs a script as ``python PATH ARGS`` does: ``sys.argv[0]`` as typed,
``__file__`` absolute, ``sys.path[0]`` the script's real directory, ``__spec__`` None.

Not frozen: what processes the script starts itself (multiprocessing's spawn, a Trainer's
worker scripts) import; they are plain python and read the files as they are then.

Standard library only, imported by every worker that runs frozen code.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, BYTECODE_SUFFIXES, SOURCE_SUFFIXES, ExtensionFileLoader, \
    FileFinder, ModuleSpec, SourceFileLoader, SourcelessFileLoader

TYPE_CHECKING = False  # mypy reads this as True; workers start without importing typing
if TYPE_CHECKING:
    from collections.abc import Mapping

    from typing_extensions import Buffer
    from typing import Any

_PYCACHE = "__pycache__"


def bytecode_dir(code_dir: str) -> str | None:
    """Where frozen bytecode is cached, shared by every job: ``$PHALANX_HOME/cache/code/pyc``
    (``HomePaths.code_bytecode``), found from a code directory laid out as ``$PHALANX_HOME/jobs/<id>/code``
    or ``sweeps/<id>/code``; None elsewhere (the bytecode then stays beside the copy)."""
    home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(code_dir))))
    store = os.path.join(home, "cache", "code")
    return os.path.join(store, "pyc") if os.path.isdir(store) else None


class FrozenLoader(SourceFileLoader):
    """A source loader whose module is named by its original ``path`` while its bytes (and
    bytecode cache) are those of ``copy``. The snapshot's files are hard links into a content
    store, so the bytecode is cached by the copy's inode in ``pycache``: every job that runs
    the same content compiles it once, as python reuses ``__pycache__``."""

    def __init__(self, fullname: str, path: str, copy: str, pycache: str | None = None) -> None:
        super().__init__(fullname, path)
        self.copy = copy
        self.pycache = pycache

    def _at(self, path: str) -> str:
        if path == self.path:
            return self.copy
        head, name = os.path.split(path)
        if head == os.path.join(os.path.dirname(self.path), _PYCACHE):  # its bytecode cache
            if self.pycache:
                st = os.stat(self.copy)
                return os.path.join(self.pycache, f"{st.st_dev:x}-{st.st_ino:x}-{name}")
            return os.path.join(os.path.dirname(self.copy), _PYCACHE, name)
        return path

    def get_data(self, path: str) -> bytes:
        return super().get_data(self._at(path))

    def path_stats(self, path: str) -> Mapping[str, Any]:
        return super().path_stats(self._at(path))

    def set_data(self, path: str, data: Buffer, *, _mode: int = 0o666) -> None:
        super().set_data(self._at(path), data, _mode=_mode)


def _live_loaders() -> list[tuple[Any, list[str]]]:
    """The loaders python's own path hook uses, in its order."""
    return [(ExtensionFileLoader, EXTENSION_SUFFIXES), (SourceFileLoader, SOURCE_SUFFIXES),
            (SourcelessFileLoader, BYTECODE_SUFFIXES)]


class FrozenFinder:
    """The path entry finder for one directory under ROOT (``path``, as ``sys.path`` or a
    package's ``__path__`` spells it) whose copy is ``code``."""

    def __init__(self, path: str, code: str, pycache: str | None = None) -> None:
        self.path = path
        self.code = code
        self.pycache = pycache
        self.live = FileFinder(path, *_live_loaders())
        self._names: set[str] | None = None

    def _listing(self) -> set[str]:
        if self._names is None:
            try:
                self._names = set(os.listdir(self.code))
            except OSError:
                self._names = set()
        return self._names

    def find_spec(self, fullname: str, target: object = None) -> ModuleSpec | None:
        # Python's precedence: a regular package, then a module file, then a namespace portion.
        tail = fullname.rpartition(".")[2]
        names = self._listing()
        if tail in names:
            init = os.path.join(self.code, tail, "__init__.py")
            if os.path.isfile(init):
                package = os.path.join(self.path, tail)
                return self._spec(fullname, os.path.join(package, "__init__.py"), init, package)
        if tail + ".py" in names:
            copy = os.path.join(self.code, tail + ".py")
            if os.path.isfile(copy):
                return self._spec(fullname, os.path.join(self.path, tail + ".py"), copy, None)
        return self.live.find_spec(fullname, target)  # type: ignore[arg-type]

    def _spec(self, fullname: str, origin: str, copy: str, package: str | None) -> ModuleSpec | None:
        from importlib.util import spec_from_file_location

        return spec_from_file_location(fullname, origin, loader=FrozenLoader(fullname, origin, copy, self.pycache),
                                       submodule_search_locations=[package] if package else None)

    def invalidate_caches(self) -> None:
        self._names = None
        self.live.invalidate_caches()


class Freezer:
    """Python code under ``root`` is read from its copy under ``code_dir``."""

    def __init__(self, code_dir: str, root: str) -> None:
        self.code = os.path.realpath(code_dir)
        self.root = os.path.realpath(root)
        self.pycache = bytecode_dir(code_dir)

    def copy_dir(self, directory: str) -> str | None:
        """The copy of ``directory`` (any spelling of a directory under ROOT), if the copy has it."""
        real = os.path.realpath(directory)
        if real != self.root and not real.startswith(self.root + os.sep):
            return None
        copy = self.code + real[len(self.root):]
        return copy if os.path.isdir(copy) else None

    def copy_of(self, path: str) -> str | None:
        """The copy of the file ``path`` under ROOT, if the snapshot holds it."""
        head, name = os.path.split(os.path.abspath(path))
        folder = self.copy_dir(head)
        copy = os.path.join(folder, name) if folder else None
        return copy if copy and os.path.isfile(copy) else None

    def path_hook(self, entry: str) -> FrozenFinder:
        path = os.path.join(os.getcwd(), entry) if not os.path.isabs(entry or "") else entry
        code = self.copy_dir(path)
        if code is None:
            raise ImportError("not under the frozen root")  # the next hook (python's) takes it
        return FrozenFinder(path, code, self.pycache)

    def install(self) -> None:
        """Route imports under ROOT and ``linecache`` through the copy, from now on."""
        import linecache

        sys.path_hooks.insert(0, self.path_hook)
        for entry in list(sys.path_importer_cache):  # finders python made before the hook
            if self.copy_dir(os.path.join(os.getcwd(), entry or "")) is not None:
                del sys.path_importer_cache[entry]
        original = linecache.updatecache

        def updatecache(filename: str, module_globals: Any = None) -> list[str]:
            copy = self.copy_of(filename) if filename and not filename.startswith("<") else None
            if copy is None:
                return original(filename, module_globals)
            try:
                import tokenize

                with tokenize.open(copy) as fh:
                    lines = fh.readlines()
            except (OSError, UnicodeDecodeError, SyntaxError):
                return original(filename, module_globals)
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n"
            # mtime None: checkcache leaves the entry alone (the copy never changes).
            linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
            return lines

        linecache.updatecache = updatecache


def run_script(path: str, args: list[str], freezer: Freezer | None) -> None:
    """Run ``path`` (as typed, relative to cwd) as ``python PATH ARGS`` would, in a fresh
    ``__main__``; its bytes from the snapshot's copy when there is one."""
    import builtins
    import types

    sys.argv = [path, *args]
    file = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    sys.path[0] = os.path.dirname(os.path.realpath(file))
    copy = freezer.copy_of(file) if freezer else None
    loader = FrozenLoader("__main__", file, copy) if copy else SourceFileLoader("__main__", file)
    source = loader.get_data(file)
    code = compile(source, file, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=file, __cached__=None, __loader__=loader, __package__=None, __spec__=None,
                         __builtins__=builtins)
    if sys.version_info < (3, 14):  # python's __main__ starts with it; 3.14 annotates lazily
        main.__dict__["__annotations__"] = {}
    sys.modules["__main__"] = main
    exec(code, main.__dict__)
