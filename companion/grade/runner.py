"""The grader's parent process: reads notebooks, starts one grading process per notebook and enforces time limits.

For each notebook the parent reads the code cells (a file that is not UTF-8, not JSON or not a notebook gets a
clear message and a grade of 0), notes syntax errors, and sends the cells and the exercises to grade to a worker
process (:mod:`companion.grade.worker`). The worker loads the definitions and runs the checks; the parent gives
each step (loading one cell, checking one exercise) ``timeout`` seconds. When a step runs out of time or kills
the worker, that step fails with a message and a fresh worker carries on with the remaining steps, so one endless
loop costs one exercise, not the notebook.

On Linux the workers are forked from a server process that has imported the frameworks once
(``multiprocessing``'s ``forkserver``); elsewhere each worker is a fresh interpreter (``spawn``).
"""

from __future__ import annotations

import ast
import json
import multiprocessing
import os
import re
import signal
import sys
import time
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from companion.checks import TRACKS, Exercise, exercises_for, import_errors, registry
from companion.notebook_code import NotebookError, definition_nodes, read_notebook, transform_magics

from .results import FAILED, PASSED, SKIPPED, ExerciseResult, GradeReport, NotebookResult

DEFAULT_TIMEOUT = 60.0
#: How long a worker may take to import the frameworks and the checks before its first step.
STARTUP_TIMEOUT = 600.0
#: Characters of printed output kept per step (the rest is counted, not kept).
DEFAULT_OUTPUT_LIMIT = 4000
NOTEBOOK_SUFFIXES = (".md", ".ipynb")
_MAX_MESSAGE_BYTES = 4 * 2**20
_TAIL_BYTES = 4000
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean_text(text: str) -> str:
    """Text safe for a terminal, JSON and XML: valid UTF-8, no control characters but newlines and tabs."""
    return _CONTROL.sub("?", text.encode("utf-8", "replace").decode("utf-8"))


# ---------------------------------------------------------------------------------------------------------------
# Finding and reading notebooks
# ---------------------------------------------------------------------------------------------------------------


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
class _Cell:
    number: int  # 1-based among the code cells
    source: str
    label: str
    defines: set[str]
    assigns: set[str]
    problems: list[str] = field(default_factory=list)
    empty: bool = False  # no import, function or class: nothing to load


_DEFINES = re.compile(r"^(?:async[ \t]+)?(?:def|class)[ \t]+([A-Za-z_]\w*)", re.M)
_NESTED_DEFINES = re.compile(r"^[ \t]+(?:async[ \t]+)?(?:def|class)[ \t]+([A-Za-z_]\w*)", re.M)


def _analyse_cell(number: int, source: str) -> _Cell:
    first = next((line.strip() for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#")),
                 "")
    snippet = first if len(first) <= 50 else first[:47] + "..."
    label = f"code cell {number}" + (f" (`{snippet}`)" if snippet else "")
    cell = _Cell(number, source, label, set(_DEFINES.findall(source)), set())
    kept, cell.problems = definition_nodes(source)
    cell.empty = not kept
    if cell.problems:
        return cell
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            cell.assigns |= {t.id for t in targets if isinstance(t, ast.Name)}
    return cell


# ---------------------------------------------------------------------------------------------------------------
# One notebook
# ---------------------------------------------------------------------------------------------------------------


class _Job:
    """The state of one notebook's grading, across as many worker processes as timeouts and crashes need."""

    def __init__(self, path: Path, explicit: bool, tracks: tuple[str, ...], timeout: float, output_limit: int):
        self.path = path
        self.timeout = timeout
        self.output_limit = output_limit
        self.started: float | None = None  # when its first worker started
        self.result = NotebookResult(path=str(path), chapter=path.stem)
        self.cells: list[_Cell] = []
        self.excluded: set[int] = set()
        self.pending: list[Exercise] = []
        self.fatal = False
        items = exercises_for(path.stem)
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
            sources = [transform_magics(c.source) for c in read_notebook(path).cells if c.cell_type == "code"]
        except NotebookError as error:
            self.result.error = f"cannot grade this notebook: {error}"
            for item in self.pending:
                self.result.exercises.append(
                    ExerciseResult(item.id, item.track, item.title, FAILED, "unreadable", self.result.error))
            self.pending = []
            return
        skipped_symbols = {item.symbol for item in items if item.track not in tracks}
        for number, source in enumerate(sources, start=1):
            cell = _analyse_cell(number, source)
            self.cells.append(cell)
            if cell.problems:
                self.excluded.add(number)
                cell.problems = [f"{cell.label}: {problem}; the cell was skipped" for problem in cell.problems]
                self.result.problems.extend(cell.problems)
            elif cell.empty or (cell.defines and cell.defines <= skipped_symbols):
                self.excluded.add(number)  # only answers of tracks not graded: do not import their framework

    @property
    def done(self) -> bool:
        return not self.pending

    def frameworks(self) -> list[str]:
        return [t for t in ("torch", "keras") if any(item.track == t for item in self.pending)]

    def plan(self) -> dict:
        cells = [c for c in self.cells if c.number not in self.excluded]
        return {
            "chapter": self.result.chapter,
            "path": str(self.path.resolve()),
            "cwd": str(self.path.resolve().parent),
            "frameworks": self.frameworks(),
            "output_limit": self.output_limit,
            "cells": [{"number": c.number, "source": c.source, "filename": f"<{self.path.name}, {c.label}>"}
                      for c in cells],
            "exercises": [{"id": item.id} for item in self.pending],
        }

    def units(self) -> list[tuple[str, Any]]:
        cells = [("cell", c.number) for c in self.cells if c.number not in self.excluded]
        return cells + [("exercise", item.id) for item in self.pending]

    def cell(self, number: int) -> _Cell:
        return self.cells[number - 1]

    # -- outcomes ---------------------------------------------------------------------------------------------

    def cell_loaded(self, number: int, problems: list[str]) -> None:
        cell = self.cell(number)
        messages = [f"{cell.label}: {problem}" for problem in problems]
        cell.problems.extend(messages)
        self.result.problems.extend(messages)

    def cell_failed(self, number: int, why: str) -> None:
        """The cell hung, crashed or tampered: it is left out and the worker restarts without it."""
        cell = self.cell(number)
        self.excluded.add(number)
        message = f"{cell.label}: {why}; the cell was left out"
        cell.problems.append(message)
        self.result.problems.append(message)

    def exercise_done(self, message: dict) -> None:
        if message.get("id") != self.pending[0].id:
            raise ValueError("results out of order")
        item = self.pending.pop(0)
        status = message.get("status") if message.get("status") in (PASSED, FAILED) else FAILED
        reason = str(message.get("reason", "error"))
        text = str(message.get("message", ""))
        if reason == "tampered":
            changes = "; ".join(str(c) for c in message.get("tampered", []))
            text = (f"grading refused: while `{item.symbol}` was checked, your code changed the grading code "
                    f"({changes}). Do not modify numpy, torch, keras or companion.")
        self._add(item, status, reason, text, float(message.get("seconds", 0.0) or 0.0),
                  str(message.get("output", "")), int(message.get("output_chars", 0) or 0))

    def exercise_failed(self, reason: str, text: str, seconds: float = 0.0) -> None:
        item = self.pending.pop(0)
        self._add(item, FAILED, reason, text, seconds, "", 0)

    def fail_all(self, reason: str, text: str) -> None:
        while self.pending:
            self.exercise_failed(reason, text)
        self.fatal = True

    def _add(self, item: Exercise, status: str, reason: str, text: str, seconds: float, output: str,
             output_chars: int) -> None:
        if status == PASSED:
            text = text or item.title
        else:
            text = self._hints(item, reason, text)
        self.result.exercises.append(ExerciseResult(
            item.id, item.track, item.title, status, reason, clean_text(text), round(seconds, 4),
            clean_text(output), output_chars))

    def _hints(self, item: Exercise, reason: str, text: str) -> str:
        """Point at the cell behind a failure: a syntax error, a failed import, a top-level assignment."""
        symbol = item.symbol
        defining = [c for c in self.cells if symbol in c.defines]
        problems = list(dict.fromkeys(p for cell in defining for p in cell.problems))
        if reason == "missing" and problems:  # it is there, but its cell could not be loaded
            return f"`{symbol}` could not be loaded: " + "; ".join(problems)
        hints = problems
        if reason == "missing" and not defining:
            if any(symbol in c.assigns for c in self.cells):
                hints = [f"`{symbol} = ...` is a top-level statement, which the grader does not run; "
                         f"define it with `def {symbol}(...)` or `class {symbol}`"]
            elif any(symbol in _NESTED_DEFINES.findall(c.source) for c in self.cells):
                hints = [f"`{symbol}` is defined inside another block (an `if`, `try`, `with` or function); "
                         "define it at the top level of a cell"]
        return text + (" (" + "; ".join(hints) + ")" if hints else "")

    def finish(self) -> NotebookResult:
        order = {item.id: index for index, item in enumerate(exercises_for(self.result.chapter))}
        self.result.exercises.sort(key=lambda r: order.get(r.id, len(order)))
        if self.started is not None:
            self.result.seconds = round(time.perf_counter() - self.started, 3)
        return self.result


# ---------------------------------------------------------------------------------------------------------------
# Worker processes
# ---------------------------------------------------------------------------------------------------------------


def _context(start_method: str | None, frameworks: set[str]) -> multiprocessing.context.BaseContext:
    method = start_method or os.environ.get("COMPANION_GRADE_START_METHOD") or (
        "forkserver" if sys.platform.startswith("linux") else "spawn")
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        # Read by companion.grade.preload when the server starts (the first grading of this process); later
        # calls reuse the server, and a worker imports whatever the server did not.
        os.environ["COMPANION_GRADE_PRELOAD"] = ",".join(sorted(frameworks))
        context.set_forkserver_preload(["companion.grade.preload"])
    return context


@contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start workers without re-running the caller's ``__main__`` (a script, a notebook kernel, pytest).

    ``multiprocessing`` makes spawned and fork-server children import the parent's main module, which runs an
    unguarded script again in every worker. The worker's code lives in :mod:`companion.grade.worker`, so an empty
    ``__main__`` is all a worker needs.
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


class _Process:
    """One worker process, the steps it still has to report, and its capped output."""

    def __init__(self, job: _Job, context: multiprocessing.context.BaseContext):
        from . import worker

        self.job = job
        self.units = job.units()
        receive, send = context.Pipe(duplex=False)
        out_receive, out_send = context.Pipe(duplex=False) if os.name == "posix" else (None, None)
        self.channel = receive
        self.output = out_receive
        self.tail = b""
        self.output_bytes = 0
        self.process = context.Process(target=worker.main, args=(job.plan(), send, out_send), daemon=True,
                                       name=f"grade {job.path.name}")
        with warnings.catch_warnings(), _main_module_hidden():
            warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+ warns about fork with threads
            self.process.start()
        send.close()
        if out_send is not None:
            out_send.close()
        self.ready = False
        self.deadline = time.monotonic() + STARTUP_TIMEOUT

    def handles(self) -> list[Any]:
        handles = [self.channel, self.process.sentinel]
        if self.output is not None:
            handles.append(self.output)
        return handles

    def drain_output(self) -> None:
        """Read what the process wrote to its stdout and stderr, keeping only the last few kilobytes."""
        if self.output is None:
            return
        for _ in range(64):  # at most 4 MB per call, so a flood cannot keep the parent from its time limits
            if not self.output.poll(0):
                return
            try:
                data = os.read(self.output.fileno(), 1 << 16)
            except OSError:
                data = b""
            if not data:
                self.output.close()
                self.output = None
                return
            self.output_bytes += len(data)
            self.tail = (self.tail + data)[-_TAIL_BYTES:]

    def tail_text(self) -> str:
        text = self.tail.decode("utf-8", "replace").strip()
        return f"; its last output: {text[-1000:]}" if text else ""

    def kill(self) -> None:
        pid = self.process.pid
        if pid is not None and hasattr(os, "killpg"):
            try:
                if os.getpgid(pid) == pid:  # the worker's own process group: also ends what it started
                    os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)
        self.close()

    def close(self) -> None:
        for handle in (self.channel, self.output):
            if handle is not None:
                try:
                    handle.close()
                except OSError:
                    pass
        self.output = None

    def exit_description(self) -> str:
        self.process.join(5)
        code = self.process.exitcode
        if code is None:
            return "it stopped answering"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"


def _handle_message(proc: _Process, message: dict) -> bool:
    """Apply one message from a worker; return False when the worker must be replaced."""
    job = proc.job
    event = message.get("event")
    if event == "ready" and not proc.ready:
        proc.ready = True
        if job.started is None:
            job.started = time.perf_counter()
        return True
    if event == "fatal":
        job.fail_all("error", "the grader failed: " + str(message.get("message", ""))[-2000:])
        return False
    if not proc.ready or not proc.units:
        raise ValueError(f"unexpected message {event!r}")
    kind, key = proc.units[0]
    if event == "cell" and kind == "cell" and message.get("number") == key:
        proc.units.pop(0)
        if message.get("tampered"):
            changes = "; ".join(str(c) for c in message["tampered"])
            job.cell_failed(key, f"loading its definitions changed the grading code ({changes})")
            return False
        job.cell_loaded(key, [str(p) for p in message.get("problems", [])])
        return True
    if event == "result" and kind == "exercise" and message.get("id") == key:
        proc.units.pop(0)
        job.exercise_done(message)
        return message.get("reason") != "tampered"
    if event == "done" and not proc.units:
        return True
    raise ValueError(f"unexpected message {event!r}")


def _step_failed(proc: _Process, why: str, timed_out: bool) -> None:
    """The current step of ``proc`` hung or died: fail it and let a fresh worker carry on."""
    job = proc.job
    if not proc.ready:
        job.fail_all("error", f"the grading process could not start ({why}){proc.tail_text()}")
        return
    if not proc.units:
        return
    kind, key = proc.units[0]
    limit = f"{job.timeout:g} s"
    if kind == "cell":
        if timed_out:
            job.cell_failed(key, f"loading its definitions did not finish within {limit} (an endless loop in a "
                                 "class body, a default argument, a decorator or an import?)")
        else:
            job.cell_failed(key, f"the grading process died while loading its definitions ({why})")
        return
    symbol = job.pending[0].symbol
    if timed_out:
        job.exercise_failed("timeout", f"the check did not finish within {limit}: is there an endless loop in "
                                       f"`{symbol}`, or is it far too slow? (the check uses small inputs)",
                            job.timeout)
    else:
        job.exercise_failed("crash", f"the grading process died while `{symbol}` was checked ({why}): does "
                                     f"your code call sys.exit/os._exit or crash the interpreter?{proc.tail_text()}")


def grade(
    paths: Iterable[str | Path],
    timeout: float = DEFAULT_TIMEOUT,
    tracks: Iterable[str] | None = None,
    jobs: int = 1,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    start_method: str | None = None,
    on_notebook: Callable[[int, NotebookResult], None] | None = None,
) -> GradeReport:
    """Grade notebooks (files or folders of ``.md``/``.ipynb``); see :mod:`companion.grade`.

    Args:
        paths: notebooks or folders of notebooks; the chapter of a notebook is its file name without extension.
        timeout: seconds allowed to each step (loading one cell, checking one exercise).
        tracks: the tracks to grade (``numpy`` is always graded); None for all.
        jobs: notebooks graded at the same time.
        output_limit: characters of printed output kept per exercise.
        start_method: ``forkserver`` or ``spawn`` (default: forkserver on Linux, spawn elsewhere).
        on_notebook: called with (index, result) as each notebook finishes.
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout}")
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1; got {jobs}")
    selected = tuple(dict.fromkeys(["numpy", *(TRACKS if tracks is None else tracks)]))
    unknown = [t for t in selected if t not in TRACKS]
    if unknown:
        raise ValueError(f"tracks must be among {', '.join(TRACKS)}; got {', '.join(unknown)}")
    start = time.perf_counter()
    # Read by the worker processes when they start: quiet TensorFlow, exact float32 on CPU (no oneDNN
    # reordering) and on NVIDIA GPUs (no TF32 matmuls), the same hashing in every run.
    for name, value in (("TF_CPP_MIN_LOG_LEVEL", "3"), ("TF_ENABLE_ONEDNN_OPTS", "0"),
                        ("NVIDIA_TF32_OVERRIDE", "0"), ("PYTHONHASHSEED", "0")):
        os.environ.setdefault(name, value)

    notebooks = [_Job(path, explicit, selected, timeout, output_limit) for path, explicit in collect_notebooks(paths)]
    results: list[NotebookResult | None] = [None] * len(notebooks)
    waiting = [index for index, job in enumerate(notebooks)]
    context = _context(start_method, {f for job in notebooks for f in job.frameworks()})
    running: list[tuple[int, _Process]] = []

    def finish(index: int) -> None:
        results[index] = notebooks[index].finish()
        if on_notebook is not None:
            on_notebook(index, results[index])

    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                index = waiting.pop(0)
                job = notebooks[index]
                if job.done or job.fatal:
                    finish(index)
                    continue
                try:
                    running.append((index, _Process(job, context)))
                except Exception as error:  # e.g. no more processes, or the fork server died
                    job.fail_all("error", f"the grader could not start a worker process: {error}")
                    finish(index)
            if not running:
                continue
            now = time.monotonic()
            wait([h for _, proc in running for h in proc.handles()],
                 timeout=max(0.0, min(proc.deadline for _, proc in running) - now))
            for index, proc in list(running):
                replace = _poll(proc)
                if replace is None:
                    continue
                running.remove((index, proc))
                proc.kill()
                if not proc.job.done and not proc.job.fatal:
                    waiting.insert(0, index)  # a fresh worker goes on where this one stopped
                else:
                    finish(index)
    finally:
        for _, proc in running:
            proc.kill()
    report = GradeReport([r for r in results if r is not None], round(time.perf_counter() - start, 3))
    return report


def _poll(proc: _Process) -> bool | None:
    """Handle what ``proc`` reported; return None while it keeps working, True/False when it is finished."""
    proc.drain_output()
    try:
        while proc.channel.poll(0):
            try:
                data = proc.channel.recv_bytes(_MAX_MESSAGE_BYTES)
            except EOFError:  # the worker is gone (or closed its end)
                proc.drain_output()
                _step_failed(proc, proc.exit_description(), False)
                return False
            except OSError as error:  # e.g. a message longer than any the grader sends
                raise ValueError(str(error)) from None
            message = json.loads(data)
            if not isinstance(message, dict):
                raise ValueError("a message that is not an object")
            if not _handle_message(proc, message):
                return False
            if message.get("event") == "done":
                return True
            proc.deadline = time.monotonic() + proc.job.timeout
    except (ValueError, TypeError, KeyError, AttributeError):
        # A message the grader did not send: the student's code wrote to the grader's pipe.
        _step_failed(proc, "it sent a message out of turn: did the code write to the grader's pipe?", False)
        return False
    if not proc.process.is_alive() and not proc.channel.poll(0):  # died, with a child still holding the pipe
        proc.drain_output()
        _step_failed(proc, proc.exit_description(), False)
        return False
    if time.monotonic() >= proc.deadline:
        _step_failed(proc, "time limit", True)
        return False
    return None
