"""Imports done once in the pool, seen by each forked child exactly when it imports them itself.

A cold start's ``sys.modules`` holds the interpreter's start-up modules and then what the script
imports; a pool holds torch and a thousand more. A child must not show them (libraries test
``"torch" in sys.modules``), so it starts with the pool's start-up modules only and the rest kept
aside, and gets them back when it imports them: ``import torch`` puts back exactly what importing
torch put into ``sys.modules`` in the pool (in the same order), without running any of it again.

For that the pool records, while it imports (``Recorder``):

- per module, in order, what its loading imported, whether loaded then or already there
  (``builtins.__import__`` and the loader), so that importing it alone later brings back the same
  modules in the order a cold import would put them into ``sys.modules``;
- per module, what appeared in ``sys.modules`` while it was loading (the loader moves a module to
  the end of ``sys.modules`` when it is done, so that is everything from where it was inserted),
  which also catches modules that extensions put there themselves;
- what loading it registered in registries shared with modules a script may import without it:
  warning filters, ``atexit`` and ``threading`` exit callbacks, ``copyreg`` picklers, and the
  environment variables it set or removed. A child
  undoes those of the modules it keeps aside and redoes them, in the original order, when it
  imports the module (``Restorer``).

What a module does to another module's own state while importing (a logger registered in
``logging``) is not undone: a script that imports ``logging`` without torch sees torch's loggers.
"""

import atexit
import builtins
import os
import sys
import warnings

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

_bootstrap = sys.modules["_frozen_importlib"]
_bootstrap_external = sys.modules["_frozen_importlib_external"]


class Recorder:
    """Watches the pool's imports. ``start()`` before the first import to record, ``stop()`` after
    the last; what it learnt stays in its attributes."""

    def __init__(self, baseline: tuple[str, ...]) -> None:
        self.baseline = baseline  # sys.modules when the interpreter had started
        self.importers: tuple[str, ...] = ()  # sys.path[0], then the rest of sys.path_importer_cache
        self.loading: list[str] = []
        self.loaded: dict[str, list[str]] = {}  # module -> what appeared while it loaded (itself last)
        self.asked: dict[str, list[str]] = {}  # module -> what its loading imported, in order
        self.effects: list[tuple[str, str, Any]] = []  # (owner, kind, payload), in order
        self.atexit_before = -1
        self.filters_before: "list[Any]" = []
        self.active = False
        self._patched: list[tuple[Any, str, Any]] = []
        self._known = len(sys.modules)
        self._accounted: set[str] = set(sys.modules)

    def start(self) -> None:
        """Start recording (again); a no-op while recording."""
        if self._patched:
            return
        self.active = True
        if self.atexit_before < 0:  # the first time: what the interpreter had before any of them
            self.atexit_before = atexit._ncallbacks()
            self.filters_before = list(warnings.filters)
        self._patch(_bootstrap, "_load_unlocked", self._load_unlocked)
        self._patch(builtins, "__import__", self._import)
        self._patch(warnings, "_add_filter", self._add_filter)
        self._patch(atexit, "register", self._atexit)
        for name in ("copyreg", "threading"):
            if name in sys.modules:
                self._patch_late(name)

    def stop(self) -> None:
        """Put back every function it replaced; wrappers bound elsewhere just pass through."""
        self.active = False
        for owner, attr, original in reversed(self._patched):
            setattr(owner, attr, original)
        self._patched.clear()

    def _patch(self, owner: "Any", attr: str, wrapper: "Callable[..., Any]") -> None:
        original = getattr(owner, attr)
        self._patched.append((owner, attr, original))
        setattr(owner, attr, wrapper)
        setattr(self, f"_orig_{attr}", original)

    def _patch_late(self, name: str) -> None:
        if name == "copyreg":
            self._patch(sys.modules[name], "pickle", self._copyreg)
        elif name == "threading" and hasattr(sys.modules[name], "_register_atexit"):
            self._patch(sys.modules[name], "_register_atexit", self._thread_atexit)

    def _load_unlocked(self, spec: "Any") -> "ModuleType":
        if not self.active:
            return self._orig__load_unlocked(spec)  # type: ignore[attr-defined, no-any-return]
        self._sync()
        start = len(sys.modules)
        if self.loading:
            self.asked.setdefault(self.loading[-1], []).append(spec.name)
        self._accounted.add(spec.name)
        self.loading.append(spec.name)
        environ = dict(os.environ)
        try:
            module = self._orig__load_unlocked(spec)  # type: ignore[attr-defined]
            self._sync()
        except BaseException:
            self._known = min(self._known, len(sys.modules))  # the loader took the module out again
            raise
        finally:
            self.loading.pop()
        self.loaded[spec.name] = list(sys.modules)[start:]
        # Variables its loading set or removed (torch._inductor sets TORCHINDUCTOR_CACHE_DIR): a
        # child's environment is the client's, so they are set again when it imports the module.
        for key in sorted(set(environ) | set(os.environ)):
            if environ.get(key) != os.environ.get(key):
                self.effects.append((spec.name, "environ", (key, os.environ.get(key))))
        if spec.name in ("copyreg", "threading"):
            self._patch_late(spec.name)
        return module  # type: ignore[no-any-return]

    def _import(self, name: str, globals: "Any" = None, locals: "Any" = None, fromlist: "Any" = (), level: int = 0) -> "Any":
        if not (self.active and self.loading):
            return self._orig___import__(name, globals, locals, fromlist, level)  # type: ignore[attr-defined]
        self._sync()
        asked = self.asked.setdefault(self.loading[-1], [])
        try:
            full = _bootstrap._resolve_name(name, _bootstrap._calc___package__(globals), level) if level else name
        except (ImportError, KeyError, TypeError, ValueError):
            full = ""
        if full:
            asked.append(full)
        module = self._orig___import__(name, globals, locals, fromlist, level)  # type: ignore[attr-defined]
        for item in fromlist or () if full else ():
            if f"{full}.{item}" in sys.modules:
                asked.append(f"{full}.{item}")
        return module

    def _sync(self) -> None:
        """Modules that appeared in ``sys.modules`` without the loader (an extension module adds
        its submodules itself) count as imported by the module loading, at this point."""
        if len(sys.modules) <= self._known:
            return
        # From one before: the loader moving a finished module to the end shifts the rest back.
        for name in list(sys.modules)[max(0, self._known - 1):]:
            if name not in self._accounted:
                self._accounted.add(name)
                if self.loading:
                    self.asked.setdefault(self.loading[-1], []).append(name)
        self._known = len(sys.modules)

    def _effect(self, kind: str, payload: "Any") -> None:
        if self.active and self.loading:
            self.effects.append((self.loading[-1], kind, payload))

    def _add_filter(self, *item: "Any", append: bool) -> None:
        self._effect("filter", (item, append))
        self._orig__add_filter(*item, append=append)  # type: ignore[attr-defined]

    def _atexit(self, func: "Callable[..., Any]", *args: "Any", **kwargs: "Any") -> "Callable[..., Any]":
        self._effect("atexit", (func, args, kwargs))
        return self._orig_register(func, *args, **kwargs)  # type: ignore[attr-defined, no-any-return]

    def _copyreg(self, cls: "Any", function: "Any", constructor: "Any" = None) -> None:
        self._effect("copyreg", (cls, function, constructor))
        self._orig_pickle(cls, function, constructor)  # type: ignore[attr-defined]

    def _thread_atexit(self, func: "Callable[..., Any]", *args: "Any", **kwargs: "Any") -> None:
        self._effect("thread_atexit", (func, args, kwargs))
        self._orig__register_atexit(func, *args, **kwargs)  # type: ignore[attr-defined]

    def unexplained(self) -> str | None:
        """Why the recorded imports cannot be kept aside faithfully, or None. Checked after the
        pool's imports: changes to registries the recorder cannot replay. Drops the filters that
        imports added only for a while (inside ``warnings.catch_warnings``)."""
        if self.atexit_before != 0:
            return "atexit callbacks registered before the pool's imports"
        recorded = sum(1 for _owner, kind, _p in self.effects if kind == "atexit")
        if atexit._ncallbacks() != recorded:
            return f"{atexit._ncallbacks() - recorded} atexit callback(s) registered outside an import"
        current = list(warnings.filters)
        self.effects = [e for e in self.effects if e[1] != "filter" or e[2][0] in current]
        replayed = list(self.filters_before)
        for _owner, kind, (item, append) in ((o, k, p) for o, k, p in self.effects if k == "filter"):
            if not append:
                if item in replayed:
                    replayed.remove(item)
                replayed.insert(0, item)
            elif item not in replayed:
                replayed.append(item)
        if replayed != current:
            return "warning filters changed in a way the pool cannot replay"
        return None


class Restorer:
    """Keeps the pool's imports aside until a script imports them. The pool hides them once after
    its imports (``hide`` + ``install``), so that every child it forks starts that way without
    touching a thousand modules (which would copy their pages); ``unhide`` undoes it for the
    pool's own later imports."""

    def __init__(self, recorder: Recorder, on_miss: "Callable[[str], None] | None" = None) -> None:
        self.rec = recorder
        self.on_miss = on_miss
        self.hidden: "dict[str, ModuleType]" = {}
        self.order: dict[str, int] = {}  # where each hidden module stood in sys.modules
        self.detached: dict[str, tuple[Any, str]] = {}  # module -> (parent module, attribute)
        self.path: list[str] = []
        self._original: Any = None
        self._missing = 0  # depth of imports the pool did not hold, under way

    def hide(self) -> None:
        """Take every module the start-up did not import out of ``sys.modules``, with its
        attribute on its parent package and the registry entries its import made. Idempotent."""
        base = set(self.rec.baseline)
        for index, name in enumerate(list(sys.modules)):
            if name not in base:
                self.order[name] = index
                self.hidden[name] = sys.modules.pop(name)
        for name, module in self.hidden.items():
            parent_name, _, attr = name.rpartition(".")
            parent = sys.modules.get(parent_name) or self.hidden.get(parent_name)
            if parent is not None and parent.__dict__.get(attr) is module:
                del parent.__dict__[attr]
                self.detached[name] = (parent, attr)
        warnings.filters[:] = self.rec.filters_before  # type: ignore[index]
        warnings._filters_mutated()  # type: ignore[attr-defined]
        atexit._clear()
        for owner, kind, payload in self.rec.effects:
            if kind == "copyreg" and owner in self.hidden:
                copyreg = self.hidden.get("copyreg") or sys.modules["copyreg"]
                copyreg.dispatch_table.pop(payload[0], None)
            elif kind == "thread_atexit" and owner in self.hidden:
                threading = self.hidden.get("threading") or sys.modules["threading"]
                calls = threading._threading_atexits
                calls[:] = [c for c in calls if getattr(c, "func", None) is not payload[0]]
        self.path = list(sys.path)

    def hidden_cleanly(self) -> bool:
        """``sys.modules`` is still exactly the start-up's (nothing was imported since ``hide``)."""
        return list(sys.modules) == list(self.rec.baseline)

    def unhide(self) -> None:
        """Put every module back as the pool had it, and what their imports registered."""
        for name in sorted(self.hidden, key=lambda n: self.order.get(n, 0)):
            sys.modules[name] = self.hidden.pop(name)
        for name, (parent, attr) in self.detached.items():
            parent.__dict__[attr] = sys.modules[name]
        self.detached.clear()
        for _owner, kind, payload in self.rec.effects:
            _redo(kind, payload)

    def install(self) -> None:
        """Route imports through the modules kept aside (replaces the import system's
        ``_find_and_load_unlocked``: ``sys.meta_path`` and the rest stay as they are)."""
        if self._original is None:
            self._original = _bootstrap._find_and_load_unlocked  # type: ignore[attr-defined]
            _bootstrap._find_and_load_unlocked = self._find_and_load_unlocked  # type: ignore[attr-defined]

    def uninstall(self) -> None:
        if self._original is not None:
            _bootstrap._find_and_load_unlocked = self._original  # type: ignore[attr-defined]
            self._original = None

    def started(self) -> None:
        """In the child, once it has the script's sys.path: changes to it from here on may make
        another module win (``_shadowed``)."""
        self.path = list(sys.path)

    def _find_and_load_unlocked(self, name: str, import_: "Callable[[str], Any]") -> "ModuleType":
        if name not in self.hidden:
            if self.on_miss is not None and not self._missing:  # the outermost import only
                self.on_miss(name)
            self._missing += 1
            try:
                return self._original(name, import_)  # type: ignore[no-any-return]
            finally:
                self._missing -= 1
        parent = name.rpartition(".")[0]
        if parent and parent not in sys.modules:
            import_(parent)
            if name in sys.modules:
                return sys.modules[name]
        if sys.path != self.path and self._shadowed(name):
            return self._original(name, import_)  # type: ignore[no-any-return]
        self.restore(name)
        return sys.modules[name]

    def _shadowed(self, name: str) -> bool:
        """The script changed sys.path since it started: would it now find another ``name``?"""
        top = name.partition(".")[0]
        module = self.hidden.get(top) or sys.modules.get(top)
        if module is None or top in sys.modules:
            return False
        try:
            spec = _bootstrap._find_spec(top, None)
        except (ImportError, ValueError):
            return True
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        return spec is None or spec.origin != origin

    def restore(self, name: str) -> None:
        """Put ``name`` back with everything importing it brought in the pool, in the order the
        import system would have put them into ``sys.modules``; then redo what their imports
        registered."""
        order: list[str] = []
        self._replay(name, set(), order)
        for module in order:
            if module in self.detached:
                parent, attr = self.detached.pop(module)
                parent.__dict__[attr] = sys.modules[module]
        wanted = set(order)
        for owner, kind, payload in self.rec.effects:
            if owner in wanted:
                _redo(kind, payload)
        for module in order:
            if module in RESEED:
                RESEED[module](sys.modules[module])

    def _replay(self, name: str, loading: set[str], order: list[str]) -> None:
        """Import ``name`` as the import system does, from what the pool recorded: its package
        first, then (while it is 'loading') what its code imported, then itself."""
        if name not in self.hidden or name in loading:
            return
        parent = name.rpartition(".")[0]
        if parent:
            self._replay(parent, loading, order)
            if name not in self.hidden:
                return
        loading.add(name)
        for need in (*self.rec.asked.get(name, ()), *self.rec.loaded.get(name, ())):
            if need not in sys.modules and need not in self.hidden:
                _searched(need, None, self._package(need))  # failed in the pool, fails here: it searched
            self._replay(need, loading, order)
        loading.discard(name)
        module = sys.modules[name] = self.hidden.pop(name)
        _searched(name, module, self._package(name))
        order.append(name)

    def _package(self, name: str) -> "ModuleType | None":
        parent = name.rpartition(".")[0]
        return (sys.modules.get(parent) or self.hidden.get(parent)) if parent else None


def _searched(name: str, module: "ModuleType | None", package: "ModuleType | None") -> None:
    """Leave in ``sys.path_importer_cache`` what the path finder's search for ``name`` would have
    left: a finder for each directory it looked in (the package's, or sys.path up to the one
    holding the module; all of them when the module was not found)."""
    spec = getattr(module, "__spec__", None)
    if module is not None and (spec is None or not spec.has_location or spec.origin is None):
        return  # built in, frozen or made by hand: the path finder never looked
    if "." in name:
        entries = list(getattr(package, "__path__", None) or [])
    else:
        entries = list(sys.path)
    where = None
    if spec is not None:
        where = os.path.dirname(spec.origin)
        if spec.submodule_search_locations is not None:
            where = os.path.dirname(where)
    cache = _bootstrap_external.PathFinder._path_importer_cache
    for entry in entries:
        if not isinstance(entry, str):
            continue
        try:
            cache(entry)
        except (ImportError, OSError):
            return
        if where is not None and os.path.abspath(entry or ".") == where:
            return


def _reseed_torch(module: "Any") -> None:
    module.default_generator.seed()  # torch seeds its CPU generator from entropy when it loads


def _reseed_numpy(module: "Any") -> None:
    module._rand.seed()  # numpy's global RandomState is seeded from entropy when it loads


def _reseed_multiprocessing(module: "Any") -> None:
    module._current_process._config["authkey"] = module.AuthenticationString(os.urandom(32))


# What a module draws from entropy when it loads, drawn again when a child gets it back, so that
# children differ as separate processes do. (``random`` reseeds itself after every fork.)
RESEED: "dict[str, Callable[[Any], None]]" = {
    "torch._C": _reseed_torch,
    "numpy.random.mtrand": _reseed_numpy,
    "multiprocessing.process": _reseed_multiprocessing,
}


def _redo(kind: str, payload: "Any") -> None:
    if kind == "environ":
        key, value = payload
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    elif kind == "filter":
        item, append = payload
        warnings._add_filter(*item, append=append)  # type: ignore[attr-defined]
    elif kind == "atexit":
        func, args, kwargs = payload
        atexit.register(func, *args, **kwargs)
    elif kind == "copyreg":
        sys.modules["copyreg"].dispatch_table[payload[0]] = payload[1]
    elif kind == "thread_atexit":
        func, args, kwargs = payload
        sys.modules["threading"]._register_atexit(func, *args, **kwargs)
