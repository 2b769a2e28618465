"""What the instructor reads after grading a class: ``report.html`` and ``changes.csv``.

``report.html`` is one static page (no script, no style sheet or font from the network): the pass rate of each
exercise among the students who could be graded, the failure message the most students share on each exercise
(the class's common misconception), a histogram of the final totals, and the students who could not be graded,
with the reason. ``changes.csv`` lists every student and exercise whose status or final points differ from the
previous run's ``grades_long.csv`` in the same folder (only a header on a first run).
"""

from __future__ import annotations

import csv
import html
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .gradebook import PASSED, StudentGrades, _cell, _points

#: Failures that say nothing about the answer (a notebook that could not be read or was not handed in): counted in
#: the pass rate, left out of the most common failure.
_NOT_ABOUT_THE_ANSWER = {"unreadable", "missing-notebook"}
CHANGES_HEADER = ["student", "exercise", "status_before", "status_after", "final_before", "final_after"]
BINS = 10


@dataclass
class ExerciseSummary:
    chapter: str
    exercise: str
    track: str
    passed: int
    graded: int  # students graded (those who could not be graded at all are not counted)
    common_failure: str  # the first line of the failure message the most students got about their answer
    common_count: int
    partial: int = 0  # students who failed it with partial credit (some of its check's parts passed)

    @property
    def pass_rate(self) -> float:
        return self.passed / self.graded if self.graded else 0.0


def exercise_summaries(students: list[StudentGrades]) -> list[ExerciseSummary]:
    """Per exercise, in the gradebook's order: pass counts and the most common failure among graded students."""
    graded = [s for s in students if not s.note]
    order = list(dict.fromkeys((g.chapter, g.exercise, g.track) for s in students for g in s.grades))
    out = []
    for chapter, exercise, track in order:
        results = [g for s in graded for g in s.grades if g.exercise == exercise and g.chapter == chapter]
        failures = Counter((g.message.splitlines() or [g.reason])[0] for g in results
                           if g.status != PASSED and g.reason not in _NOT_ABOUT_THE_ANSWER
                           and not g.message.startswith("no notebook for chapter"))
        common, count = min(failures.items(), key=lambda item: (-item[1], item[0])) if failures else ("", 0)
        out.append(ExerciseSummary(chapter, exercise, track, sum(g.status == PASSED for g in results), len(results),
                                   common, count, sum(g.status != PASSED and g.points > 0 for g in results)))
    return out


def histogram(students: list[StudentGrades]) -> list[tuple[float, float, int]]:
    """(low, high, count) of the final totals in :data:`BINS` equal bins from 0 to the largest maximum; the last
    bin includes its upper edge."""
    top = max((s.max_points for s in students), default=0.0) or 1.0
    width = top / BINS
    counts = [0] * BINS
    for student in students:
        counts[min(int(max(student.total, 0.0) / width), BINS - 1)] += 1
    return [(i * width, (i + 1) * width, counts[i]) for i in range(BINS)]


def _svg(bins: list[tuple[float, float, int]]) -> str:
    tallest = max((c for _, _, c in bins), default=0) or 1
    bar, height = 48, 160
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{bar * len(bins) + 20}" height="{height + 40}" '
             'role="img" aria-label="histogram of the final totals">']
    for i, (low, high, count) in enumerate(bins):
        h = round(height * count / tallest)
        x = 10 + i * bar
        parts.append(f'<rect x="{x}" y="{10 + height - h}" width="{bar - 6}" height="{h}" fill="#4c72b0">'
                     f'<title>{_points(low)} to {_points(high)}: {count}</title></rect>')
        parts.append(f'<text x="{x + (bar - 6) / 2}" y="{height + 24}" font-size="10" text-anchor="middle">'
                     f'{_points(round(low, 1))}</text>')
        if count:
            parts.append(f'<text x="{x + (bar - 6) / 2}" y="{6 + height - h}" font-size="10" '
                         f'text-anchor="middle">{count}</text>')
    return "\n".join(parts + ["</svg>"])


def report_html(students: list[StudentGrades], outside_roster: list[str] | None = None,
                missing_folders: list[str] | None = None) -> str:
    """The class report as one static HTML page."""
    e = html.escape
    summaries = exercise_summaries(students)
    bins = histogram(students)
    ungraded = [s for s in students if s.note]
    rows = "\n".join(
        f'<tr data-exercise="{e(x.exercise)}" data-passed="{x.passed}" data-graded="{x.graded}" '
        f'data-partial="{x.partial}">'
        f"<td>{e(x.chapter)}</td><td><code>{e(x.exercise)}</code></td><td>{e(x.track)}</td>"
        f"<td>{x.passed} / {x.graded}</td><td>{100 * x.pass_rate:.0f}%</td><td>{x.partial or ''}</td>"
        f"<td>{e(x.common_failure)}</td><td>{x.common_count or ''}</td></tr>" for x in summaries)
    bin_rows = "\n".join(f'<tr data-low="{_points(lo)}" data-count="{c}"><td>{_points(lo)} to {_points(hi)}</td>'
                         f"<td>{c}</td></tr>" for lo, hi, c in bins)
    ungraded_rows = "\n".join(f'<tr data-student="{e(s.student)}"><td>{e(s.student)}</td><td>{e(s.note)}</td></tr>'
                              for s in ungraded) or '<tr><td colspan="2">none</td></tr>'
    partial = [s for s in students if not s.note and s.summary]
    partial_rows = "\n".join(f"<tr><td>{e(s.student)}</td><td>{e(s.summary)}</td></tr>" for s in partial) or \
        '<tr><td colspan="2">none</td></tr>'
    roster = ""
    if outside_roster or missing_folders:
        roster = ("<h2>Roster</h2><p>Graded but not in the roster (left out of canvas.csv): "
                  f"{e(', '.join(outside_roster or [])) or 'none'}.</p><p>In the roster with no folder (0 points in "
                  f"canvas.csv): {e(', '.join(missing_folders or [])) or 'none'}.</p>")
    totals = [s.total for s in students]
    mean = sum(totals) / len(totals) if totals else 0.0
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Class report</title>
<style>body{{font-family:sans-serif;max-width:70em;margin:1em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}}</style></head><body>
<h1>Class report</h1>
<p id="counts" data-students="{len(students)}" data-ungraded="{len(ungraded)}">{len(students)} students,
{len(ungraded)} of whom could not be graded; mean final total {_points(round(mean, 2))} of
{_points(max((s.max_points for s in students), default=0.0))} points.</p>
<h2>Exercises</h2>
<p>Pass rates count the students who could be graded. The message is the first line of the failure the most
students got on that exercise (a notebook that could not be read or was not handed in aside); "partial" counts
the students who failed it with partial credit.</p>
<table id="exercises"><tr><th>chapter</th><th>exercise</th><th>track</th><th>passed</th><th>rate</th>
<th>partial</th><th>most common failure</th><th>students</th></tr>
{rows}
</table>
<h2>Final totals</h2>
{_svg(bins)}
<table id="histogram"><tr><th>final total</th><th>students</th></tr>
{bin_rows}
</table>
<h2>Students who could not be graded</h2>
<table id="ungraded"><tr><th>student</th><th>why</th></tr>
{ungraded_rows}
</table>
<h2>Graded, with parts that could not be graded</h2>
<table id="partial"><tr><th>student</th><th>what</th></tr>
{partial_rows}
</table>
{roster}
</body></html>
"""


def read_long(path: Path) -> dict[tuple[str, str], tuple[str, str]] | None:
    """(student, exercise) -> (status, final points) of a previous ``grades_long.csv``; None when there is none."""
    if not path.is_file():
        return None
    with path.open(encoding="utf-8", newline="") as handle:
        return {(row["student"], row["exercise"]): (row["status"], row.get("final") or row.get("points", ""))
                for row in csv.DictReader(handle)}


def changes(before: dict[tuple[str, str], tuple[str, str]] | None,
            students: list[StudentGrades]) -> list[list[str]]:
    """The rows of ``changes.csv``: what differs from ``before`` (student and exercise keyed as in the long table)."""
    rows = [list(CHANGES_HEADER)]
    if before is None:
        return rows
    after = {(str(_cell(s.student)), g.exercise): (g.status, _points(g.final)) for s in students for g in s.grades}
    for key in list(after) + [k for k in before if k not in after]:
        old, new = before.get(key, ("", "")), after.get(key, ("", ""))
        if old != new:
            rows.append([key[0], key[1], old[0], new[0], old[1], new[1]])
    return rows


def write_report(out: Path, students: list[StudentGrades], before: dict[tuple[str, str], tuple[str, str]] | None,
                 outside_roster: list[str] | None = None, missing_folders: list[str] | None = None) -> None:
    (out / "report.html").write_text(report_html(students, outside_roster, missing_folders), encoding="utf-8")
    with (out / "changes.csv").open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(changes(before, students))
