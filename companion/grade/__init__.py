"""Grade exercise notebooks with the same checks that give feedback inside them.

Command line::

    python -m companion.grade PATH... [--junit FILE] [--json FILE] [--timeout SECONDS] [--track numpy,torch,keras]

From Python::

    from companion.grade import grade
    report = grade(["exercises/01_text_as_numbers.md"], tracks=["torch"])
    report.ok, report.notebooks[0].result("pad_batch").message

How a notebook is graded (the threat model is in ``book/grading.md``):

1. Its chapter is its file name without extension; the exercises are those registered for that chapter in
   :mod:`companion.checks` (``numpy`` exercises always, ``torch``/``keras`` ones when their track is selected).
   Grading a folder expects a notebook for every registered chapter (or those of ``--chapters``); a missing or
   renamed notebook is missing work, and its exercises fail.
2. This process reads the code cells as text (:mod:`.notebooks`, jupytext) and never runs them.
3. A student process (:mod:`.launcher`: bubblewrap, rlimits, a pids cgroup, a subreaper) loads only the
   imports, functions, classes and literal constants of each cell (:mod:`.sandbox.child`). It is forked, fresh
   for each notebook, from a zygote that imported the frameworks once per folder (:mod:`.forkserver`), or once
   per job slot of a class, emptied between its students (:mod:`.classworker`).
4. Each exercise's checker runs here, on a proxy for the student's object (:mod:`.remote`): calls and attribute
   reads go to the student process, results come back as plain data. Expected values never leave this process.
5. Each step has a time limit; a step that hangs or kills the student process fails alone, everything that
   process started is ended, and a fresh one goes on. Reports are written atomically, after the last student
   process has ended.
"""

from .notebooks import collect_notebooks
from .report import junit_xml, table, write_json, write_junit
from .results import FAILED, PASSED, SKIPPED, ExerciseResult, GradeReport, NotebookResult
from .runner import DEFAULT_TIMEOUT, grade

__all__ = [
    "DEFAULT_TIMEOUT",
    "FAILED",
    "PASSED",
    "SKIPPED",
    "ExerciseResult",
    "GradeReport",
    "NotebookResult",
    "collect_notebooks",
    "grade",
    "junit_xml",
    "table",
    "write_json",
    "write_junit",
]
