"""Finding the notebooks to grade and reading their code cells (in the trusted process, as text only)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from companion.notebook_code import definition_nodes, read_notebook, transform_magics

NOTEBOOK_SUFFIXES = (".md", ".ipynb")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean_text(text: str) -> str:
    """Text safe for a terminal, JSON and XML: valid UTF-8, no control characters but newlines and tabs."""
    return _CONTROL.sub("?", text.encode("utf-8", "replace").decode("utf-8"))


def collect_notebooks(paths: Iterable[str | Path]) -> list[tuple[Path, bool]]:
    """The notebooks to grade, as (path, named explicitly).

    A folder contributes its ``*.md`` and ``*.ipynb`` files (not recursively). When a folder holds both
    ``name.md`` and ``name.ipynb``, only the more recently modified one is graded.
    """
    found: list[tuple[Path, bool]] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            found.append((path, True))
            continue
        candidates = sorted(p for p in path.iterdir() if p.suffix in NOTEBOOK_SUFFIXES and p.is_file())
        by_stem: dict[str, list[Path]] = {}
        for candidate in candidates:
            by_stem.setdefault(candidate.stem, []).append(candidate)
        for stem in sorted(by_stem):
            versions = by_stem[stem]
            newest = max(versions, key=lambda p: (p.stat().st_mtime, p.suffix == ".ipynb"))
            found.append((newest, False))
    return found


@dataclass
class Cell:
    number: int  # 1-based among the code cells
    source: str
    label: str
    defines: set[str]
    assigns: set[str]
    nodes: list[int] = field(default_factory=list)  # indices of the top-level statements that are loaded
    problems: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.nodes


DEFINES = re.compile(r"^(?:async[ \t]+)?(?:def|class)[ \t]+([A-Za-z_]\w*)", re.M)
NESTED_DEFINES = re.compile(r"^[ \t]+(?:async[ \t]+)?(?:def|class)[ \t]+([A-Za-z_]\w*)", re.M)


def analyse_cell(number: int, source: str) -> Cell:
    """What a code cell defines, which of its statements the grader loads, and its syntax problems."""
    first = next((line.strip() for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#")),
                 "")
    snippet = first if len(first) <= 50 else first[:47] + "..."
    label = f"code cell {number}" + (f" (`{snippet}`)" if snippet else "")
    cell = Cell(number, source, label, set(DEFINES.findall(source)), set())
    kept, cell.problems = definition_nodes(source)
    if cell.problems:
        return cell
    tree = ast.parse(source)
    kept_ids = {id(node) for node in kept}
    cell.nodes = [index for index, node in enumerate(tree.body) if id(node) in kept_ids] if kept else []
    if kept and not cell.nodes:  # definition_nodes parsed its own tree: match by position instead
        positions = {(node.lineno, node.col_offset) for node in kept}
        cell.nodes = [i for i, node in enumerate(tree.body) if (node.lineno, node.col_offset) in positions]
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            cell.assigns |= {t.id for t in targets if isinstance(t, ast.Name)}
    return cell


def read_cells(path: Path) -> list[Cell]:
    """Every code cell of a notebook, analysed. Raises NotebookError for a file that cannot be read."""
    sources = [transform_magics(c.source) for c in read_notebook(path).cells if c.cell_type == "code"]
    return [analyse_cell(number, source) for number, source in enumerate(sources, start=1)]
