"""Find, in the notebook's source, answers that reach a forbidden implementation (read as text, never run).

An exercise declares the calls that answer it in one go (``shortcuts=`` of :func:`companion.checks.exercise`,
e.g. ``torch.nn.functional.scaled_dot_product_attention`` for attention). The answer's function or class, and
every function, class and import of the notebook it refers to (its helpers, transitively), are searched for

- an import of the course's own package (``companion``) other than ``companion.checks.check``;
- a name that resolves, through the notebook's imports, to a forbidden call (``F.scaled_dot_product_attention``
  with ``import torch.nn.functional as F``, ``nn.MultiheadAttention`` with ``from torch import nn``);
- an attribute or a string equal to the last part of a forbidden call when that part is distinctive (it names
  attention, or is 15 characters or more), which also catches ``getattr(F, "scaled_dot_product_attention")``
  and the same function reached through another module.

Inside the sandbox the same calls are tripwires that raise when the exercise is checked (see
:mod:`companion.grade.sandbox.child`), and the course's package is not there at all.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable

from .notebooks import Cell

ALLOWED_COMPANION = {"companion.checks.check", "companion.checks"}


def _bindings(cells: list[Cell]) -> tuple[dict[str, ast.AST], dict[str, str]]:
    definitions: dict[str, ast.AST] = {}
    imports: dict[str, str] = {}
    for cell in cells:
        if cell.problems or not cell.nodes or cell.tree is None:
            continue
        for index in cell.nodes:
            node = cell.tree.body[index]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                definitions[node.name] = node
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    imports[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                        alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        definitions[target.id] = node
    return definitions, imports


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def find_shortcuts(cells: list[Cell], symbol: str, forbidden: tuple[str, ...]) -> list[str]:
    """The forbidden calls that ``symbol`` reaches, directly or through the notebook's helpers, as written."""
    definitions, imports = _bindings(cells)
    if symbol in imports and symbol not in definitions:  # the answer is imported, e.g. from companion.text
        full = imports[symbol]
        forbidden_import = _is_companion(full) or full in forbidden
        return [f"`{full}`" + (" (the course's own implementation)" if _is_companion(full) else "")] \
            if forbidden_import else []
    if symbol not in definitions:
        return []
    leaves = {name.rpartition(".")[2]: name for name in forbidden
              if "ttention" in name.rpartition(".")[2] or len(name.rpartition(".")[2]) >= 15}
    found: list[str] = []
    seen: set[str] = set()
    queue = [symbol]
    while queue:
        name = queue.pop()
        if name in seen or name not in definitions:
            continue
        seen.add(name)
        for node in ast.walk(definitions[name]):
            if isinstance(node, ast.Import | ast.ImportFrom):  # an import inside a function
                module = node.module if isinstance(node, ast.ImportFrom) else None
                for alias in node.names:
                    full = f"{module}.{alias.name}" if module else alias.name
                    if _is_companion(full):
                        found.append(f"`{full}` (the course's own implementation)")
                    if alias.name.rpartition(".")[2] in leaves:
                        found.append(f"`{leaves[alias.name.rpartition('.')[2]]}`")
            dotted = None
            if isinstance(node, ast.Attribute):
                dotted = _dotted(node)
                if node.attr in leaves:
                    found.append(f"`{leaves[node.attr]}`")
            elif isinstance(node, ast.Name):
                dotted = node.id
                queue.append(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value in leaves:
                    found.append(f"`{leaves[node.value]}`")
                elif node.value.startswith("companion.") and _is_companion(node.value):
                    found.append(f"`{node.value}` (the course's own implementation)")
            if dotted:
                head, _, rest = dotted.partition(".")
                if head in imports:
                    full = imports[head] + ("." + rest if rest else "")
                    if _is_companion(full):
                        found.append(f"`{full}` (the course's own implementation)")
                    if full in forbidden:
                        found.append(f"`{full}`")
    return list(dict.fromkeys(found))


def _is_companion(full: str) -> bool:
    if not (full == "companion" or full.startswith("companion.")):
        return False
    return full not in ALLOWED_COMPANION



def tripwire_names(chapters: Iterable[str] | None = None) -> list[str]:
    """The shortcuts of ``chapters`` (None: every chapter) whose library is installed here.

    A student process sets the shortcuts of its exercises as tripwires, which imports what they name; for chapter
    9 (Keras Hub's layers, Transformers' Llama) that takes seconds. A zygote imports them once instead, before any
    student's code, so each student process it forks starts with them (as it would have imported them itself)."""
    from companion.checks import registry

    wanted = None if chapters is None else set(chapters)
    names = {shortcut for exercise in registry().values() if wanted is None or exercise.chapter in wanted
             for shortcut in exercise.shortcuts}
    return sorted(name for name in names if importlib.util.find_spec(name.split(".")[0]) is not None)
