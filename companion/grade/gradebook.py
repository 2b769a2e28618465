"""The instructor's settings (``grading.toml``) and the class's grades: gradebook, long table, feedback, JUnit.

The class grader (:mod:`companion.grade.classroom`) grades each student with ``python -m companion.grade`` and
keeps its JSON report. This module turns those reports into points:

- every exercise of a due chapter is a column; it earns its points when its status is ``passed``, 0 otherwise,
  unless the instructor allows partial credit (``partial_credit = true``): a check with parts
  (:func:`companion.checks.part`) that failed only in its parts then earns the fraction of its parts passed;
- an exercise with no result (a missing notebook, a student who could not be graded) earns 0 and says why;
- exercises of tracks that are not graded are left out of the gradebook (and of the maximum);
- a chapter handed in late loses a fraction of the points its exercises earned (:mod:`.policy`): each exercise
  keeps its raw points, its penalty and its final points.
"""

from __future__ import annotations

import csv
import html
import math
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from companion.checks import TRACKS, registry
from companion.grade.results import clean_text

from .policy import LatePolicy, load_policy, parse_time

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
_SETTINGS_KEYS = {"chapters", "tracks", "timeout", "notebooks", "extra_checks", "memory", "student_timeout",
                  "points_per_exercise", "roster", "partial_credit"}
_TABLES = ("grading", "points", "late", "canvas")


@dataclass
class Settings:
    """What the instructor decides: which chapters are due, which tracks are graded, how many points each exercise
    is worth. ``chapters=None`` means every chapter the course registers."""

    chapters: list[str] | None = None
    tracks: list[str] = field(default_factory=lambda: list(TRACKS))
    timeout: float = 60.0
    notebooks: str = "exercises"  # the folder of notebooks inside each student's folder
    extra_checks: Path | None = None
    memory: str | None = None
    student_timeout: float | None = None
    points_per_exercise: float = 1.0
    partial_credit: bool = False  # a failed check with parts earns the fraction of its parts passed
    points: dict[str, float] = field(default_factory=dict)
    late: LatePolicy = field(default_factory=LatePolicy)
    roster: Path | None = None  # the instructor's roster CSV, for the LMS exports (companion.grade.exports)
    canvas: dict[str, str] = field(default_factory=dict)  # chapter -> Canvas column "Name (canvas_id)"

    def points_for(self, exercise_id: str) -> float:
        return self.points.get(exercise_id, self.points_per_exercise)

    def grading_key(self) -> dict[str, Any]:
        """The settings that change a student's report (points do not: they are applied afterwards)."""
        extra = self.extra_checks.read_bytes().hex() if self.extra_checks and self.extra_checks.is_file() else None
        return {"chapters": self.chapters, "tracks": sorted(self.tracks), "timeout": self.timeout,
                "extra_checks": extra, "memory": self.memory}


def known_chapters() -> list[str]:
    return sorted({e.chapter for e in registry().values()})


def resolve_chapters(values: list[str], allow_unknown: bool = False) -> list[str]:
    """Chapter names from names or numbers (``2``, ``02`` or ``02_attention``)."""
    known = known_chapters()
    found = []
    for value in values:
        value = str(value).strip()
        matches = [c for c in known if c == value or (value.isdigit() and int(c.split("_")[0]) == int(value))]
        if matches:
            found.append(matches[0])
        elif allow_unknown and re.fullmatch(r"[\w.-]+", value):
            found.append(value)
        else:
            raise ValueError(f"chapters must be chapter names or numbers among {', '.join(known)}; got {value!r}")
    return list(dict.fromkeys(found))


def resolve_tracks(values: list[str]) -> list[str]:
    chosen = [str(v).strip() for v in values if str(v).strip()]
    unknown = [t for t in chosen if t not in TRACKS]
    if unknown or not chosen:
        raise ValueError(f"tracks must be among {', '.join(TRACKS)}; got {', '.join(map(str, values)) or 'none'}")
    return list(dict.fromkeys(["numpy", *chosen]))


def _number(table: str, key: str, value: Any, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or \
            (value <= 0 if positive else value < 0):
        need = "a positive number" if positive else "a number >= 0"
        raise ValueError(f"{table}.{key} must be {need}; got {value!r}")
    return float(value)


def load_settings(path: str | Path) -> Settings:
    """Read an instructor file; see ``grading.toml`` at the root of the course for every key."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read the instructor file {path}: {error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path} is not valid TOML: {error}") from None
    unknown_tables = set(data) - set(_TABLES)
    if unknown_tables:
        raise ValueError(f"{path}: unknown table(s) {', '.join(sorted(unknown_tables))}; expected some of "
                         f"{', '.join(f'[{t}]' for t in _TABLES)}")
    grading, points = data.get("grading", {}), data.get("points", {})
    unknown = set(grading) - _SETTINGS_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown key(s) in [grading]: {', '.join(sorted(unknown))}; "
                         f"expected some of {', '.join(sorted(_SETTINGS_KEYS))}")
    settings = Settings()
    if "extra_checks" in grading:
        settings.extra_checks = (path.parent / str(grading["extra_checks"])).resolve()
    if "chapters" in grading:
        if not isinstance(grading["chapters"], list) or not grading["chapters"]:
            raise ValueError(f"grading.chapters must be a non-empty list of chapter names; got {grading['chapters']!r}")
        settings.chapters = resolve_chapters(grading["chapters"], allow_unknown=settings.extra_checks is not None)
    if "tracks" in grading:
        if not isinstance(grading["tracks"], list):
            raise ValueError(f"grading.tracks must be a list such as [\"numpy\", \"torch\"]; got {grading['tracks']!r}")
        settings.tracks = resolve_tracks(grading["tracks"])
    for key in ("timeout", "student_timeout", "points_per_exercise"):
        if key in grading:
            setattr(settings, key, _number("grading", key, grading[key], positive=key != "points_per_exercise"))
    for key in ("notebooks", "memory"):
        if key in grading:
            if not isinstance(grading[key], str) or not grading[key]:
                raise ValueError(f"grading.{key} must be a non-empty string; got {grading[key]!r}")
            setattr(settings, key, grading[key])
    if "roster" in grading:
        settings.roster = (path.parent / str(grading["roster"])).resolve()
    if "partial_credit" in grading:
        if not isinstance(grading["partial_credit"], bool):
            raise ValueError(f"grading.partial_credit must be true or false; got {grading['partial_credit']!r}")
        settings.partial_credit = grading["partial_credit"]

    def chapter(value: Any) -> str:
        return resolve_chapters([str(value)], allow_unknown=settings.extra_checks is not None)[0]

    settings.late = load_policy(data.get("late", {}), path.parent, chapter)
    canvas = data.get("canvas", {})
    for key, value in canvas.items():
        if not isinstance(value, str) or not re.fullmatch(r".+ \(\d+\)", value):
            raise ValueError(f"canvas.{key} must be the Canvas column \"Assignment name (canvas id)\"; got {value!r}")
        settings.canvas[chapter(key)] = value
    known = registry()
    for key, value in points.items():
        if key not in known and settings.extra_checks is None:
            raise ValueError(f"points.{key}: no exercise has this id; known ids: {', '.join(sorted(known))}")
        settings.points[key] = _number("points", key, value, positive=False)
    return settings


# ---------------------------------------------------------------------------------------------------------------
# From reports to grades
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Grade:
    """One exercise of one student."""

    chapter: str
    exercise: str
    track: str
    status: str  # passed, failed (anything but passed earns nothing)
    reason: str
    message: str
    points: float  # raw: what the check earned
    max_points: float
    late_days: int = 0
    penalty: float = 0.0  # points taken off for lateness
    parts: str = ""  # "2 of 3 parts" when a failed check with parts earned partial credit

    @property
    def final(self) -> float:
        return self.points - self.penalty


@dataclass
class StudentGrades:
    student: str
    grades: list[Grade] = field(default_factory=list)
    note: str = ""  # why the student could not be graded, or what was wrong with the notebooks
    problems: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        """The gradebook's note: why the student could not be graded, or what kept exercises from being graded."""
        if self.note:
            return self.note
        missing = sorted({g.chapter for g in self.grades
                          if g.reason == "missing" and g.message.startswith("no notebook")})
        parts = [f"missing notebook{'s' if len(missing) > 1 else ''}: {', '.join(missing)}"] if missing else []
        parts += [p for p in self.problems if "cannot grade this notebook" in p]
        handed_in = {g.chapter for g in self.grades} - set(missing)
        for chapter in sorted(handed_in):
            if all(g.reason == "missing" for g in self.grades if g.chapter == chapter):
                parts.append(f"{chapter}: no answer is defined (is it the exercise notebook?)")
        parts += [f"{g.exercise}: {g.message}" for g in self.grades
                  if g.reason in ("timeout", "crash", "stalled", "tampered")]
        return "; ".join(parts)

    @property
    def raw(self) -> float:
        return sum(g.points for g in self.grades)

    @property
    def penalty(self) -> float:
        return sum(g.penalty for g in self.grades)

    @property
    def total(self) -> float:
        """The final points: raw points less the late penalty."""
        return self.raw - self.penalty

    @property
    def max_points(self) -> float:
        return sum(g.max_points for g in self.grades)


def columns(settings: Settings, reports: list[dict | None]) -> list[tuple[str, str, str]]:
    """(chapter, exercise id, track) of every graded exercise: the course's, then any other a report names."""
    due = settings.chapters or known_chapters()
    found = {(e.chapter, e.id): e.track for e in registry().values() if e.chapter in due}
    for report in reports:
        for notebook in (report or {}).get("notebooks", []):
            chapter = str(notebook.get("chapter") or Path(str(notebook.get("path", ""))).stem)
            if settings.chapters is not None and chapter not in due:
                continue
            for result in notebook.get("exercises", []):
                if result.get("reason") != "track":
                    found.setdefault((chapter, str(result.get("id"))), str(result.get("track", "numpy")))
    order = {chapter: index for index, chapter in enumerate(due)}
    keys = sorted(found, key=lambda k: order.get(k[0], len(order)))  # stable: registry order inside a chapter
    return [(chapter, exercise, found[(chapter, exercise)]) for chapter, exercise in keys
            if found[(chapter, exercise)] in settings.tracks or found[(chapter, exercise)] not in TRACKS]


def student_grades(student: str, report: dict | None, note: str, settings: Settings,
                   cols: list[tuple[str, str, str]], submitted: dict[str, str] | None = None) -> StudentGrades:
    """Points of one student from the grader's JSON report (None when the grader gave none); ``submitted`` maps a
    chapter to the ISO time its notebook was handed in (for the late policy)."""
    out = StudentGrades(clean_text(student), note=clean_text(note))  # a folder name reaches every class file
    submitted = submitted or {}
    late = {chapter: settings.late.late_days(student, chapter, parse_time("submitted", submitted[chapter])
                                             if chapter in submitted else None) for chapter in settings.late.due}
    results: dict[tuple[str, str], dict] = {}
    notebooks: dict[str, dict] = {}
    for notebook in (report or {}).get("notebooks", []):
        chapter = str(notebook.get("chapter") or Path(str(notebook.get("path", ""))).stem)
        notebooks[chapter] = notebook
        name = Path(str(notebook.get("path", chapter))).name
        if notebook.get("error"):
            out.problems.append(f"{name}: {notebook['error']}")
        out.problems += [f"{name}: {p}" for p in notebook.get("problems", [])]
        for result in notebook.get("exercises", []):
            results[(chapter, str(result.get("id")))] = result
    for chapter, exercise, track in cols:
        worth = settings.points_for(exercise)
        result = results.get((chapter, exercise))
        if result is None:
            if note:
                why = f"not graded: {note}"
            elif chapter not in notebooks:
                why = f"no notebook for chapter {chapter} ({chapter}.md or {chapter}.ipynb)"
            else:
                why = "the grader reported no result for this exercise"
            out.grades.append(Grade(chapter, exercise, track, FAILED, "missing", why, 0.0, worth))
            continue
        status = str(result.get("status", FAILED))
        passed = status == PASSED
        days = late.get(chapter, 0)
        fraction, parts = (1.0, "") if passed else _partial(result) if settings.partial_credit else (0.0, "")
        earned = worth * fraction
        out.grades.append(Grade(chapter, exercise, track, PASSED if passed else FAILED,
                                str(result.get("reason", "")), str(result.get("message", "")),
                                earned, worth, days, round(earned * settings.late.penalty_fraction(days), 9), parts))
    return out


def _partial(result: dict) -> tuple[float, str]:
    """The fraction a failed result earns from its parts (a wrong answer whose check has parts), and its words."""
    parts = result.get("parts")
    if result.get("reason") != "wrong" or not isinstance(parts, list) or not parts:
        return 0.0, ""
    passed = sum(1 for p in parts if isinstance(p, list) and len(p) == 2 and p[1] is True)
    return passed / len(parts), f"{passed} of {len(parts)} parts"


# ---------------------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------------------


def _cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: no formula from a student's folder name or message."""
    if isinstance(value, str):
        value = value.replace("\r", " ")
        if value[:1] in ("=", "+", "-", "@", "\t"):
            return "'" + value
    return value


def _points(value: float) -> str:
    """Points as a spreadsheet and an LMS read them: fractions kept (to 6 decimals), no exponent, no ``-0``."""
    text = f"{round(value, 6):.6f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def write_gradebook(path: Path, students: list[StudentGrades], cols: list[tuple[str, str, str]]) -> None:
    """One row per student: a column of raw points per exercise, the raw sum, the late penalty, the final points,
    the maximum and a note."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", *[exercise for _, exercise, _ in cols], "raw", "penalty", "final", "max", "note"])
        for student in students:
            earned = {g.exercise: _points(g.points) for g in student.grades}
            writer.writerow([_cell(student.student), *[earned.get(e, "0") for _, e, _ in cols], _points(student.raw),
                             _points(student.penalty), _points(student.total), _points(student.max_points),
                             _cell(student.summary)])


def write_long(path: Path, students: list[StudentGrades]) -> None:
    """One row per student and exercise, with the grader's message."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "chapter", "exercise", "track", "status", "points", "late_days", "penalty",
                         "final", "max", "reason", "message"])
        for student in students:
            for g in student.grades:
                writer.writerow([_cell(student.student), g.chapter, g.exercise, g.track, g.status, _points(g.points),
                                 g.late_days, _points(g.penalty), _points(g.final), _points(g.max_points), g.reason,
                                 _cell(g.message)])


def _md(text: str) -> str:
    """Text safe inside a Markdown table cell: no HTML, no column break, no line break."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def feedback_markdown(student: StudentGrades) -> str:
    """The student's feedback: the same messages as the long table, chapter by chapter."""
    lines = [f"# Grades of {_md(student.student)}", "",
             f"**{_points(student.total)} of {_points(student.max_points)} points.**", ""]
    if student.penalty:
        lines += [f"Late penalty: {_points(student.penalty)} points off the {_points(student.raw)} the checks "
                  "gave.", ""]
    if student.summary:
        lines += [f"> {_md(student.summary)}", ""]
    chapter = None
    for g in student.grades:
        if g.chapter != chapter:
            chapter = g.chapter
            earned = sum(x.points for x in student.grades if x.chapter == chapter)
            worth = sum(x.max_points for x in student.grades if x.chapter == chapter)
            days = max(x.late_days for x in student.grades if x.chapter == chapter)
            off = sum(x.penalty for x in student.grades if x.chapter == chapter)
            late = f" ({days} day{'s' * (days != 1)} late: {_points(off)} off)" if days else ""
            lines += ["", f"## {chapter}: {_points(earned - off)} of {_points(worth)} points{late}", "",
                      "| exercise | track | points | result | message |", "| --- | --- | --- | --- | --- |"]
        result = "pass" if g.status == PASSED else f"FAIL ({g.parts})" if g.parts else "FAIL"
        lines.append(f"| `{g.exercise}` | {g.track} | {_points(g.points)} / {_points(g.max_points)} | {result} | "
                     f"{_md(g.message)} |")
    if student.problems:
        lines += ["", "## Problems in the notebooks", ""] + [f"- {_md(p)}" for p in student.problems]
    return "\n".join(lines).replace("\n\n\n", "\n\n") + "\n"


def junit_xml(students: list[StudentGrades]) -> ET.ElementTree:
    """One testsuite per student, one testcase per exercise (classname ``student.chapter``)."""
    root = ET.Element("testsuites", name="companion.grade class")
    totals = {"tests": 0, "failures": 0, "errors": 0}
    for student in students:
        suite = ET.SubElement(root, "testsuite", name=student.student)
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(properties, "property", name="points", value=_points(student.total))
        ET.SubElement(properties, "property", name="max", value=_points(student.max_points))
        counts = {"tests": 0, "failures": 0, "errors": 0}
        if student.note:
            case = ET.SubElement(suite, "testcase", classname=student.student, name="(grading)")
            ET.SubElement(case, "error", message=student.note, type="grading").text = student.note
            counts["tests"] += 1
            counts["errors"] += 1
        for g in student.grades:
            case = ET.SubElement(suite, "testcase", classname=f"{student.student}.{g.chapter}", name=g.exercise)
            counts["tests"] += 1
            if g.status != PASSED:
                counts["failures"] += 1
                first = g.message.splitlines()[0] if g.message else g.reason
                ET.SubElement(case, "failure", message=first, type=g.reason or "failed").text = g.message
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return ET.ElementTree(root)


def safe_name(student: str) -> str:
    """A file name for a student's folder name."""
    return re.sub(r"[^\w.-]", "_", student).lstrip(".") or "_"


def write_all(out: Path, students: list[StudentGrades], cols: list[tuple[str, str, str]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_gradebook(out / "gradebook.csv", students, cols)
    write_long(out / "grades_long.csv", students)
    junit_xml(students).write(out / "junit.xml", encoding="utf-8", xml_declaration=True)
    feedback = out / "feedback"
    feedback.mkdir(exist_ok=True)
    for student in students:
        (feedback / f"{safe_name(student.student)}.md").write_text(feedback_markdown(student), encoding="utf-8")
