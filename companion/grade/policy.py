"""The late policy of a class: due dates per chapter, a penalty per day late with a cap, extensions per student.

The instructor file's ``[late]`` table (see ``grading.toml``)::

    [late]
    penalty_per_day = 0.1          # fraction of a chapter's points lost per started day late
    max_penalty = 0.5              # the most a chapter can lose, as a fraction of its points
    submitted = "submitted.csv"    # optional: submission times from the instructor (else the last commit)

    [late.due]                     # TOML date-times with a UTC offset; a chapter not listed has no due date
    01_text_as_numbers = 2026-10-05T23:59:00Z

    [late.extensions]              # days added to a student's due dates: every chapter, or some
    student_folder = 2
    other_folder = { 02_attention = 3 }

A chapter handed in ``d`` started days after its (extended) due date loses ``min(d * penalty_per_day,
max_penalty)`` of the points its exercises earned. The submission time of a chapter is taken from the
instructor's file when it names the student (a row for that chapter first, then a row with no chapter), else
from the committer date of the last commit that touched the student's notebook.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DAY = 86400.0
_KEYS = {"due", "penalty_per_day", "max_penalty", "submitted", "extensions"}


@dataclass
class LatePolicy:
    """Due dates (chapter -> aware datetime), the penalty per started day late, its cap, and extensions
    (student -> days for every chapter, or student -> {chapter: days})."""

    due: dict[str, dt.datetime] = field(default_factory=dict)
    penalty_per_day: float = 0.0
    max_penalty: float = 1.0
    extensions: dict[str, float | dict[str, float]] = field(default_factory=dict)
    submitted: dict[str, dict[str, dt.datetime]] = field(default_factory=dict)  # student -> chapter ("" = all)

    def extension_days(self, student: str, chapter: str) -> float:
        extra = self.extensions.get(student, 0.0)
        return float(extra.get(chapter, 0.0)) if isinstance(extra, dict) else float(extra)

    def due_for(self, student: str, chapter: str) -> dt.datetime | None:
        """The student's due date for ``chapter`` (with any extension), or None when the chapter has none."""
        due = self.due.get(chapter)
        return None if due is None else due + dt.timedelta(days=self.extension_days(student, chapter))

    def late_days(self, student: str, chapter: str, submitted: dt.datetime | None) -> int:
        """Started days between the due date and the submission; 0 when on time or when either is unknown."""
        due = self.due_for(student, chapter)
        if due is None or submitted is None or submitted <= due:
            return 0
        return math.ceil((submitted - due).total_seconds() / DAY)

    def penalty_fraction(self, days: int) -> float:
        """The fraction of a chapter's points lost for ``days`` days late."""
        if days < 0:
            raise ValueError(f"days must be >= 0; got {days}")
        return min(days * self.penalty_per_day, self.max_penalty)

    def instructor_time(self, student: str, chapter: str) -> dt.datetime | None:
        rows = self.submitted.get(student, {})
        return rows.get(chapter, rows.get(""))

    def to_json(self) -> dict[str, Any]:
        return {"due": {c: d.isoformat() for c, d in sorted(self.due.items())},
                "penalty_per_day": self.penalty_per_day, "max_penalty": self.max_penalty,
                "extensions": dict(sorted(self.extensions.items())),
                "submitted": {s: {c: t.isoformat() for c, t in sorted(rows.items())}
                              for s, rows in sorted(self.submitted.items())}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LatePolicy:
        return cls(due={c: dt.datetime.fromisoformat(d) for c, d in data["due"].items()},
                   penalty_per_day=data["penalty_per_day"], max_penalty=data["max_penalty"],
                   extensions=data["extensions"],
                   submitted={s: {c: dt.datetime.fromisoformat(t) for c, t in rows.items()}
                              for s, rows in data["submitted"].items()})


def _fraction(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"late.{key} must be a fraction of the points between 0 and 1; got {value!r}")
    return float(value)


def _days(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where} must be a number of days >= 0; got {value!r}")
    return float(value)


def parse_time(where: str, value: Any) -> dt.datetime:
    """An aware datetime from a TOML date-time or an ISO 8601 string with a UTC offset (``Z`` or ``+01:00``)."""
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{where} must be a date-time such as 2026-10-05T23:59:00Z; got {value!r}") from None
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise ValueError(f"{where} must be a date-time with a UTC offset, such as 2026-10-05T23:59:00Z; "
                         f"got {value!r}")
    return value.astimezone(dt.timezone.utc)


def read_submitted(path: Path) -> dict[str, dict[str, dt.datetime]]:
    """The instructor's submission times: a CSV with columns ``student``, ``submitted`` and optionally
    ``chapter`` (empty: every chapter)."""
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"late.submitted: cannot read {path}: {error}") from None
    if rows and not {"student", "submitted"} <= set(rows[0]):
        raise ValueError(f"late.submitted: {path} must have the columns student, submitted (and optionally "
                         f"chapter); got {', '.join(rows[0])}")
    found: dict[str, dict[str, dt.datetime]] = {}
    for number, row in enumerate(rows, start=2):
        chapter = (row.get("chapter") or "").strip()
        found.setdefault(row["student"].strip(), {})[chapter] = parse_time(f"{path.name} line {number}",
                                                                           row["submitted"])
    return found


def load_policy(table: Any, base: Path, resolve_chapter: Any) -> LatePolicy:
    """The ``[late]`` table of an instructor file; ``resolve_chapter`` turns a name or number into a chapter."""
    if not isinstance(table, dict):
        raise ValueError(f"late must be a table; got {table!r}")
    unknown = set(table) - _KEYS
    if unknown:
        raise ValueError(f"unknown key(s) in [late]: {', '.join(sorted(unknown))}; "
                         f"expected some of {', '.join(sorted(_KEYS))}")
    policy = LatePolicy()
    due = table.get("due", {})
    if not isinstance(due, dict):
        raise ValueError(f"late.due must be a table of chapter = date-time; got {due!r}")
    policy.due = {resolve_chapter(c): parse_time(f"late.due.{c}", t) for c, t in due.items()}
    if "penalty_per_day" in table:
        policy.penalty_per_day = _fraction("penalty_per_day", table["penalty_per_day"])
    if "max_penalty" in table:
        policy.max_penalty = _fraction("max_penalty", table["max_penalty"])
    extensions = table.get("extensions", {})
    if not isinstance(extensions, dict):
        raise ValueError(f"late.extensions must be a table of student = days; got {extensions!r}")
    for student, value in extensions.items():
        where = f"late.extensions.{student}"
        if isinstance(value, dict):
            policy.extensions[student] = {resolve_chapter(c): _days(f"{where}.{c}", d) for c, d in value.items()}
        else:
            policy.extensions[student] = _days(where, value)
    if "submitted" in table:
        policy.submitted = read_submitted(base / str(table["submitted"]))
    return policy


def last_commit_time(folder: Path, notebook: Path) -> dt.datetime | None:
    """The committer date of the last commit of ``folder``'s repository that touched ``notebook``, or None when
    the folder is not a Git repository or the file has no commit. (A student can set that date: where that
    matters, give the times from the Git host's push events or the LMS in ``late.submitted``.)"""
    if not (folder / ".git").exists():  # not the student's own repository (perhaps a folder inside another)
        return None
    try:
        done = subprocess.run(["git", "-C", str(folder), "-c", f"safe.directory={folder.resolve()}", "log", "-1",
                               "--format=%cI", "--", str(notebook.resolve().relative_to(folder.resolve()))],
                              capture_output=True, text=True, timeout=60)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    text = done.stdout.strip()
    if done.returncode != 0 or not text:
        return None
    return parse_time("the commit date", text)


def submission_times(student: str, folder: Path, notebooks: list[Path], policy: LatePolicy) -> dict[str, str]:
    """chapter -> ISO time of each due notebook's submission, for the chapters that have a due date."""
    times: dict[str, str] = {}
    for notebook in notebooks:
        chapter = notebook.stem
        if chapter not in policy.due:
            continue
        when = policy.instructor_time(student, chapter) or last_commit_time(folder, notebook)
        if when is not None:
            times[chapter] = when.isoformat()
    return times
