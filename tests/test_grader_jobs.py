"""Grading notebooks side by side (``--jobs N``): the same verdicts every time, and a fault of the grader's on one
notebook fails that notebook, never the run.

CPython's parser keeps state that threads must not share (python/cpython#106905: "AST constructor recursion depth
mismatch" after minutes of ``--jobs 2``); every parse of the trusted process goes through one lock
(:func:`companion.grade.notebooks.parse_cell`) and each cell is parsed once, when its notebook is read.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import companion.grade.runner as runner
from companion.grade import FAILED, grade
from companion.grade.notebooks import parse_cell

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "grader_fixtures"


def _class(tmp_path: Path, students: int) -> list[Path]:
    """Folders of chapter 1: solutions, stubs and a few broken notebooks, one per "student"."""
    sources = [ROOT / "solutions" / "01_text_as_numbers.md", ROOT / "exercises" / "01_text_as_numbers.md",
               FIXTURES / "syntax_error" / "01_text_as_numbers.md", FIXTURES / "crash" / "01_text_as_numbers.md",
               FIXTURES / "wrong_shape_dtype" / "01_text_as_numbers.md"]
    folders = []
    for index in range(students):
        folder = tmp_path / f"student_{index:02d}"
        folder.mkdir()
        shutil.copy(sources[index % len(sources)], folder)
        folders.append(folder)
    return folders


def _verdicts(report) -> list[tuple[str, str, str, str]]:
    return [(Path(n.path).parent.name, r.id, r.status, r.reason) for n in report.notebooks for r in n.exercises]


def test_many_notebooks_with_four_jobs_give_the_same_verdicts_every_time(tmp_path):
    folders = _class(tmp_path, 10)
    alone = _verdicts(grade(folders, tracks=["numpy"], chapters=["01"], jobs=1, timeout=30))
    statuses = {status for _, _, status, _ in alone}
    assert {"passed", "failed"} <= statuses
    for _ in range(3):
        assert _verdicts(grade(folders, tracks=["numpy"], chapters=["01"], jobs=4, timeout=30)) == alone


def test_a_fault_of_the_grader_on_one_notebook_fails_only_that_notebook(tmp_path, monkeypatch):
    folders = _class(tmp_path, 4)
    real = runner.grade_job

    def faulty(job, options, zygotes):
        if job.path.parent.name == "student_01":
            raise SystemError("AST constructor recursion depth mismatch (before=1, after=2)")
        real(job, options, zygotes)

    monkeypatch.setattr(runner, "grade_job", faulty)
    report = grade(folders, tracks=["numpy"], chapters=["01"], jobs=4, timeout=30)
    by_student = {Path(n.path).parent.name: n for n in report.notebooks}
    broken = by_student["student_01"]
    assert all(r.status == FAILED and "the grader failed on this notebook" in r.message
               for r in broken.exercises if r.track == "numpy")
    assert all(r.status == "passed" for r in by_student["student_00"].exercises if r.track == "numpy")


def test_parsing_from_many_threads_gives_the_same_trees():
    sources = ["def f(x):\n    return " + "+".join(["x"] * 400) + "\n", "x = " + "-" * 100_000 + "1\n",
               "def g():\n    return " + "+".join(["1"] * 60_000) + "\n",
               "class A:\n    y = [" + "[" * 150 + "]" * 150 + "]\n"]
    expected = [(tree is None, why) for tree, why in map(parse_cell, sources)]
    assert expected[1] == (True, "the cell is nested too deeply to be parsed")
    failures: list[object] = []

    def work() -> None:
        for _ in range(20):
            for source, want in zip(sources, expected, strict=True):
                tree, why = parse_cell(source)
                if (tree is None, why) != want:
                    failures.append((want, why))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_the_whole_run_has_a_time_limit_and_still_reports():
    report = grade([FIXTURES / "infinite_loop"], tracks=["numpy"], chapters=["01"], timeout=120, total_timeout=10)
    results = report.notebooks[0].exercises
    over = [r for r in results if r.reason == "timeout" and "time limit for the whole run" in r.message]
    assert over and all(r.status == FAILED for r in over)
    assert report.seconds < 100  # a step's own limit (120 s) would have run on
