"""Read the code of a notebook (MyST ``.md`` or ``.ipynb``) and keep only its definitions.

The grader and the tests use this to load a student's functions and classes without running the student's
top-level statements: check cells, prints and anything that might patch the checks never execute. Kept are
imports, functions, classes, and constants assigned a literal value (``D_MODEL = 8``, ``NAMES = ("a", "b")``),
which run no code.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

#: Top-level statements that are kept: imports, functions and classes (and literal constants, see is_constant).
DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def is_constant(node: ast.stmt) -> bool:
    """``NAME = literal`` (or ``A = B = literal``): numbers, strings, and tuples, lists, dicts and sets of them."""
    if not isinstance(node, ast.Assign) or not all(isinstance(t, ast.Name) for t in node.targets):
        return False
    try:
        ast.literal_eval(node.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True

#: Notebooks larger than this are refused (a notebook full of images is a few megabytes).
MAX_NOTEBOOK_BYTES = 64 * 2**20


class NotebookError(ValueError):
    """A notebook that cannot be read; the message says why, in words meant for the student."""


def read_notebook(path: str | Path):
    """Read a notebook with jupytext, turning every way a file can be broken into a NotebookError.

    ``.ipynb`` files must be JSON; every other extension is read as text by jupytext (MyST Markdown for ``.md``).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_NOTEBOOK_BYTES:
            limit = MAX_NOTEBOOK_BYTES >> 20
            raise NotebookError(f"the file is {size / 2**20:.0f} MB; a notebook over {limit} MB is refused")
        data = path.read_bytes()
    except NotebookError:
        raise
    except OSError as error:
        raise NotebookError(f"cannot read the file: {error.strerror or error}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise NotebookError(
            f"the file is not UTF-8 text (byte 0x{data[error.start]:02x} on line {line}); "
            "save it again with UTF-8 encoding"
        ) from None
    if path.suffix == ".ipynb":
        try:
            content = json.loads(text)
        except json.JSONDecodeError as error:
            raise NotebookError(
                f"the file is not valid JSON ({error.msg} on line {error.lineno}, column {error.colno}); "
                "it may have been cut off while saving: restore it from Git or save it again from Jupyter"
            ) from None
        if not isinstance(content, dict) or not isinstance(content.get("cells"), list):
            raise NotebookError("the file is JSON but not a Jupyter notebook (no list of `cells`)")
    import jupytext  # imported here: the grading processes only need `definition_nodes`

    try:
        return jupytext.reads(text, fmt={"extension": path.suffix or ".md"})
    except Exception as error:  # jupytext and nbformat raise many kinds of errors on malformed input
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        raise NotebookError(f"jupytext cannot read this notebook: {type(error).__name__}: {first_line}") from None


def transform_magics(source: str) -> str:
    """Turn IPython syntax (``%magic``, ``!shell``) into plain Python, as Jupyter does before running a cell."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # IPython gives up on some malformed input; the parser will report it instead
        return source


def code_cells(path: str | Path) -> list[str]:
    """The source of every code cell, with IPython magics turned into plain Python.

    Raises:
        NotebookError: the file is missing, not UTF-8, not valid JSON (``.ipynb``) or not a notebook.
    """
    notebook = read_notebook(path)
    return [transform_magics(cell.source) for cell in notebook.cells if cell.cell_type == "code"]


def definition_nodes(source: str) -> tuple[list[ast.stmt], list[str]]:
    """The top-level imports, functions, classes and literal constants of one cell, as syntax-tree nodes.

    The nodes keep the cell's line numbers, so errors point at the student's lines.

    Returns:
        (the kept statements, a list of problems such as a syntax error with its line number).
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return [], [f"syntax error on line {error.lineno}: {error.msg}"]
    except ValueError as error:  # e.g. a null byte in the source
        return [], [f"the cell cannot be parsed: {error}"]
    return [node for node in tree.body if isinstance(node, DEFINITIONS) or is_constant(node)], []


def definitions(source: str) -> tuple[str, list[str]]:
    """Keep the imports, functions and classes of one cell's source.

    Returns:
        (the kept code, a list of problems such as a syntax error with its line number).
    """
    kept, problems = definition_nodes(source)
    if problems:
        return "", problems
    return ast.unparse(ast.Module(body=kept, type_ignores=[])), []


def load_definitions(path: str | Path) -> dict[str, object]:
    """Execute a notebook's definitions in a fresh namespace and return that namespace (in this process)."""
    namespace: dict[str, object] = {"__name__": "student_notebook"}
    for cell in code_cells(path):
        code, problems = definitions(cell)
        if not problems:
            exec(compile(code, str(path), "exec"), namespace)
    return namespace
