"""Grade notebooks: one contained student process per notebook, the checks in this (trusted) process.

For each notebook, :class:`~companion.grade.jobs.Job` reads the code cells; a student process
(:mod:`companion.grade.sandbox.child`) loads the imports, functions, classes and literal constants of each cell;
then each exercise's checker runs *here* on a :class:`~companion.grade.remote.Remote` that stands in for the
student's function or class (:mod:`companion.grade.steps`). Expected values, oracles and verdicts never exist in
the student's process, so nothing the student's code does there (reading frames, patching NumPy, forging
messages) can turn a wrong answer into a pass.

The process model: for each folder of notebooks (one student) a zygote (:mod:`companion.grade.forkserver`,
:mod:`companion.grade.sandbox.zygote`) is started contained (:mod:`companion.grade.launcher`: bubblewrap, rlimits,
a pids cgroup, its own session) and imports the frameworks once; each notebook's student process is forked from
it, so it starts as a copy of the state right after the imports and nothing one notebook's code did reaches
another. The next folder's zygote starts while the current folder is graded. A grader forked by a class worker
(:mod:`companion.grade.classworker`) uses the worker's shared zygote instead, emptied and given this student's
notebooks first.

Each step (starting, loading one cell, checking one exercise) has a time limit. A step that runs out of time or
kills the process fails alone: the process and everything it started are ended and a freshly forked one carries
on with the remaining steps (a zygote that stops answering is ended with its sandbox, and a fresh one started).
Every zygote and student process is ended, and waited for, before :func:`grade` returns, so before any report is
written.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from companion.checks import TRACKS, exercises_for, registry

from .forkserver import Zygotes, shared_zygote
from .jobs import Job
from .launcher import DEFAULT_MEMORY, Limits, become_subreaper, sandbox_status, seccomp_note
from .notebooks import collect_notebooks, leaves_folder, link_refused
from .results import FAILED, SKIPPED, ExerciseResult, GradeReport, NotebookResult, clean_result, clean_text
from .steps import (
    DEFAULT_OUTPUT_LIMIT,
    DEFAULT_TIMEOUT,
    DEFAULT_TOTAL_TIMEOUT,
    HIDDEN_FAILED,
    STARTUP_TIMEOUT,
    Options,
    cpu_seconds,
    grade_job,
)

__all__ = ["DEFAULT_OUTPUT_LIMIT", "DEFAULT_TIMEOUT", "DEFAULT_TOTAL_TIMEOUT", "HIDDEN_FAILED", "STARTUP_TIMEOUT",
           "Options", "expected_chapters", "grade", "import_quietly", "load_extra_checks"]


def load_extra_checks(path: str | Path) -> dict[str, list[Callable[[Any], None]]]:
    """An instructor's module of extra checks: every function named ``check_<exercise id>``.

    The module runs here, in the trusted process, and is never copied into the student's process. Its functions
    take the student's object, like the course's checkers, and fail by raising ``AssertionError``; the report
    says only "hidden check failed", never the message or an expected value.
    """
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"companion_extra_checks_{abs(hash(str(path)))}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ValueError(f"extra checks: cannot load {path} (expected a Python file)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    known = registry()
    found: dict[str, list[Callable[[Any], None]]] = {}
    for name, value in vars(module).items():
        if name.startswith("check_") and callable(value):
            exercise_id = name[len("check_"):]
            if exercise_id not in known:
                raise ValueError(f"extra checks: {path} has {name}, but there is no exercise {exercise_id!r}")
            found.setdefault(exercise_id, []).append(value)
    if not found:
        raise ValueError(f"extra checks: {path} defines no function named check_<exercise id>")
    return found


def expected_chapters(chapters: Iterable[str] | None) -> list[str]:
    """The registered chapters, or those named (``01`` or ``01_text_as_numbers``) in ``chapters``."""
    known = sorted({e.chapter for e in registry().values()})
    if chapters is None:
        return known
    chosen = []
    for raw in chapters:
        match = [c for c in known if c == raw or c.split("_")[0] == raw]
        if not match:
            raise ValueError(f"chapters: no chapter {raw!r}; known: {', '.join(known)}")
        chosen += match
    return list(dict.fromkeys(chosen))


def import_quietly(module: str) -> None:
    """Import a framework for the checkers with its start-up messages (written to fd 2 by C++) silenced."""
    import importlib

    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        importlib.import_module(module)
    except ImportError:
        pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _missing_notebook(folder: Path | None, chapter: str, tracks: tuple[str, ...], why: str = "") -> NotebookResult:
    where = f"{folder}/{chapter}.md" if folder is not None else f"{chapter}.md"
    message = link_refused(why) if why else (
        f"missing work: no notebook `{chapter}.md` or `{chapter}.ipynb` was found (a renamed notebook counts as "
        "missing); every exercise of the chapter gets zero")
    result = NotebookResult(path=where, chapter=chapter, error=message, missing=True)
    for item in exercises_for(chapter):
        if item.track in tracks:
            result.exercises.append(ExerciseResult(item.id, item.track, item.title, FAILED, "missing-notebook",
                                                   message))
        else:
            result.exercises.append(ExerciseResult(item.id, item.track, item.title, SKIPPED, "track",
                                                   f"track `{item.track}` not selected"))
    return result


def grade(
    paths: Iterable[str | Path],
    timeout: float = DEFAULT_TIMEOUT,
    tracks: Iterable[str] | None = None,
    jobs: int = 1,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    on_notebook: Callable[[int, NotebookResult], None] | None = None,
    chapters: Iterable[str] | None = None,
    memory: int = DEFAULT_MEMORY,
    extra_checks: str | Path | None = None,
    sandbox: str = "auto",
    total_timeout: float = DEFAULT_TOTAL_TIMEOUT,
) -> GradeReport:
    """Grade notebooks (files or folders of ``.md``/``.ipynb``); see :mod:`companion.grade`.

    Args:
        paths: notebooks or folders of notebooks; the chapter of a notebook is its file name without extension.
        timeout: seconds allowed to each step (loading one cell, checking one exercise).
        tracks: the tracks to grade (``numpy`` is always graded); None for all.
        jobs: notebooks graded at the same time.
        output_limit: characters of printed output kept per exercise.
        on_notebook: called with (index, result) as each notebook finishes.
        chapters: the chapters expected (``["01", "02"]``); None: every registered chapter when a folder is
            graded, the chapters of the named files otherwise. An expected chapter without a notebook is
            missing work: its exercises fail.
        memory: address-space limit of each student process, in bytes.
        extra_checks: an instructor's module of extra checks (:func:`load_extra_checks`).
        sandbox: ``auto`` (bubblewrap where it works), ``on`` (required) or ``off``.
        total_timeout: seconds the whole run may take; the steps still to run after that fail with reason
            ``timeout``, and the reports are written as usual.
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout}")
    if total_timeout <= 0:
        raise ValueError(f"total_timeout must be a positive number of seconds; got {total_timeout}")
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1; got {jobs}")
    if sandbox not in ("auto", "on", "off"):
        raise ValueError(f"sandbox must be auto, on or off; got {sandbox!r}")
    selected = tuple(dict.fromkeys(["numpy", *(TRACKS if tracks is None else tracks)]))
    unknown = [t for t in selected if t not in TRACKS]
    if unknown:
        raise ValueError(f"tracks must be among {', '.join(TRACKS)}; got {', '.join(unknown)}")
    start = time.perf_counter()
    paths = [Path(p) for p in paths]
    expected = expected_chapters(chapters)
    usable, why = sandbox_status() if sandbox != "off" else (False, "switched off (--sandbox off)")
    if sandbox == "on" and not usable:
        raise RuntimeError(f"the sandbox is required (--sandbox on) but cannot start: {why}")
    options = Options(timeout, output_limit, memory, usable,
                      load_extra_checks(extra_checks) if extra_checks else {},
                      deadline=time.monotonic() + total_timeout, total_timeout=total_timeout)
    become_subreaper()
    if "keras" in selected:
        import_quietly("keras")

    found = collect_notebooks(paths)
    registered = {e.chapter for e in registry().values()}
    # A named notebook that does not exist, of a known chapter: missing work, like a notebook missing from a folder.
    absent = [path for path, explicit in found if explicit and not path.exists() and path.stem in registered]
    found = [(path, explicit) for path, explicit in found if path not in absent]
    if chapters is not None:  # leave out the other registered chapters (an unknown one still gets its note)
        found = [(path, explicit) for path, explicit in found if path.stem in expected or path.stem not in registered]
    present = {path.stem for path, _ in found}
    absent = [path for path in absent if chapters is None or path.stem in expected]
    folders = [p for p in paths if p.is_dir()]
    if chapters is not None or folders:
        missing = [c for c in expected if c not in present]
    else:
        missing = []
    notebooks = [Job(path, explicit, selected) for path, explicit in found]
    results: list[NotebookResult | None] = [None] * len(notebooks)
    # One zygote per folder (a student's notebooks): it imports the frameworks once and forks a fresh student
    # process per notebook; its CPU limit is the largest of its notebooks' (a forked process lowers its own).
    folders_of: dict[Path, list[Path]] = {}
    limits: dict[Path, Limits] = {}
    left: dict[Path, int] = {}
    for job in notebooks:
        if job.done:  # refused, unreadable or nothing to grade: no student process, nothing of it in a sandbox
            continue
        folder = job.path.parent
        folders_of.setdefault(folder, []).append(job.path)
        seconds = max(cpu_seconds(job, options), limits[folder].cpu_seconds if folder in limits else 0)
        limits[folder] = Limits(memory=options.memory, cpu_seconds=seconds)
        left[folder] = left.get(folder, 0) + 1
    # In a class worker's grader: the worker's shared zygote, when it has this run's memory limit (it serves the
    # notebooks of one folder, after emptying its sandbox of the previous student's).
    shared = shared_zygote()
    zygotes = Zygotes(folders_of, limits, options.sandbox,
                      shared if shared is not None and shared.memory == options.memory else None)
    counting = threading.Lock()

    def run(index: int) -> None:
        job = notebooks[index]
        graded = not job.done
        if graded:
            try:
                grade_job(job, options, zygotes)
            except Exception as error:  # a fault of the grader's on this notebook fails it, never the run
                job.fail_all("error", f"the grader failed on this notebook ({type(error).__name__}: "
                                      f"{str(error)[:300]}); the other notebooks were graded")
        result = clean_result(job.finish())
        result.sandbox = "on" if options.sandbox else "off"
        results[index] = result
        if not graded:
            return
        folder = job.path.parent
        with counting:
            left[folder] -= 1
            last = left[folder] == 0
        if last:
            zygotes.close_folder(folder)

    def prepare(index: int) -> None:
        job = notebooks[index]
        if not job.done:
            try:
                zygotes.prepare(job.path, job.frameworks())
            except OSError:
                pass  # grade_job tries again and reports the error

    try:
        if jobs == 1 or len(notebooks) <= 1:
            # One notebook at a time; the next folder's zygote starts (imports the frameworks) meanwhile.
            for index in range(len(notebooks)):
                prepare(index)
                if index + 1 < len(notebooks):
                    prepare(index + 1)
                run(index)
                if on_notebook is not None:
                    on_notebook(index, results[index])  # type: ignore[arg-type]
        else:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(run, index) for index in range(len(notebooks))]
                for index, future in enumerate(futures):
                    future.result()
                    if on_notebook is not None:
                        on_notebook(index, results[index])  # type: ignore[arg-type]
    finally:
        zygotes.close()  # every student process and zygote ended, and waited for, before any report
    finished = [r for r in results if r is not None]
    for position, path in enumerate(absent):
        result = _missing_notebook(path.parent, path.stem, selected)
        result.path = str(path)
        result = clean_result(result)
        result.sandbox = "on" if options.sandbox else "off"
        finished.append(result)
        if on_notebook is not None:
            on_notebook(len(notebooks) + position, result)
    missing = [c for c in missing if c not in {p.stem for p in absent}]
    folder = folders[0] if len(folders) == 1 else None
    linked = [why for why in (leaves_folder(f) for f in folders) if why]
    for position, chapter in enumerate(missing, start=len(absent)):
        result = clean_result(_missing_notebook(folder, chapter, selected, "; ".join(linked)))
        result.sandbox = "on" if options.sandbox else "off"
        finished.append(result)
        if on_notebook is not None:
            on_notebook(len(notebooks) + position, result)
    note = seccomp_note() if options.sandbox else ""
    sandbox_text = ("on" + (f" ({note})" if note else "")) if options.sandbox else f"off ({why})"
    return GradeReport(finished, round(time.perf_counter() - start, 3), sandbox=clean_text(sandbox_text),
                       expected_chapters=expected if (chapters is not None or folders) else
                       sorted({p.stem for p, _ in found} | {p.stem for p in absent}))


