"""The state of one notebook's grading: its cells, the exercises still to check, and the verdicts so far."""

from __future__ import annotations

import re
import time
from pathlib import Path

from companion.checks import Exercise, exercises_for, import_errors, registry
from companion.notebook_code import NotebookError

from .notebooks import NESTED_DEFINES, Cell, leaves_folder, link_refused, read_cells
from .results import FAILED, PASSED, SKIPPED, ExerciseResult, NotebookResult


class Job:
    """One notebook, across as many student processes as timeouts and crashes need."""

    def __init__(self, path: Path, explicit: bool, tracks: tuple[str, ...]):
        self.path = path
        self.started: float | None = None
        self.result = NotebookResult(path=str(path), chapter=path.stem)
        self.cells: list[Cell] = []
        self.excluded: set[int] = set()
        self.reported: set[int] = set()  # cells whose load problems are already in the report
        self.pending: list[Exercise] = []
        self.fatal = False
        items = exercises_for(path.stem)
        refused = leaves_folder(path)
        if refused:  # nothing behind the link is read, not even to hash or to parse it
            self.result.error, self.result.missing = link_refused(refused), True
            self._fail_items(items, tracks, "missing-notebook", self.result.error)
            return
        if not path.exists():
            self.result.error = "no such file or folder"
            return
        if not items:
            known = sorted({e.chapter for e in registry().values()})
            message = (f"no exercises are registered for chapter {path.stem!r} (the chapter is the file name "
                       f"without its extension; known chapters: {', '.join(known)})")
            broken = import_errors()
            if broken:
                message += "; check modules that failed to import: " + "; ".join(f"{k}: {v}" for k, v in broken.items())
            if explicit:
                self.result.error = message
            else:
                self.result.problems.append(f"not graded: {message}")
            return
        for item in items:
            if item.track in tracks:
                self.pending.append(item)
            else:
                self.result.exercises.append(ExerciseResult(
                    item.id, item.track, item.title, SKIPPED, "track",
                    f"track `{item.track}` not selected (--track {','.join(tracks)})"))
        try:
            cells = read_cells(path)
        except NotebookError as error:
            why = str(error)
        except (RecursionError, MemoryError):
            why = "it is nested too deeply, or too large, to be read"
        except Exception as error:  # a reader library that trips over a malformed file: that notebook fails alone
            why = f"it is malformed ({type(error).__name__}: {str(error)[:300]})"
        else:
            why = ""
        if why:
            self.result.error = f"cannot grade this notebook: {why}"
            for item in self.pending:
                self.result.exercises.append(
                    ExerciseResult(item.id, item.track, item.title, FAILED, "unreadable", self.result.error))
            self.pending = []
            return
        skipped_symbols = {item.symbol for item in items if item.track not in tracks}
        for cell in cells:
            self.cells.append(cell)
            if cell.problems:
                self.excluded.add(cell.number)
                cell.problems = [f"{cell.label}: {problem}; the cell was skipped" for problem in cell.problems]
                self.result.problems.extend(cell.problems)
            elif cell.empty or (cell.defines and cell.defines <= skipped_symbols):
                self.excluded.add(cell.number)  # only answers of tracks not graded: do not import their framework

    def _fail_items(self, items: list[Exercise], tracks: tuple[str, ...], reason: str, message: str) -> None:
        for item in items:
            status = FAILED if item.track in tracks else SKIPPED
            text = message if status == FAILED else f"track `{item.track}` not selected (--track {','.join(tracks)})"
            self.result.exercises.append(ExerciseResult(item.id, item.track, item.title, status,
                                                        reason if status == FAILED else "track", text))

    @property
    def done(self) -> bool:
        return not self.pending

    def frameworks(self) -> list[str]:
        return [t for t in ("torch", "keras") if any(item.track == t for item in self.pending)]

    def loadable(self) -> list[Cell]:
        return [c for c in self.cells if c.number not in self.excluded]

    def cell(self, number: int) -> Cell:
        return self.cells[number - 1]

    # -- outcomes ---------------------------------------------------------------------------------------------

    def cell_loaded(self, number: int, problems: list[str]) -> None:
        if number in self.reported:
            return
        self.reported.add(number)
        cell = self.cell(number)
        messages = [f"{cell.label}: {problem}" for problem in problems]
        cell.problems.extend(messages)
        self.result.problems.extend(messages)

    def cell_failed(self, number: int, why: str) -> None:
        """The cell hung or crashed the process: it is left out and a fresh process goes on without it."""
        cell = self.cell(number)
        self.excluded.add(number)
        message = f"{cell.label}: {why}; the cell was left out"
        cell.problems.append(message)
        self.result.problems.append(message)

    def exercise_done(self, status: str, reason: str, text: str, seconds: float = 0.0, output: str = "",
                      output_chars: int = 0, parts: list[list] | None = None) -> None:
        item = self.pending.pop(0)
        if status == PASSED:
            text = text or item.title
        else:
            text = self._hints(item, reason, text)
        self.result.exercises.append(ExerciseResult(
            item.id, item.track, item.title, status, reason, text, round(seconds, 4), output, output_chars,
            list(parts or [])))

    def exercise_failed(self, reason: str, text: str, seconds: float = 0.0) -> None:
        self.exercise_done(FAILED, reason, text, seconds)

    def fail_all(self, reason: str, text: str) -> None:
        while self.pending:
            self.exercise_failed(reason, text)
        self.fatal = True

    def _hints(self, item: Exercise, reason: str, text: str) -> str:
        """Point at the cell behind a failure: a syntax error, a failed import, a top-level assignment."""
        symbol = item.symbol
        defining = [c for c in self.cells if symbol in c.defines]
        problems = list(dict.fromkeys(p for cell in defining for p in cell.problems))
        if reason == "missing" and problems:  # it is there, but its cell could not be loaded
            return f"`{symbol}` could not be loaded: " + "; ".join(problems)
        hints = problems
        importing = re.compile(rf"^\s*(from\s+\S+\s+)?import\b[^\n]*\b{re.escape(symbol)}\b", re.M)
        imported = [c for c in self.cells if c.problems and importing.search(c.source)]
        if reason == "missing" and not defining and imported:
            return f"`{symbol}` could not be imported: " + "; ".join(p for c in imported for p in c.problems)
        if reason == "missing" and not defining:
            if any(symbol in c.assigns for c in self.cells):
                hints = [f"`{symbol} = ...` is a top-level statement, which the grader does not run; "
                         f"define it with `def {symbol}(...)` or `class {symbol}`"]
            elif any(symbol in NESTED_DEFINES.findall(c.source) for c in self.cells):
                hints = [f"`{symbol}` is defined inside another block (an `if`, `try`, `with` or function); "
                         "define it at the top level of a cell"]
        return text + (" (" + "; ".join(hints) + ")" if hints else "")

    def finish(self) -> NotebookResult:
        order = {item.id: index for index, item in enumerate(exercises_for(self.result.chapter))}
        self.result.exercises.sort(key=lambda r: order.get(r.id, len(order)))
        if self.started is not None:
            self.result.seconds = round(time.perf_counter() - self.started, 3)
        return self.result
