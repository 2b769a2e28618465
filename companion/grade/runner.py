"""Grade notebooks: one contained student process per notebook, the checks in this (trusted) process.

For each notebook, :class:`~companion.grade.jobs.Job` reads the code cells; a student process
(:mod:`companion.grade.launcher`, :mod:`companion.grade.sandbox.child`) loads the imports, functions, classes and
literal constants of each cell; then each exercise's checker runs *here* on a :class:`~companion.grade.remote.Remote`
that stands in for the student's function or class. Expected values, oracles and verdicts never exist in the
student's process, so nothing the student's code does there (reading frames, patching NumPy, forging messages)
can turn a wrong answer into a pass.

Each step (starting, loading one cell, checking one exercise) has a time limit. A step that runs out of time or
kills the process fails alone: the process and everything it started are ended and a fresh one carries on with
the remaining steps. Every student process is ended before :func:`grade` returns, so before any report is written.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from companion.checks import TRACKS, CheckFailed, Exercise, exercises_for, registry

from .jobs import Job
from .launcher import DEFAULT_MEMORY, Child, Limits, become_subreaper, sandbox_status
from .notebooks import collect_notebooks
from .remote import SandboxLost, Session, StudentError
from .results import FAILED, PASSED, SKIPPED, ExerciseResult, GradeReport, NotebookResult
from .shortcuts import find_shortcuts

# Read when TensorFlow is first imported (by a checker, here): quiet logs, exact float32 on CPU and GPU.
for _name, _value in (("TF_CPP_MIN_LOG_LEVEL", "3"), ("TF_ENABLE_ONEDNN_OPTS", "0"), ("NVIDIA_TF32_OVERRIDE", "0")):
    os.environ.setdefault(_name, _value)

DEFAULT_TIMEOUT = 60.0
#: How long a student process may take to import the frameworks before its first step.
STARTUP_TIMEOUT = 600.0
#: Characters of printed output kept per step (the rest is counted, not kept).
DEFAULT_OUTPUT_LIMIT = 4000
HIDDEN_FAILED = "hidden check failed"


@dataclass
class Options:
    timeout: float = DEFAULT_TIMEOUT
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    memory: int = DEFAULT_MEMORY
    sandbox: bool = True
    extra: dict[str, list[Callable[[Any], None]]] = field(default_factory=dict)


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


def _import_quietly(module: str) -> None:
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


def _missing_notebook(folder: Path | None, chapter: str, tracks: tuple[str, ...]) -> NotebookResult:
    where = f"{folder}/{chapter}.md" if folder is not None else f"{chapter}.md"
    message = (f"missing work: no notebook `{chapter}.md` or `{chapter}.ipynb` was found (a renamed notebook "
               "counts as missing); every exercise of the chapter gets zero")
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
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout}")
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
                      load_extra_checks(extra_checks) if extra_checks else {})
    become_subreaper()
    if "keras" in selected:
        _import_quietly("keras")

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

    def run(index: int, session: Session | None = None) -> None:
        job = notebooks[index]
        if not job.done:
            _grade_job(job, options, session)
        elif session is not None:
            session.close()
        result = job.finish()
        result.sandbox = "on" if options.sandbox else "off"
        results[index] = result

    def launch(index: int) -> Session | None:
        job = notebooks[index]
        if job.done:
            return None
        try:
            return _launch(job, options)
        except OSError:
            return None  # _grade_job tries again and reports the error

    if jobs == 1 or len(notebooks) <= 1:
        # One notebook at a time, the next one's process starting (importing the frameworks) meanwhile.
        upcoming = launch(0) if notebooks else None
        try:
            for index in range(len(notebooks)):
                current, upcoming = upcoming, (launch(index + 1) if index + 1 < len(notebooks) else None)
                run(index, current)
                if on_notebook is not None:
                    on_notebook(index, results[index])  # type: ignore[arg-type]
        finally:
            if upcoming is not None:
                upcoming.close()
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run, index) for index in range(len(notebooks))]
            for index, future in enumerate(futures):
                future.result()
                if on_notebook is not None:
                    on_notebook(index, results[index])  # type: ignore[arg-type]
    finished = [r for r in results if r is not None]
    for position, path in enumerate(absent):
        result = _missing_notebook(path.parent, path.stem, selected)
        result.path = str(path)
        result.sandbox = "on" if options.sandbox else "off"
        finished.append(result)
        if on_notebook is not None:
            on_notebook(len(notebooks) + position, result)
    missing = [c for c in missing if c not in {p.stem for p in absent}]
    folder = folders[0] if len(folders) == 1 else None
    for position, chapter in enumerate(missing, start=len(absent)):
        result = _missing_notebook(folder, chapter, selected)
        result.sandbox = "on" if options.sandbox else "off"
        finished.append(result)
        if on_notebook is not None:
            on_notebook(len(notebooks) + position, result)
    sandbox_text = "on" if options.sandbox else f"off ({why})"
    return GradeReport(finished, round(time.perf_counter() - start, 3), sandbox=sandbox_text,
                       expected_chapters=expected if (chapters is not None or folders) else
                       sorted({p.stem for p, _ in found} | {p.stem for p in absent}))


# ---------------------------------------------------------------------------------------------------------------
# One notebook
# ---------------------------------------------------------------------------------------------------------------


def _limits(job: Job, options: Options) -> Limits:
    steps = len(job.loadable()) + len(job.pending) + 2
    return Limits(memory=options.memory, cpu_seconds=int(STARTUP_TIMEOUT + options.timeout * steps))


def _launch(job: Job, options: Options) -> Session:
    """Start a student process for ``job`` and send it ``hello``; its reply is read by :func:`_grade_job`."""
    child = Child(job.path, _limits(job, options), options.sandbox)
    session = Session(child, options.output_limit)
    tripwires = sorted({name for item in job.pending for name in item.shortcuts})
    try:
        session.send({"op": "hello", "frameworks": job.frameworks(), "tripwires": tripwires,
                      "cwd": "/sandbox/notebook" if options.sandbox else str(job.path.resolve().parent),
                      "cell_marker": f"<{job.path.name}", "output_limit": options.output_limit})
    except SandboxLost:
        pass  # read as a failed start by _grade_job
    return session


def _grade_job(job: Job, options: Options, session: Session | None = None) -> None:
    """Start student processes until every exercise of ``job`` has a verdict (one more after each lost step)."""
    for _ in range(len(job.cells) + len(job.pending) + 2):
        if job.done or job.fatal:
            break
        if session is None:
            try:
                session = _launch(job, options)
            except OSError as error:  # e.g. no more processes
                job.fail_all("error", f"the grader could not start the student's process: {error}")
                break
        step: tuple[str, Any] = ("start", None)
        try:
            session.start_step(STARTUP_TIMEOUT)
            reply, _ = session._wait()
            if not reply.get("ready"):
                raise SandboxLost("protocol", "it did not start")
            if job.started is None:
                job.started = time.perf_counter()
            for cell in job.loadable():
                step = ("cell", cell.number)
                session.start_step(options.timeout)
                reply, _ = session.raw("cell", source=cell.source, nodes=cell.nodes,
                                       filename=f"<{job.path.name}, {cell.label}>")
                problems = reply.get("problems", [])
                job.cell_loaded(cell.number, [str(p) for p in problems] if isinstance(problems, list) else [])
            while job.pending:
                step = ("exercise", job.pending[0])
                _check(session, job, job.pending[0], options)
        except SandboxLost as lost:
            _step_lost(job, step, lost, session.child, options)
        finally:
            session.close()
            session = None
    if session is not None:
        session.close()


def _step_lost(job: Job, step: tuple[str, Any], lost: SandboxLost, child: Child, options: Options) -> None:
    kind, key = step
    tail = child.tail_text()
    tail = f"; its last output: {tail}" if tail else ""
    limit = f"{options.timeout:g} s"
    why = lost.detail if lost.reason != "protocol" else f"it broke the grader's protocol ({lost.detail})"
    if kind == "start":
        job.fail_all("error", f"the student's process could not start ({why}){tail}")
    elif kind == "cell":
        if lost.reason == "timeout":
            job.cell_failed(key, f"loading its definitions did not finish within {limit} (an endless loop in a "
                                 "class body, a default argument, a decorator or an import?)")
        else:
            job.cell_failed(key, f"the student's process died while loading its definitions ({why}){tail}")
    else:
        symbol = key.symbol
        if lost.reason == "timeout":
            job.exercise_failed("timeout", f"the check did not finish within {limit}: is there an endless loop in "
                                           f"`{symbol}`, or is it far too slow? (the check uses small inputs)",
                                options.timeout)
        elif lost.reason == "protocol":
            job.exercise_failed("crash", f"the student's process {why} while `{symbol}` was checked")
        else:
            job.exercise_failed("crash", f"the student's process died while `{symbol}` was checked ({why}): does "
                                         f"your code call sys.exit/os._exit, run out of memory or crash the "
                                         f"interpreter?{tail}")


def _check(session: Session, job: Job, item: Exercise, options: Options) -> None:
    session.start_step(options.timeout)
    session.raw("arm", names=list(item.shortcuts))
    reply, data = session.raw("lookup", name=item.symbol)
    if reply.get("missing"):
        job.exercise_failed("missing", f"define `{item.symbol}`: the notebook has no function or class of that name")
        return
    answer = session.value(reply, data)
    found = find_shortcuts([c for c in job.loadable()], item.symbol, tuple(item.shortcuts))
    if found:
        job.exercise_failed("shortcut", f"`{item.symbol}` reaches {', '.join(found)}: this exercise asks you to "
                                        "write it yourself")
        return
    start = time.perf_counter()
    reason, message = _run_checker(item.checker, answer)
    if session.shortcuts:
        names = ", ".join(f"`{name}`" for name in dict.fromkeys(session.shortcuts))
        reason, message = "shortcut", f"`{item.symbol}` called {names}: this exercise asks you to write it yourself"
    if reason == "ok":
        for extra in options.extra.get(item.id, []):
            extra_reason, _ = _run_checker(extra, answer)
            if extra_reason != "ok":
                reason, message = "hidden", HIDDEN_FAILED + (
                    "" if extra_reason == "wrong" else " (your code raised an exception on a hidden case)")
                break
    job.exercise_done(PASSED if reason == "ok" else FAILED, reason, message, time.perf_counter() - start,
                      session.output_text(), session.output_chars)


def _run_checker(checker: Callable[[Any], None], answer: Any) -> tuple[str, str]:
    try:
        checker(answer)
        return "ok", ""
    except CheckFailed as failure:
        return "wrong", _cut(str(failure))
    except NotImplementedError:
        return "not-implemented", "not implemented yet (replace the `raise NotImplementedError`)"
    except StudentError as error:  # raised by the student's code outside the checker's call()
        where = f" (at {error.where})" if error.where else ""
        return "error", f"your code raised {type(error).__name__}: {error}{where}"
    except AssertionError as failure:
        return "wrong", _cut(str(failure)) or "the check failed"
    except Exception as error:  # the checker tripped over the answer, e.g. a list where a tensor was expected
        return "error", f"the check could not use your answer: {type(error).__name__}: {_cut(str(error), 1000)}"


def _cut(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else text[: limit - 20] + f" ... ({len(text)} characters)"
