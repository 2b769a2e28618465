"""Notice when a notebook's code changes the code that grades it.

The grader never runs a student's top-level statements, but a notebook's definitions do run some code when they
are defined (default arguments, decorators, class bodies, imports), and the student's functions run while they
are checked. Either could patch the grading code, e.g. ``numpy.allclose = lambda *a, **k: True`` or
``companion.checks.ch01._SENTENCE_SETS.clear()``. :class:`Guard` takes a snapshot of the grading code before the
student's code is loaded and lists what changed after each step; the worker then discards the process.

What is watched:

- every ``companion`` module: the identity of every global except ``None`` (a lazily filled cache), the contents
  of lists, tuples, dicts, sets and arrays, the code, defaults and closure of every function, and the attributes
  of every class defined in the package;
- ``numpy`` (every loaded submodule), ``builtins``, ``math``, ``operator``, ``functools`` and the main torch and
  Keras namespaces: the identity of every function, class and module, and the code and defaults of functions;
- ``torch.Tensor``'s attributes, ``sys.modules`` entries of the watched modules, the trace and profile hooks, the
  import machinery and the number of running threads.

A process that runs untrusted code cannot protect itself completely (the code can reach any object through the
garbage collector): this catches patching, not a determined attack on the grader itself.
"""

from __future__ import annotations

import builtins
import io
import pickle
import sys
import threading
import types
from typing import Any

#: Modules whose every global is watched, with their submodules.
OWN_PREFIXES = ("companion",)
#: Modules whose functions, classes and submodules are watched, with their submodules.
LIBRARY_PREFIXES = ("numpy",)
#: Single modules whose functions, classes and submodules are watched (when loaded).
LIBRARY_MODULES = (
    "builtins",
    "math",
    "operator",
    "functools",
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch.testing",
    "keras",
    "keras.ops",
    "keras.layers",
)
#: Globals that legitimately change: the warnings registry, the interactive ``_``.
IGNORED_NAMES = frozenset({"__warningregistry__", "_"})
#: Containers larger than this are watched by identity only.
MAX_ITEMS = 100_000


def _is_submodule(owner: str, name: str, value: Any) -> bool:
    """Importing ``owner.name`` binds it as an attribute of ``owner``: that is not tampering."""
    return isinstance(value, types.ModuleType) and value.__name__ == f"{owner}.{name}"


class _Fingerprinter(pickle.Pickler):
    """Pickles plain data (exact lists, dicts, tuples, sets, strings, numbers) by value, everything else by identity.

    ``reducer_override`` is not consulted for the exact built-in types, so their contents are written by the C
    pickler; any other object (a subclass, a student's object, a function) is written as its id, without calling
    any of its methods. NumPy arrays are written by value.
    """

    def reducer_override(self, obj: Any) -> Any:
        if obj is _value:  # the marker itself is written by reference
            return NotImplemented
        if _is_array(obj) and obj.nbytes <= 16 * 2**20:
            return _value, (obj.shape, obj.dtype.str, obj.tobytes())
        return _value, (type(obj).__qualname__, id(obj))


def _value(*args: Any) -> None:  # only named in fingerprints, never called
    return None


def _fingerprint(value: Any) -> bytes:
    """A comparable summary of a container's contents (see :class:`_Fingerprinter`)."""
    buffer = io.BytesIO()
    try:
        _Fingerprinter(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except Exception:  # unpicklable in some odd way: fall back to identity
        return repr((type(value).__qualname__, id(value))).encode()
    return buffer.getvalue()


class Guard:
    """A snapshot of the grading code; :meth:`changes` lists what differs from it now."""

    def __init__(self) -> None:
        # (label, namespace, key, value): a global or class attribute that must stay the same object.
        self._entries: list[tuple[str, Any, str, Any]] = []
        # (label, namespace, names at snapshot time, own): where a new name could hide a built-in.
        self._namespaces: list[tuple[str, Any, frozenset[str], bool]] = []
        # (label, namespace, key, fingerprint): a container of the companion whose contents must not change.
        self._contents: list[tuple[str, Any, str, Any]] = []
        # (label, function, code, defaults, kwdefaults, closure contents)
        self._functions: list[tuple[str, types.FunctionType, Any, Any, Any, tuple]] = []
        self._seen_functions: set[int] = set()
        self._seen_classes: set[int] = set()
        self._modules: list[tuple[str, types.ModuleType]] = []
        for name, module in list(sys.modules.items()):
            if not isinstance(module, types.ModuleType):
                continue
            own = _matches(name, OWN_PREFIXES)
            if own or _matches(name, LIBRARY_PREFIXES) or name in LIBRARY_MODULES:
                self._watch_module(name, module, own)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(getattr(torch, "Tensor", None), type):
            self._watch_class("torch.Tensor", torch.Tensor)
        self._hooks = self._hook_state()
        self._threads = threading.active_count()

    # -- taking the snapshot ----------------------------------------------------------------------------------

    def _watch_module(self, name: str, module: types.ModuleType, own: bool) -> None:
        self._modules.append((name, module))
        namespace = vars(module)
        self._namespaces.append((name, namespace, frozenset(namespace), own))
        for key, value in list(namespace.items()):
            if key in IGNORED_NAMES or value is None:  # None: a cache filled on first use
                continue
            if not own and not (callable(value) or isinstance(value, types.ModuleType)):
                continue
            self._entries.append((name, namespace, key, value))
            self._watch_function(f"{name}.{key}", value)
            dunder = key.startswith("__") and key.endswith("__")  # __builtins__, __path__, __all__, ...
            if own and not dunder and (type(value) in (list, tuple, dict, set, frozenset) or _is_array(value)):
                self._contents.append((name, namespace, key, _fingerprint(value)))
            if own and isinstance(value, type) and _matches(getattr(value, "__module__", ""), OWN_PREFIXES):
                self._watch_class(f"{name}.{key}", value)

    def _watch_function(self, label: str, value: Any) -> None:
        candidates = [value]
        if isinstance(value, staticmethod | classmethod):
            candidates = [value.__func__]
        elif not isinstance(value, type | types.ModuleType):
            # Wrappers such as NumPy's array-function dispatchers keep the Python function they call.
            candidates += [getattr(value, attribute, None) for attribute in ("__wrapped__", "_implementation")]
        for function in candidates:
            if isinstance(function, types.FunctionType) and id(function) not in self._seen_functions:
                self._seen_functions.add(id(function))
                closure = tuple(_cell_contents(cell) for cell in function.__closure__ or ())
                self._functions.append(
                    (label, function, function.__code__, function.__defaults__, function.__kwdefaults__, closure)
                )

    def _watch_class(self, label: str, cls: type) -> None:
        if id(cls) in self._seen_classes:
            return
        self._seen_classes.add(id(cls))
        namespace = cls.__dict__  # a live view of the class's attributes
        self._namespaces.append((label, namespace, frozenset(namespace), True))
        for key, value in list(namespace.items()):
            if key in IGNORED_NAMES or key in ("__dict__", "__weakref__", "__doc__"):
                continue
            self._entries.append((label, namespace, key, value))
            self._watch_function(f"{label}.{key}", value)

    @staticmethod
    def _hook_state() -> dict[str, Any]:
        return {
            "sys.gettrace()": sys.gettrace(),
            "sys.getprofile()": sys.getprofile(),
            "the threading trace hook": getattr(threading, "_trace_hook", None),
            "the threading profile hook": getattr(threading, "_profile_hook", None),
            "sys.meta_path": tuple(sys.meta_path),
            "sys.path_hooks": tuple(sys.path_hooks),
        }

    # -- comparing --------------------------------------------------------------------------------------------

    def changes(self) -> list[str]:
        """What differs from the snapshot, in words (an empty list when nothing does)."""
        found: list[str] = []
        for name, module in self._modules:
            if sys.modules.get(name) is not module:
                found.append(f"sys.modules[{name!r}] was replaced")
        for label, namespace, key, value in self._entries:
            now = namespace.get(key, _MISSING)
            if now is not value:
                found.append(f"{label}.{key} was {'deleted' if key not in namespace else 'replaced'}")
        for label, namespace, names, own in self._namespaces:
            if len(namespace) == len(names) and namespace.keys() == names:
                continue
            for key in namespace.keys() - names:
                if key in IGNORED_NAMES or key.startswith("_abc_") or _is_submodule(label, key, namespace[key]):
                    continue
                if hasattr(builtins, key) and label != "builtins":
                    found.append(f"{label}.{key} was added (it hides the built-in `{key}`)")
                elif own:
                    found.append(f"{label}.{key} was added")
        for label, namespace, key, fingerprint in self._contents:
            value = namespace.get(key, _MISSING)
            if value is not _MISSING and _fingerprint(value) != fingerprint:
                found.append(f"the contents of {label}.{key} were changed")
        for label, function, code, defaults, kwdefaults, closure in self._functions:
            if function.__code__ is not code:
                found.append(f"the code of {label} was replaced")
            if function.__defaults__ is not defaults or function.__kwdefaults__ is not kwdefaults:
                found.append(f"the default arguments of {label} were changed")
            if closure:
                now = tuple(_cell_contents(cell) for cell in function.__closure__ or ())
                if len(now) != len(closure) or any(a is not b for a, b in zip(now, closure, strict=False)):
                    found.append(f"the closure of {label} was changed")
        for label, value in self._hook_state().items():
            before = self._hooks[label]
            if isinstance(value, tuple):
                same = len(value) == len(before) and all(a is b for a, b in zip(value, before, strict=False))
            else:
                same = value is before
            if not same:
                found.append(f"{label} was changed")
        if threading.active_count() > self._threads:
            found.append("a thread was started (the grader does not allow threads in answers)")
        return found


_MISSING = object()


def _matches(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def _is_array(value: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and type(value) is numpy.ndarray


def _cell_contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _MISSING
