"""Grade one notebook: its steps (start, load each cell, check each exercise) in forked student processes.

A student process for the notebook is forked from its folder's zygote (:mod:`companion.grade.forkserver`) and
sent ``hello``; then each loadable cell is loaded and each pending exercise checked, every step with its own time
limit. A step that runs out of time or kills the process fails alone (:func:`_step_lost` words the verdict); the
process and everything it started are ended and a fresh one, forked again, carries on with the remaining steps.
The checkers run here, in the trusted process (:func:`_check`), each in a thread of its own under a watchdog
(:func:`_watched_check`): a check still running :data:`STALL_GRACE` seconds after its step's time limit has stalled
in this process (nothing the student's process does can keep it past that limit), so it fails with reason
``stalled``, is left behind, and a fresh student process goes on with the notebook's other exercises.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from companion.checks import CheckFailed, Exercise

from .forkserver import Forked, Zygotes
from .jobs import Job
from .launcher import DEFAULT_MEMORY
from .remote import SandboxLost, Session, StudentError
from .results import FAILED, PASSED
from .shortcuts import find_shortcuts

DEFAULT_TIMEOUT = 60.0
#: Seconds one run of the grader may take in all (``--total-timeout``): the steps still to run when it is over fail.
DEFAULT_TOTAL_TIMEOUT = 600.0
#: How long a student process may take to import the frameworks before its first step.
STARTUP_TIMEOUT = 600.0
#: Characters of printed output kept per step (the rest is counted, not kept).
DEFAULT_OUTPUT_LIMIT = 4000
HIDDEN_FAILED = "hidden check failed"
#: Seconds a check may still run in the trusted process after its step's time limit before the watchdog gives it
#: up. Waiting on the student's process ends at that limit; only the grader's own computation can run on.
STALL_GRACE = 30.0

#: Checker threads given up by the watchdog and still alive (stuck in C code, e.g. a math library): the process
#: must not wait for them at exit (:func:`stalled_checks`).
_STALLED: list[threading.Thread] = []


class CheckStalled(Exception):  # noqa: N818 - an event, not an error of the caller's
    """A check made no progress in the trusted process; it has failed with reason ``stalled``."""


class _Abandoned(BaseException):  # noqa: N818 - not an Exception: a checker's ``except Exception`` must not catch it
    """Raised in a checker thread that the watchdog gave up, should it ever run Python code again."""


def stalled_checks() -> int:
    """How many checker threads the watchdog gave up that are still running (stuck) in this process."""
    _STALLED[:] = [thread for thread in _STALLED if thread.is_alive()]
    return len(_STALLED)


@dataclass
class Options:
    timeout: float = DEFAULT_TIMEOUT
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    memory: int = DEFAULT_MEMORY
    sandbox: bool = True
    extra: dict[str, list[Callable[[Any], None]]] = field(default_factory=dict)
    deadline: float | None = None  # time.monotonic() at which the whole run ends (--total-timeout)
    total_timeout: float = DEFAULT_TOTAL_TIMEOUT

    def seconds(self, step: float) -> float:
        """The time a step may take: its own limit, or what is left of the run's."""
        if self.deadline is None:
            return step
        return max(min(step, self.deadline - time.monotonic()), 0.001)

    def over(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def over_message(self) -> str:
        return (f"the grader's time limit for the whole run ({self.total_timeout:g} s, --total-timeout) was "
                "reached before this exercise was checked")


def cpu_seconds(job: Job, options: Options) -> int:
    """The CPU-time limit of a student process for ``job``'s remaining steps."""
    steps = len(job.loadable()) + len(job.pending) + 2
    return int(STARTUP_TIMEOUT + options.timeout * steps)


def _launch(job: Job, options: Options, zygotes: Zygotes) -> Session:
    """A student process for ``job`` (forked at the start step) with ``hello`` waiting in its pipe."""
    child = zygotes.fork(job.path, job.frameworks(), cpu_seconds(job, options))
    session = Session(child, options.output_limit)  # type: ignore[arg-type] - a Forked is used as a Child
    tripwires = sorted({name for item in job.pending for name in item.shortcuts})
    try:
        session.send({"op": "hello", "frameworks": job.frameworks(), "tripwires": tripwires,
                      "cwd": "/sandbox/notebook" if options.sandbox else str(job.path.resolve().parent),
                      "cell_marker": f"<{job.path.name}", "output_limit": options.output_limit})
    except SandboxLost:
        pass  # read as a failed start by grade_job
    return session


def grade_job(job: Job, options: Options, zygotes: Zygotes) -> None:
    """Fork student processes until every exercise of ``job`` has a verdict (one more after each lost step)."""
    for _ in range(len(job.cells) + len(job.pending) + 2):
        if job.done or job.fatal:
            break
        if options.over():
            job.fail_all("timeout", options.over_message())
            break
        try:
            session = _launch(job, options, zygotes)
        except OSError as error:  # e.g. no more processes
            job.fail_all("error", f"the grader could not start the student's process: {error}")
            break
        child: Forked = session.child  # type: ignore[assignment]
        step: tuple[str, Any] = ("start", None)
        try:
            session.start_step(options.seconds(STARTUP_TIMEOUT))
            child.start(session.deadline or 0.0)
            reply, _ = session.wait_reply()
            if not reply.get("ready"):
                raise SandboxLost("protocol", "it did not start")
            if job.started is None:
                job.started = time.perf_counter()
            for cell in job.loadable():
                step = ("cell", cell.number)
                session.start_step(options.seconds(options.timeout))
                reply, _ = session.raw("cell", source=cell.source, nodes=cell.nodes,
                                       filename=f"<{job.path.name}, {cell.label}>")
                problems = reply.get("problems", [])
                job.cell_loaded(cell.number, [str(p) for p in problems] if isinstance(problems, list) else [])
            while job.pending:
                step = ("exercise", job.pending[0])
                _watched_check(session, job, job.pending[0], options)
        except SandboxLost as lost:
            _step_lost(job, step, lost, child, options)
        except CheckStalled:
            pass  # that exercise failed; a fresh student process goes on with the others
        finally:
            session.close()


def _step_lost(job: Job, step: tuple[str, Any], lost: SandboxLost, child: Forked, options: Options) -> None:
    kind, key = step
    if lost.reason == "timeout" and options.over():
        job.fail_all("timeout", options.over_message())
        return
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
            job.exercise_failed("crash", f"the student's process broke the grader's protocol ({lost.detail}) while "
                                         f"`{symbol}` was checked")
        else:
            job.exercise_failed("crash", f"the student's process died while `{symbol}` was checked ({why}): does "
                                         f"your code call sys.exit/os._exit, run out of memory or crash the "
                                         f"interpreter?{tail}")


def _watched_check(session: Session, job: Job, item: Exercise, options: Options) -> None:
    """Check ``item`` in a thread of its own and record its verdict; give the check up when it stalls.

    The step's time limit bounds every wait on the student's process, so a check still running
    :data:`STALL_GRACE` seconds after it is stuck in this process (issue #36: a checker livelocked inside
    OpenBLAS). It then fails with reason ``stalled`` and :class:`CheckStalled` is raised, after the session has
    been abandoned (:meth:`Session.abandon`), so the caller ends the student process and goes on without it.
    """
    session.start_step(options.seconds(options.timeout))
    started = time.monotonic()
    outcome: list[tuple[bool, Any]] = []

    def work() -> None:
        try:
            outcome.append((True, _check(session, job, item, options)))
        except BaseException as error:  # noqa: BLE001 - handed to the grading thread, which re-raises it
            outcome.append((False, error))

    thread = threading.Thread(target=work, name=f"companion-grade-check-{item.id}", daemon=True)
    thread.start()
    thread.join(max((session.deadline or started) - time.monotonic(), 0.0) + STALL_GRACE)
    if thread.is_alive() or not outcome:
        session.abandon()
        _give_up(thread)
        job.exercise_failed("stalled", _stall_message(item, options, time.monotonic() - started),
                            time.monotonic() - started)
        raise CheckStalled(item.id)
    finished, value = outcome[0]
    if not finished:
        raise value
    job.exercise_done(*value)


def _stall_message(item: Exercise, options: Options, seconds: float) -> str:
    return (f"the grader stalled: its check of `{item.symbol}` was still running in the grader's own process "
            f"{seconds:.0f} s after it started, {STALL_GRACE:g} s past the check's time limit ({options.timeout:g} s), "
            "with nothing left to wait for from your code's process; the check was given up and counts as failed, "
            "and the other exercises were graded. Unless your code returns something enormous, this is a fault of "
            "the grader: ask for this exercise to be graded again")


def _give_up(thread: threading.Thread) -> None:
    """Leave a stalled checker thread behind: it ends at its next line of Python, if it ever gets there."""
    _STALLED.append(thread)
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Abandoned))


Verdict = tuple[str, str, str, float, str, int, list]


def _check(session: Session, job: Job, item: Exercise, options: Options) -> Verdict:
    """The verdict on ``item`` (the arguments of :meth:`Job.exercise_done`); it records nothing itself, since it
    runs in a thread that the watchdog may give up."""
    session.raw("arm", names=list(item.shortcuts), track=item.track)
    reply, data = session.raw("lookup", name=item.symbol)
    if reply.get("missing"):
        return (FAILED, "missing", f"define `{item.symbol}`: the notebook has no function or class of that name",
                0.0, "", 0, [])
    answer = session.value(reply, data)
    found = find_shortcuts([c for c in job.loadable()], item.symbol, tuple(item.shortcuts))
    if found:
        return (FAILED, "shortcut", f"`{item.symbol}` reaches {', '.join(found)}: this exercise asks you to write it "
                                    "yourself", 0.0, "", 0, [])
    start = time.perf_counter()
    reason, message, parts = _run_checker(item.checker, answer)
    if session.shortcuts:
        names = ", ".join(f"`{name}`" for name in dict.fromkeys(session.shortcuts))
        reason, message = "shortcut", f"`{item.symbol}` called {names}: this exercise asks you to write it yourself"
    elif session.monitoring_off and item.shortcuts:
        reason, message = "shortcut", (f"the grader's monitoring was switched off while `{item.symbol}` ran; an "
                                       "answer may not change the profiler or PyTorch's dispatch modes")
    if reason == "ok":
        for extra in options.extra.get(item.id, []):
            extra_reason, _, _ = _run_checker(extra, answer)
            if extra_reason != "ok":
                reason, message = "hidden", HIDDEN_FAILED + (
                    "" if extra_reason == "wrong" else " (your code raised an exception on a hidden case)")
                break
    return (PASSED if reason == "ok" else FAILED, reason, message, time.perf_counter() - start,
            session.output_text(), session.output_chars, parts if reason == "wrong" else [])


def _run_checker(checker: Callable[[Any], None], answer: Any) -> tuple[str, str, list[list]]:
    """(reason, message, parts): ``parts`` lists [name, passed] when a check with parts failed only in its parts
    (:func:`companion.checks.part`), else it is empty."""
    try:
        checker(answer)
        return "ok", "", []
    except CheckFailed as failure:
        parts = [[str(name), bool(passed)] for name, passed in getattr(failure, "parts", ())]
        return "wrong", _cut(str(failure)), parts
    except NotImplementedError:
        return "not-implemented", "not implemented yet (replace the `raise NotImplementedError`)", []
    except StudentError as error:  # raised by the student's code outside the checker's call()
        where = f" (at {error.where})" if error.where else ""
        return "error", f"your code raised {type(error).__name__}: {error}{where}", []
    except AssertionError as failure:
        return "wrong", _cut(str(failure)) or "the check failed", []
    except Exception as error:  # the checker tripped over the answer, e.g. a list where a tensor was expected
        return "error", f"the check could not use your answer: {type(error).__name__}: {_cut(str(error), 1000)}", []


def _cut(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else text[: limit - 20] + f" ... ({len(text)} characters)"
