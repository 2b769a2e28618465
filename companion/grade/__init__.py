"""Grade exercise notebooks with the same checks that give feedback inside them.

Command line::

    python -m companion.grade PATH... [--junit FILE] [--json FILE] [--timeout SECONDS] [--track numpy,torch,keras]

From Python::

    from companion.grade import grade
    report = grade(["exercises/01_text_as_numbers.md"], tracks=["torch"])
    report.ok, report.notebooks[0].result("pad_batch").message

How a notebook is graded:

1. Its chapter is its file name without extension; the exercises are those registered for that chapter in
   :mod:`companion.checks` (``numpy`` exercises always, ``torch``/``keras`` ones when their track is selected).
2. The parent process reads the code cells (jupytext; IPython syntax is turned into Python). A file that is not
   UTF-8, not JSON (``.ipynb``) or not a notebook fails every exercise with a message; a cell with a syntax error
   is skipped with a message.
3. A worker process (:mod:`companion.grade.worker`) loads only the imports, functions and classes of each cell
   into a fresh module (the notebook's other statements never run), then calls each exercise's checker, taken
   from the installed companion before any of the notebook's code ran, on the student's object.
4. Each step has a time limit; a step that hangs or kills the worker fails alone and a fresh worker goes on.
   Printed output is captured and capped. A :class:`~companion.grade.guard.Guard` notices code that changes the
   grading code (numpy, torch, keras, companion) while being loaded or checked, and that step fails.
"""

from .report import junit_xml, table, write_json, write_junit
from .results import FAILED, PASSED, SKIPPED, ExerciseResult, GradeReport, NotebookResult
from .runner import DEFAULT_TIMEOUT, collect_notebooks, grade

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
