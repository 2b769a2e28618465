"""Read the code of a notebook (MyST ``.md`` or ``.ipynb``) and keep only its definitions.

The grader and the tests use this to load a student's functions and classes without running the student's
top-level statements: check cells, prints and anything that might patch the checks never execute.
"""

from __future__ import annotations

import ast
from pathlib import Path

import jupytext
from IPython.core.inputtransformer2 import TransformerManager

#: Top-level statements that are kept: imports, functions and classes.
DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def code_cells(path: str | Path) -> list[str]:
    """The source of every code cell, with IPython magics turned into plain Python."""
    notebook = jupytext.read(str(path))
    transform = TransformerManager().transform_cell
    return [transform(cell.source) for cell in notebook.cells if cell.cell_type == "code"]


def definitions(source: str) -> tuple[str, list[str]]:
    """Keep the imports, functions and classes of one cell's source.

    Returns:
        (the kept code, a list of problems such as a syntax error with its line number).
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return "", [f"syntax error on line {error.lineno}: {error.msg}"]
    kept = [node for node in tree.body if isinstance(node, DEFINITIONS)]
    return ast.unparse(ast.Module(body=kept, type_ignores=[])), []


def load_definitions(path: str | Path) -> dict[str, object]:
    """Execute a notebook's definitions in a fresh namespace and return that namespace (in this process)."""
    namespace: dict[str, object] = {"__name__": "student_notebook"}
    for cell in code_cells(path):
        code, problems = definitions(cell)
        if not problems:
            exec(compile(code, str(path), "exec"), namespace)
    return namespace
