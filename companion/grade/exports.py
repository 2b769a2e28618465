"""Gradebooks that learning-management systems import: Canvas, Gradescope and a GitHub-Classroom-style CSV.

Every number is the student's final points (raw points less the late penalty), written with its fractions
(``2.5``, never rounded to an integer). The instructor's roster (``roster`` in ``grading.toml``) says who each
student folder is: a CSV with a ``student`` column (the folder's name) and any of ``name``, ``canvas_id``,
``sis_user_id``, ``sis_login_id``, ``section``, ``github_username``, ``roster_identifier``.

- ``canvas.csv`` (only with a roster): Canvas's gradebook import, ``Student, ID, SIS User ID, SIS Login ID,
  Section``, then one column per due chapter, named as the ``[canvas]`` table says (``Name (canvas_id)``, the
  header Canvas exports for an existing assignment) or by the chapter's name (Canvas then creates an assignment).
  Every roster row is written; a student with no folder scores 0.
- ``gradescope/STUDENT/results.json``: Gradescope's autograder results, one test per exercise.
- ``github_classroom.csv``: ``github_username, roster_identifier, points_awarded, points_available``.

Exercises that have instructor's extra checks stay hidden: the grader's message is only "hidden check failed"
(never an expected value or the check's source), and their tests are ``after_due_date`` in the Gradescope file.
"""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

from .gradebook import PASSED, Settings, StudentGrades, _cell, _points, safe_name

ROSTER_COLUMNS = ("student", "name", "canvas_id", "sis_user_id", "sis_login_id", "section", "github_username",
                  "roster_identifier")
CANVAS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
GITHUB_HEADER = ["github_username", "roster_identifier", "points_awarded", "points_available"]


def read_roster(path: Path) -> list[dict[str, str]]:
    """The instructor's roster: one dict per row, with every column of :data:`ROSTER_COLUMNS` ("" when absent)."""
    try:
        with Path(path).open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            header = [h.strip() for h in reader.fieldnames or []]
            rows = list(reader)
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"roster: cannot read {path}: {error}") from None
    unknown = set(header) - set(ROSTER_COLUMNS)
    if "student" not in header or unknown:
        raise ValueError(f"roster: {path} must have a column student (the folder's name) and only columns among "
                         f"{', '.join(ROSTER_COLUMNS)}; got {', '.join(header) or 'no header'}")
    found = [{c: (row.get(c) or "").strip() for c in ROSTER_COLUMNS} for row in
             ({k.strip(): v for k, v in row.items() if k} for row in rows)]
    names = [row["student"] for row in found]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated or "" in names:
        raise ValueError(f"roster: every row of {path} needs its own student folder name; "
                         f"{'repeated: ' + ', '.join(repeated) if repeated else 'a row has none'}")
    return found


def hidden_exercises(extra_checks: Path | None) -> list[str]:
    """Ids of the exercises the instructor's extra checks cover (their ``check_<id>`` functions), read without
    running the file."""
    if extra_checks is None or not extra_checks.is_file():
        return []
    try:
        tree = ast.parse(extra_checks.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError) as error:
        raise ValueError(f"extra checks: {extra_checks} is not a Python file: {error}") from None
    return sorted({node.name[len("check_"):] for node in tree.body
                   if isinstance(node, ast.FunctionDef) and node.name.startswith("check_")})


def chapters_of(students: list[StudentGrades]) -> list[str]:
    return list(dict.fromkeys(g.chapter for s in students for g in s.grades))


def canvas_rows(students: list[StudentGrades], settings: Settings, roster: list[dict[str, str]]) -> list[list[str]]:
    """The Canvas import: the header, then a row per roster entry (final points per chapter)."""
    chapters = chapters_of(students)
    by_name = {s.student: s for s in students}
    rows = [CANVAS_HEADER + [settings.canvas.get(c, c) for c in chapters]]
    for entry in roster:
        student = by_name.get(entry["student"])
        earned = [sum(g.final for g in student.grades if g.chapter == c) if student else 0.0 for c in chapters]
        rows.append([_cell(entry["name"] or entry["student"]), entry["canvas_id"], entry["sis_user_id"],
                     entry["sis_login_id"], _cell(entry["section"]), *map(_points, earned)])
    return rows


def github_rows(students: list[StudentGrades], roster: list[dict[str, str]] | None) -> list[list[str]]:
    """The GitHub-Classroom-style CSV: a row per graded student (the folder name when the roster has no user)."""
    entries = {row["student"]: row for row in roster or []}
    rows = [list(GITHUB_HEADER)]
    for student in students:
        entry = entries.get(student.student, {})
        rows.append([_cell(entry.get("github_username") or student.student), _cell(entry.get("roster_identifier", "")),
                     _points(student.total), _points(student.max_points)])
    return rows


def gradescope_results(student: StudentGrades, hidden: set[str]) -> dict:
    """Gradescope's ``results.json`` for one student: the final score and one test per exercise."""
    tests = []
    for g in student.grades:
        late = f" (handed in {g.late_days} day{'s' * (g.late_days != 1)} late: -{_points(g.penalty)})" \
            if g.penalty else ""
        tests.append({"name": f"{g.chapter}: {g.exercise}", "score": float(_points(g.final)),
                      "max_score": float(_points(g.max_points)), "status": "passed" if g.status == PASSED else "failed",
                      "output": ("passed" if g.status == PASSED else g.message) + late,
                      "visibility": "after_due_date" if g.exercise in hidden else "visible"})
    output = f"{_points(student.total)} of {_points(student.max_points)} points"
    if student.penalty:
        output += f" ({_points(student.raw)} before a late penalty of {_points(student.penalty)})"
    if student.summary:
        output += f". {student.summary}"
    return {"score": float(_points(student.total)), "output": output, "visibility": "visible",
            "stdout_visibility": "hidden", "tests": tests}


def _write_csv(path: Path, rows: list[list[str]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(rows)


def write_exports(out: Path, students: list[StudentGrades], settings: Settings,
                  roster: list[dict[str, str]] | None, hidden: list[str]) -> None:
    """``canvas.csv`` (with a roster), ``github_classroom.csv`` and ``gradescope/STUDENT/results.json``."""
    if roster is not None:
        _write_csv(out / "canvas.csv", canvas_rows(students, settings, roster))
    _write_csv(out / "github_classroom.csv", github_rows(students, roster))
    for student in students:
        folder = out / "gradescope" / safe_name(student.student)
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(gradescope_results(student, set(hidden)), indent=1, ensure_ascii=False)
        (folder / "results.json").write_text(text + "\n", encoding="utf-8")
