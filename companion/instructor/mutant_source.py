"""Write a function or class that lives in a Python module (say, a typical mistake in a test) as self-contained source.

The synthetic class (:mod:`companion.instructor.synthetic`) gives its mutant students the typical mistakes committed in
``tests/test_exercises*.py``. A grader's sandbox shows the student's process neither ``tests/`` nor the course's
package, so the mistake must travel inside the student's notebook, as code the grader keeps (imports, functions,
classes). :func:`render` writes such code for an object built in one of three ways:

- a module-level function or class: its source, and recursively every module-level helper it uses;
- a closure made by a factory (``_attention(scale="none")`` returns a nested ``attention``): a new factory that
  binds the closure's variables to their values (literals, modules, other renderable closures), then defines the
  nested function or class as written and returns it;
- anything else (a lambda, a closure over an object that has no source) raises :class:`NotRenderable`.

Every top-level name the rendered code defines starts with a prefix, so it cannot replace a name of the notebook
it is appended to; the answer itself is a ``def`` (or ``class``) with the exercise's name that forwards to it.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import math
import sys
import textwrap
import types
from typing import Any

import numpy as np

#: Packages the rendered code may import: what a student's process has.
IMPORTABLE = ("numpy", "torch", "keras", "tensorflow", "math", "itertools", "functools", "collections", "re")


class NotRenderable(ValueError):
    """The object cannot be written as self-contained source (the message says why)."""


def _literal(value: Any) -> str | None:
    """Source for a literal value (None when ``value`` is not one)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if isinstance(value, tuple | list) and not isinstance(value, str):
        items = [_literal(v) for v in value]
        if None in items:
            return None
        body = ", ".join(items) + ("," if isinstance(value, tuple) and len(items) == 1 else "")
        return f"({body})" if isinstance(value, tuple) else f"[{body}]"
    if value is None or isinstance(value, bool | int | float | str | bytes):
        text = repr(value)
        try:
            same = ast.literal_eval(text) == value
        except (ValueError, SyntaxError):
            same = False
        return text if same else None
    return None


def _importable(module_name: str) -> bool:
    return module_name.split(".")[0] in IMPORTABLE


def _module_imports(module: types.ModuleType) -> dict[str, str]:
    """Name bound by a top-level import of ``module`` -> that import as a one-name statement."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError) as error:
        raise NotRenderable(f"no source for module {module.__name__}: {error}") from None
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                found[bound] = ast.unparse(ast.Import(names=[alias]))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__" and not node.level:
            for alias in node.names:
                found[alias.asname or alias.name] = ast.unparse(
                    ast.ImportFrom(module=node.module, names=[alias], level=0))
    return found


class _Renamer(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id in self.names:
            node.id = self.names[node.id]
        return node


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the code binds somewhere (parameters, assignments, definitions, imports)."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound


def _functions_of(obj: Any) -> list[types.FunctionType]:
    if isinstance(obj, types.FunctionType):
        return [obj]
    found = []
    for value in vars(obj).values():
        value = getattr(value, "__func__", value)  # staticmethod, classmethod
        if isinstance(value, property):
            found += [f for f in (value.fget, value.fset, value.fdel) if f is not None]
        elif isinstance(value, types.FunctionType):
            found.append(value)
    return found


def _closure(obj: Any) -> dict[str, Any]:
    """Free variable -> value, over the function or every method of the class (``__class__`` left out)."""
    values: dict[str, Any] = {}
    for function in _functions_of(obj):
        for name, cell in zip(function.__code__.co_freevars, function.__closure__ or (), strict=True):
            if name == "__class__":
                continue
            try:
                value = cell.cell_contents
            except ValueError:
                raise NotRenderable(f"{obj.__qualname__}: variable {name!r} is not bound yet") from None
            if name in values and values[name] is not value:
                raise NotRenderable(f"{obj.__qualname__}: variable {name!r} has two values")
            values[name] = value
    return values


class Renderer:
    """Collects the top-level code for one or more objects; names it defines start with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        if not prefix.isidentifier():
            raise ValueError(f"prefix must be a Python identifier; got {prefix!r}")
        self.prefix = prefix
        self.imports: list[str] = []
        self.blocks: list[str] = []
        self.names: dict[int, str] = {}  # id(object) -> the top-level name that holds it (or makes it)
        self.taken: set[str] = set()
        self.active: set[int] = set()

    # -- names ---------------------------------------------------------------------------------------------------
    def _fresh(self, name: str) -> str:
        base = self.prefix + name.strip("_").replace("<", "").replace(">", "")
        candidate, number = base, 1
        while candidate in self.taken:
            number += 1
            candidate = f"{base}_{number}"
        self.taken.add(candidate)
        return candidate

    def _import(self, statement: str) -> None:
        if statement not in self.imports:
            self.imports.append(statement)

    # -- objects -------------------------------------------------------------------------------------------------
    def expression(self, value: Any, where: str) -> str:
        """Source of an expression that, in the rendered code, evaluates to (a copy of) ``value``."""
        literal = _literal(value)
        if literal is not None:
            return literal
        if isinstance(value, types.ModuleType):
            if not _importable(value.__name__):
                raise NotRenderable(f"{where}: module {value.__name__} is not available to a student")
            self._import(f"import {value.__name__}")
            return value.__name__
        if isinstance(value, dict):
            pairs = [f"{self.expression(k, where)}: {self.expression(v, where)}" for k, v in value.items()]
            return "{" + ", ".join(pairs) + "}"
        if isinstance(value, type) and value.__module__ == "numpy" or isinstance(value, np.generic):
            self._import("import numpy")
            if isinstance(value, type):
                return f"numpy.{value.__name__}"
            return f"numpy.{type(value).__name__}({self.expression(value.item(), where)})"
        if isinstance(value, types.FunctionType | type):
            name = self.definition(value)
            return name if "<locals>" not in value.__qualname__ else f"{name}()"
        raise NotRenderable(f"{where}: cannot write a {type(value).__name__} as source")

    def definition(self, obj: Any) -> str:
        """Render a function or class; return the top-level name that holds it (module-level objects) or the name
        of the factory that makes it (closures and nested classes)."""
        if id(obj) in self.names:
            return self.names[id(obj)]
        if id(obj) in self.active:
            raise NotRenderable(f"{obj.__qualname__} refers to itself through a closure")
        if getattr(obj, "__name__", "") == "<lambda>":
            raise NotRenderable(f"{obj.__qualname__}: a lambda has no source of its own; give it a name")
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        if module is None:
            raise NotRenderable(f"{obj!r}: its module is not loaded")
        try:
            source = textwrap.dedent(inspect.getsource(obj))
        except (OSError, TypeError) as error:
            raise NotRenderable(f"{obj.__qualname__}: no source ({error})") from None
        tree = ast.parse(source)
        node = tree.body[0]
        if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.decorator_list:
            raise NotRenderable(f"{obj.__qualname__}: only plain functions and classes (no decorators)")
        nested = "<locals>" in obj.__qualname__
        closure = _closure(obj) if nested else {}
        name = self._fresh(obj.__name__ + ("_make" if nested else ""))
        self.names[id(obj)] = name
        self.active.add(id(obj))
        try:
            renames = self._globals(obj, tree, set(closure), module)
            _Renamer(renames).visit(tree)
            if nested:
                lines = [self._bind(var, value, f"{obj.__qualname__}.{var}") for var, value in closure.items()]
                body = "\n".join(lines + [ast.unparse(node), f"return {node.name}"])
                block = f"def {name}():\n{textwrap.indent(body, '    ')}"
            else:
                node.name = name
                block = ast.unparse(node)
        finally:
            self.active.discard(id(obj))
        self.blocks.append(block)
        return name

    def _bind(self, var: str, value: Any, where: str) -> str:
        """A statement, inside a factory, that binds the closure variable ``var`` to ``value``."""
        if isinstance(value, types.ModuleType):  # `import torch` inside the factory: `torch = torch` would fail
            if not _importable(value.__name__):
                raise NotRenderable(f"{where}: module {value.__name__} is not available to a student")
            return f"import {value.__name__}" if var == value.__name__ else f"import {value.__name__} as {var}"
        return f"{var} = {self.expression(value, where)}"

    def _globals(self, obj: Any, tree: ast.AST, free: set[str], module: types.ModuleType) -> dict[str, str]:
        """Render the module-level names the source reads; return old name -> name in the rendered code."""
        local = _bound_names(tree.body[0]) - {tree.body[0].name} | free
        imports = None
        renames: dict[str, str] = {}
        for name in sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}):
            if name in local:
                continue
            if name not in vars(module):
                if hasattr(builtins, name):
                    continue
                raise NotRenderable(f"{obj.__qualname__}: unknown name {name!r}")
            imports = _module_imports(module) if imports is None else imports
            if name in imports:
                statement = imports[name]
                head = ast.parse(statement).body[0]
                origin = head.module if isinstance(head, ast.ImportFrom) else head.names[0].name
                if not _importable(origin):
                    raise NotRenderable(f"{obj.__qualname__}: uses {name!r} from {origin}, which students lack")
                self._import(statement)
                continue
            value = vars(module)[name]
            literal = _literal(value)
            if literal is not None:
                fresh = self._fresh(name)
                self.blocks.append(f"{fresh} = {literal}")
                renames[name] = fresh
            elif isinstance(value, types.FunctionType | type) and value.__module__ == module.__name__ \
                    and "<locals>" not in value.__qualname__:
                renames[name] = self.definition(value)
            else:
                raise NotRenderable(f"{obj.__qualname__}: cannot write module-level {name!r} as source")
        return renames

    def source(self) -> str:
        return "\n".join(self.imports) + "\n\n" + "\n\n".join(self.blocks) + "\n"


def _signature(function: Any) -> tuple[str, str]:
    """(parameter list, call arguments) that forward every argument of ``function`` unchanged."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return "*args, **kwargs", "*args, **kwargs"
    params, args = [], []
    positional_only = False
    for parameter in signature.parameters.values():
        kind = parameter.kind
        text = parameter.name
        if parameter.default is not parameter.empty:
            default = _literal(parameter.default)
            if default is None:
                return "*args, **kwargs", "*args, **kwargs"
            text += f"={default}"
        if kind is parameter.VAR_POSITIONAL:
            params.append(f"*{parameter.name}")
            args.append(f"*{parameter.name}")
            continue
        if kind is parameter.VAR_KEYWORD:
            params.append(f"**{parameter.name}")
            args.append(f"**{parameter.name}")
            continue
        if kind is parameter.KEYWORD_ONLY and not any(p.startswith("*") for p in params):
            params.append("*")
        params.append(text)
        args.append(parameter.name if kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
                    else f"{parameter.name}={parameter.name}")
        positional_only |= kind is parameter.POSITIONAL_ONLY
    if positional_only:
        return "*args, **kwargs", "*args, **kwargs"
    return ", ".join(params), ", ".join(args)


def render(obj: Any, symbol: str, prefix: str | None = None) -> str:
    """Self-contained source that defines ``symbol`` as ``obj``: a def forwarding to a function, or a class
    deriving from a class.

    Raises:
        NotRenderable: ``obj`` (or something it uses) cannot be written as source.
    """
    if not symbol.isidentifier():
        raise ValueError(f"symbol must be a Python identifier; got {symbol!r}")
    renderer = Renderer(prefix or f"_{symbol}_")
    target = renderer.expression(obj, symbol)
    if isinstance(obj, type):
        answer = f"class {symbol}({target}):\n    pass"
    elif callable(obj):
        params, args = _signature(obj)
        answer = f"def {symbol}({params}):\n    return {target}({args})"
    else:
        raise NotRenderable(f"{symbol}: expected a function or a class; got {type(obj).__name__}")
    return renderer.source() + "\n\n" + answer + "\n"
