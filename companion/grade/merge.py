"""A class's output folder, written from its students' reports; shards of a class merged into one.

``python -m companion.grade class SUBMISSIONS --out DIR --shard I/N`` grades the students whose index in the
sorted roster is ``I - 1`` modulo ``N``; every run (a shard or the whole class) writes ``DIR/class.json``: the
roster, the settings that turn reports into points, and per student its folder under ``DIR/students``, the
grader's note and the submission times. ``python -m companion.grade merge OUT_1 ... OUT_N --out DIR`` checks that
the N folders are the N shards of one class graded with the same settings, copies their ``students/`` folders into
``DIR`` and writes every class file from the reports with the same code as a single run
(:func:`write_class`), so the gradebook, the long table, the feedback, ``junit.xml``, the exports and the report
are the files a single machine would have written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import classreport, exports, gradebook
from .gradebook import Settings
from .policy import LatePolicy

CLASS_FILE = "class.json"
VERSION = 1


@dataclass
class StudentRecord:
    """What a class run keeps of one student: its folder under ``students/``, its report, note and times."""

    student: str
    folder: str
    report: dict | None
    note: str
    submitted: dict[str, str] = field(default_factory=dict)


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` with ``1 <= I <= N``."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"shard must be I/N, e.g. 2/8; got {text!r}") from None
    if not 1 <= index <= count:
        raise ValueError(f"shard must be I/N with 1 <= I <= N; got {text!r}")
    return index, count


def parse_shard_argument(text: str) -> tuple[int, int]:
    """:func:`parse_shard` for argparse."""
    try:
        return parse_shard(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def in_shard(position: int, shard: tuple[int, int] | None) -> bool:
    """Whether the student at ``position`` (0-based, in the sorted roster) belongs to ``shard``."""
    return shard is None or position % shard[1] == shard[0] - 1


def settings_json(settings: Settings, roster: list[dict[str, str]] | None, hidden: list[str]) -> dict[str, Any]:
    """The settings that decide the class files (grading settings included, so shards graded alike agree)."""
    extra = settings.extra_checks
    return {"chapters": settings.chapters, "tracks": list(settings.tracks), "timeout": settings.timeout,
            "memory": settings.memory, "points_per_exercise": settings.points_per_exercise,
            "points": dict(sorted(settings.points.items())), "late": settings.late.to_json(),
            "canvas": dict(sorted(settings.canvas.items())), "roster": roster, "hidden": hidden,
            "extra_checks": hashlib.sha256(extra.read_bytes()).hexdigest() if extra and extra.is_file() else None}


def settings_from_json(data: dict[str, Any]) -> Settings:
    return Settings(chapters=data["chapters"], tracks=data["tracks"], timeout=data["timeout"], memory=data["memory"],
                    points_per_exercise=data["points_per_exercise"], points=data["points"],
                    late=LatePolicy.from_json(data["late"]), canvas=data["canvas"])


def write_class(out: Path, records: list[StudentRecord], settings: Settings, recorded: dict[str, Any],
                everyone: list[str], shard: tuple[int, int] | None) -> list[gradebook.StudentGrades]:
    """Every class file of ``out`` from the students' records (in roster order); ``recorded`` is
    :func:`settings_json` of the run (roster and hidden exercises included). See the module's doc."""
    roster, hidden = recorded["roster"], recorded["hidden"]
    out.mkdir(parents=True, exist_ok=True)
    before = classreport.read_long(out / "grades_long.csv")
    reports = [r.report for r in records]
    cols = gradebook.columns(settings, reports)
    grades = [gradebook.student_grades(r.student, r.report, r.note, settings, cols, r.submitted) for r in records]
    gradebook.write_all(out, grades, cols)
    graded = {r.student for r in records}
    # A shard's canvas.csv has the rows of its own students (and of roster entries with no folder at all).
    canvas_roster = [row for row in roster if row["student"] in graded or row["student"] not in everyone] \
        if roster is not None else None
    exports.write_exports(out, grades, settings, canvas_roster, hidden)
    outside = sorted(graded - {row["student"] for row in roster}) if roster is not None else None
    missing = [row["student"] for row in roster if row["student"] not in everyone] if roster is not None else None
    classreport.write_report(out, grades, before, outside, missing)
    state = {"version": VERSION, "shard": list(shard) if shard else None, "roster": everyone,
             "settings": recorded,
             "students": [{"student": r.student, "folder": r.folder, "note": r.note, "report": r.report is not None,
                           "submitted": r.submitted} for r in records]}
    (out / CLASS_FILE).write_text(json.dumps(state, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return grades


def _read_state(folder: Path) -> dict[str, Any]:
    try:
        state = json.loads((folder / CLASS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"OUT folders must be outputs of `python -m companion.grade class --shard I/N`; "
                         f"{folder / CLASS_FILE}: {error}") from None
    if not isinstance(state, dict) or state.get("version") != VERSION:
        raise ValueError(f"{folder / CLASS_FILE} was written by another version of the class grader")
    return state


def merge(shards: list[Path], out: Path) -> list[gradebook.StudentGrades]:
    """Combine the outputs of the N shards of one class into ``out``; see the module's doc."""
    if not shards:
        raise ValueError("merge needs the output folders of the shards (OUT_1 ... OUT_N)")
    states = [_read_state(Path(folder)) for folder in shards]
    first = states[0]
    count = len(states)
    found = sorted(tuple(s["shard"] or (1, 1)) for s in states)
    if found != [(i, count) for i in range(1, count + 1)]:
        raise ValueError(f"shards must be 1/{count} to {count}/{count}, once each; got "
                         f"{', '.join('/'.join(map(str, s)) for s in found)}")
    for folder, state in zip(shards, states, strict=True):
        if state["roster"] != first["roster"]:
            raise ValueError(f"{folder} graded another set of student folders than {shards[0]}")
        if state["settings"] != first["settings"]:
            raise ValueError(f"{folder} was graded with other settings than {shards[0]} (instructor file, "
                             "options or extra checks differ)")
    by_student: dict[str, tuple[Path, dict]] = {}
    for folder, state in zip(shards, states, strict=True):
        for entry in state["students"]:
            by_student[entry["student"]] = (Path(folder), entry)
    if sorted(by_student) != sorted(first["roster"]):
        raise ValueError("the shards do not cover the roster: missing " +
                         ", ".join(sorted(set(first["roster"]) - set(by_student))))
    out = Path(out)
    if any(out.resolve() == Path(f).resolve() for f in shards):
        raise ValueError("--out must be a folder other than the shards'")
    records = []
    for student in first["roster"]:
        folder, entry = by_student[student]
        source, target = folder / "students" / entry["folder"], out / "students" / entry["folder"]
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        report = None
        if entry["report"]:
            try:
                report = json.loads((source / "report.json").read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                raise ValueError(f"{source / 'report.json'}: the shard's report of {student} is unusable: "
                                 f"{error}") from None
        records.append(StudentRecord(student, entry["folder"], report, entry["note"], entry["submitted"]))
    data = first["settings"]
    return write_class(out, records, settings_from_json(data), data, first["roster"], None)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m companion.grade merge",
                                description="Merge the outputs of `companion.grade class --shard I/N` into one.",
                                epilog="example: python -m companion.grade merge shard-1 shard-2 --out grades/")
    p.add_argument("shards", nargs="+", type=Path, metavar="OUT", help="the output folder of each shard")
    p.add_argument("--out", type=Path, required=True, help="folder for the merged gradebook, feedback and reports")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        grades = merge(args.shards, args.out)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{len(grades)} students from {len(args.shards)} shards; gradebook: {args.out / 'gradebook.csv'}")
    return 0
