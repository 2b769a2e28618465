"""Finding the notebooks to grade and reading their code cells (in the trusted process, as text only)."""

from __future__ import annotations

import ast
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from companion.notebook_code import DEFINITIONS, NotebookError, is_constant, read_notebook, transform_magics

NOTEBOOK_SUFFIXES = (".md", ".ipynb")

def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a loop of links
        return False


def leaves_folder(path: str | Path) -> str:
    """Why grading ``path`` would read outside the student's folder (empty when it would not).

    The student's folder is the folder the notebook is in (or, for a folder, the folder itself). Every link is
    followed: the notebook must resolve to a file inside that folder, and the folder itself must not be a link
    out of the folder that holds it (``submissions/carol/exercises -> ../bob/exercises``). The message never
    names where a link leads.
    """
    path = Path(path)
    folder = path if path.is_dir() and not path.is_file() else path.parent
    if folder.name not in ("", ".", "..") and not _inside(folder, folder.parent):
        return f"the folder `{folder.name}` is a link that leads out of the folder that holds it"
    if folder is not path and path.is_symlink() and not _inside(path, folder):
        return f"`{path.name}` is a link that leads out of the student's folder `{folder.name}`"
    if folder is not path and path.exists() and not path.is_file():
        return f"`{path.name}` is not a regular file"
    return ""


def link_refused(why: str) -> str:
    """The message for a notebook refused by :func:`leaves_folder`."""
    return (f"refused: {why}; the grader reads only files inside the student's folder, so this notebook counts "
            "as missing work and every exercise of its chapter gets zero")


def collect_notebooks(paths: Iterable[str | Path]) -> list[tuple[Path, bool]]:
    """The notebooks to grade, as (path, named explicitly).

    A folder contributes its ``*.md`` and ``*.ipynb`` files (not recursively). When a folder holds both
    ``name.md`` and ``name.ipynb``, only the more recently modified one is graded. A folder that is a link out of
    its own folder contributes nothing (its chapters are then missing work); a notebook that is a link out of its
    folder is listed, and refused when it is graded (:func:`leaves_folder`).
    """
    found: list[tuple[Path, bool]] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            found.append((path, True))
            continue
        if leaves_folder(path):
            continue
        candidates = sorted(p for p in path.iterdir() if p.suffix in NOTEBOOK_SUFFIXES and
                            (p.is_file() or p.is_symlink()))
        by_stem: dict[str, list[Path]] = {}
        for candidate in candidates:
            by_stem.setdefault(candidate.stem, []).append(candidate)
        for stem in sorted(by_stem):
            versions = by_stem[stem]
            newest = max(versions, key=lambda p: (_modified(p), p.suffix == ".ipynb"))
            found.append((newest, False))
    return found


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime if _inside(path, path.parent) else path.lstat().st_mtime
    except OSError:
        return 0.0


@dataclass
class Cell:
    number: int  # 1-based among the code cells
    source: str
    label: str
    defines: set[str]
    assigns: set[str]
    nodes: list[int] = field(default_factory=list)  # indices of the top-level statements that are loaded
    problems: list[str] = field(default_factory=list)
    tree: ast.Module | None = field(default=None, repr=False)  # parsed once, here (see parse_cell)

    @property
    def empty(self) -> bool:
        return not self.nodes


DEFINES = re.compile(r"^(?:async[ \t]+)?(?:def|class)[ \t]+([A-Za-z_]\w*)", re.M)
NESTED_DEFINES = re.compile(r"^[ \t]+(?:async[ \t]+)?(?:def|class)[ \t]+([A-Za-z_]\w*)", re.M)


#: Limits on what the trusted process parses: code cells per notebook, characters per cell.
MAX_CELLS = 2000
MAX_CELL_CHARS = 200_000
#: CPython's parser and AST constructor keep state that threads must not share (python/cpython#106905): every
#: parse of the trusted process goes through :func:`parse_cell`, one at a time.
_PARSING = threading.Lock()


def parse_cell(source: str) -> tuple[ast.Module | None, str]:
    """(the syntax tree, "") or (None, why it cannot be parsed); never raises, whatever the source."""
    if len(source) > MAX_CELL_CHARS:
        return None, f"the cell has {len(source)} characters; cells over {MAX_CELL_CHARS} are not parsed"
    with _PARSING:
        try:
            return ast.parse(source), ""
        except SyntaxError as error:
            return None, f"syntax error on line {error.lineno}: {error.msg}"
        except (RecursionError, MemoryError, SystemError):  # SystemError: the parser's own depth checks
            return None, "the cell is nested too deeply to be parsed"
        except ValueError as error:  # e.g. a null byte in the source
            return None, f"the cell cannot be parsed: {error}"


def analyse_cell(number: int, source: str) -> Cell:
    """What a code cell defines, which of its statements the grader loads, and its syntax problems."""
    if not isinstance(source, str):
        return Cell(number, "", f"code cell {number}", set(), set(),
                    problems=[f"its source is a {type(source).__name__}, not text"])
    first = next((line.strip() for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#")),
                 "")
    snippet = first if len(first) <= 50 else first[:47] + "..."
    label = f"code cell {number}" + (f" (`{snippet}`)" if snippet else "")
    cell = Cell(number, source, label, set(DEFINES.findall(source)), set())
    cell.tree, problem = parse_cell(source)
    if cell.tree is None:
        cell.problems = [problem]
        return cell
    for index, node in enumerate(cell.tree.body):
        if isinstance(node, DEFINITIONS) or is_constant(node):
            cell.nodes.append(index)
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            cell.assigns |= {t.id for t in targets if isinstance(t, ast.Name)}
    return cell


def read_cells(path: Path) -> list[Cell]:
    """Every code cell of a notebook, analysed. Raises NotebookError for a file that cannot be read."""
    cells = [c.source for c in read_notebook(path).cells if c.cell_type == "code"]
    if len(cells) > MAX_CELLS:
        raise NotebookError(f"the notebook has {len(cells)} code cells; notebooks over {MAX_CELLS} are refused")
    sources = [transform_magics(s) if isinstance(s, str) else s for s in cells]
    return [analyse_cell(number, source) for number, source in enumerate(sources, start=1)]
