"""The package's layout: no import circle inside ``companion``, and imports that flow one way between its rooms.

The imports are read with ``ast`` (nothing is imported), so the test is fast and sees every module, including the
ones a test run would not load. An import inside a function runs only when the function is called and cannot
deadlock a module's start-up, so only the imports a module runs when it loads count here (module level, and inside
module-level ``if`` and ``try``; not under ``if TYPE_CHECKING:``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "companion"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _load_time_statements(tree: ast.Module) -> list[ast.stmt]:
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the companion modules it imports when it loads."""
    files = [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    known = {_module_name(p) for p in files}
    graph = {}
    for path in files:
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _load_time_statements(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                wanted = [module] + [f"{module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in wanted:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_inside_companion():
    graph = import_graph()
    assert "companion.torch.model" in graph and "companion.torch.masking" in graph["companion.torch.model"]
    assert circles(graph) == []


def test_imports_flow_one_way_between_rooms():
    # The framework-free top level never loads a framework package; the frameworks never load each other; nothing
    # the student edition ships loads the instructor's tools.
    for module, targets in import_graph().items():
        if module.startswith("companion.instructor"):
            continue
        assert not {t for t in targets if t.startswith("companion.instructor")}, module
        if module.startswith("companion.torch"):
            assert not {t for t in targets if t.startswith("companion.keras")}, module
        if module.startswith("companion.keras"):
            assert not {t for t in targets if t.startswith("companion.torch")}, module
        framework_free = module.startswith("companion.reference") or module.count(".") == 1 and not module.startswith(
            ("companion.torch", "companion.keras", "companion.grade", "companion.checks"))
        if framework_free:
            assert not {t for t in targets if t.startswith(("companion.torch", "companion.keras"))}, module
