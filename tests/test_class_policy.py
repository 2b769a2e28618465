"""The late policy's arithmetic, the instructor file's [late] and [canvas] tables, the class report's numbers and
changes.csv, on reports written by hand (no grading: these tests take well under a second each)."""

from __future__ import annotations

import csv
import datetime as dt
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from companion.checks import exercises_for
from companion.grade import classreport, exports, gradebook, merge
from companion.grade.gradebook import Settings
from companion.grade.policy import LatePolicy, parse_time, read_submitted, submission_times
from companion.instructor import release

UTC = dt.timezone.utc
DUE = dt.datetime(2026, 10, 5, 23, 59, tzinfo=UTC)
CHAPTER = "01_text_as_numbers"
NUMPY = [e.id for e in exercises_for(CHAPTER) if e.track == "numpy"]


def test_late_days_count_started_days_after_the_extended_due_date():
    policy = LatePolicy(due={CHAPTER: DUE}, penalty_per_day=0.2, max_penalty=0.5,
                        extensions={"ext": 2, "partial": {CHAPTER: 0.5}})
    minute, day = dt.timedelta(minutes=1), dt.timedelta(days=1)
    assert policy.late_days("a", CHAPTER, DUE) == 0  # on the minute: on time
    assert policy.late_days("a", CHAPTER, DUE + minute) == 1
    assert policy.late_days("a", CHAPTER, DUE + day) == 1
    assert policy.late_days("a", CHAPTER, DUE + day + minute) == 2
    assert policy.late_days("a", CHAPTER, None) == 0  # unknown time: no penalty
    assert policy.late_days("a", "02_attention", DUE + 9 * day) == 0  # no due date
    assert policy.late_days("ext", CHAPTER, DUE + 2 * day) == 0
    assert policy.late_days("ext", CHAPTER, DUE + 2 * day + minute) == 1
    assert policy.late_days("partial", CHAPTER, DUE + day) == 1  # half a day of extension: 12 h late
    assert [policy.penalty_fraction(d) for d in range(5)] == pytest.approx([0, 0.2, 0.4, 0.5, 0.5])  # capped
    with pytest.raises(ValueError, match="days must be >= 0"):
        policy.penalty_fraction(-1)


def _report(passed: dict[str, bool], chapter: str = CHAPTER, message: str = "wrong shape") -> dict:
    """A grader's report where the exercises of ``passed`` have that verdict and the course's others pass."""
    verdicts = {**dict.fromkeys(NUMPY, True), **passed}
    return {"notebooks": [{"path": f"x/{chapter}.md", "chapter": chapter, "exercises": [
        {"id": e, "track": "numpy", "status": "passed" if ok else "failed", "reason": "ok" if ok else "wrong",
         "message": "" if ok else message} for e, ok in verdicts.items()]}]}


def test_penalty_applies_to_raw_points_per_exercise():
    settings = Settings(chapters=[CHAPTER], tracks=["numpy"], points={"pad_batch": 2.5},
                        late=LatePolicy(due={CHAPTER: DUE}, penalty_per_day=0.1, max_penalty=0.25))
    cols = [(CHAPTER, "pad_batch", "numpy"), (CHAPTER, "build_vocabulary", "numpy")]
    report = _report({"pad_batch": True, "build_vocabulary": False})
    late = (DUE + dt.timedelta(days=4, hours=1)).isoformat()  # 5 started days: 0.5, capped at 0.25
    grades = gradebook.student_grades("s", report, "", settings, cols, {CHAPTER: late})
    assert (grades.raw, grades.penalty, grades.total, grades.max_points) == (2.5, 0.625, 1.875, 3.5)
    assert [g.late_days for g in grades.grades] == [5, 5]
    assert gradebook._points(grades.total) == "1.875"
    on_time = gradebook.student_grades("s", report, "", settings, cols, {CHAPTER: DUE.isoformat()})
    assert on_time.penalty == 0 and on_time.total == 2.5


def test_points_keep_their_fractions():
    assert [gradebook._points(v) for v in (2.5, 1 / 3, 0.0, -0.0, 1e7, 3.0)] == \
        ["2.5", "0.333333", "0", "0", "10000000", "3"]


def test_submission_times_prefer_the_instructor_file(tmp_path):
    times = tmp_path / "submitted.csv"
    times.write_text("student,chapter,submitted\na,,2026-10-06T10:00:00Z\na,01_text_as_numbers,"
                     "2026-10-05T08:00:00+02:00\nb,,2026-10-07T00:00:00Z\n", encoding="utf-8")
    policy = LatePolicy(due={CHAPTER: DUE}, submitted=read_submitted(times))
    notebook = tmp_path / "a" / "exercises" / f"{CHAPTER}.md"
    notebook.parent.mkdir(parents=True)
    notebook.write_text("", encoding="utf-8")
    assert submission_times("a", tmp_path / "a", [notebook], policy) == {CHAPTER: "2026-10-05T06:00:00+00:00"}
    assert submission_times("b", tmp_path / "b", [notebook], policy) == {CHAPTER: "2026-10-07T00:00:00+00:00"}
    assert submission_times("c", tmp_path / "a", [notebook], policy) == {}  # no file row, no repository
    times.write_text("who,submitted\nx,2026-10-06T10:00:00Z\n", encoding="utf-8")
    with pytest.raises(ValueError, match="must have the columns student, submitted"):
        read_submitted(times)
    with pytest.raises(ValueError, match="with a UTC offset"):
        parse_time("late.due.x", "2026-10-05T23:59:00")


@pytest.mark.parametrize("text, message", [
    ("[late]\npenalty_per_day = 2\n", "late.penalty_per_day must be a fraction"),
    ("[late]\nmax_penalty = -0.1\n", "late.max_penalty must be a fraction"),
    ("[late]\ndue = { 99 = 2026-10-05T23:59:00Z }\n", "chapters must be"),
    ("[late.due]\n01_text_as_numbers = 2026-10-05\n", "late.due.01_text_as_numbers must be a date-time"),
    ("[late.extensions]\nalice = -1\n", "late.extensions.alice must be a number of days"),
    ("[late]\ngrace = 1\n", "unknown key"),
    ("[canvas]\n01_text_as_numbers = \"Text\"\n", "canvas.01_text_as_numbers must be the Canvas column"),
])
def test_the_instructor_file_refuses_a_bad_policy(tmp_path, text, message):
    path = tmp_path / "grading.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        gradebook.load_settings(path)


def test_the_instructor_file_reads_a_policy(tmp_path):
    path = tmp_path / "grading.toml"
    path.write_text('[late]\npenalty_per_day = 0.1\nmax_penalty = 0.3\n[late.due]\n1 = 2026-10-05T23:59:00Z\n'
                    '[late.extensions]\nalice = 2\nbob = { 01 = 1.5 }\n[canvas]\n1 = "Text as numbers (77)"\n',
                    encoding="utf-8")
    settings = gradebook.load_settings(path)
    assert settings.late.due == {CHAPTER: DUE} and settings.late.extensions == {"alice": 2.0, "bob": {CHAPTER: 1.5}}
    assert settings.canvas == {CHAPTER: "Text as numbers (77)"}
    assert LatePolicy.from_json(settings.late.to_json()) == settings.late
    assert gradebook.load_settings(Path(__file__).resolve().parents[1] / "grading.toml").late.due


def test_the_roster_is_checked(tmp_path):
    path = tmp_path / "roster.csv"
    for text, message in (("name\nAda\n", "must have a column student"), ("student,email\na,x\n", "only columns"),
                          ("student\na\na\n", "repeated: a")):
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=message):
            exports.read_roster(path)
    path.write_text("student,name\na,Ada\n", encoding="utf-8")
    assert exports.read_roster(path)[0] == {**dict.fromkeys(exports.ROSTER_COLUMNS, ""), "student": "a", "name": "Ada"}


class _Rows(HTMLParser):
    """The data-* attributes of every element of the report."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[dict[str, str]] = []

    def handle_starttag(self, tag, attrs):
        data = {k[5:]: v for k, v in attrs if k.startswith("data-")}
        if data:
            self.found.append(data)


def _class(tmp_path: Path, reports: dict[str, dict | None], notes: dict[str, str] | None = None) -> Path:
    settings = Settings(chapters=[CHAPTER], tracks=["numpy"], points={"pad_batch": 2})
    records = [merge.StudentRecord(name, name, report, (notes or {}).get(name, "")) for name, report in
               reports.items()]
    recorded = merge.settings_json(settings, None, [])
    merge.write_class(tmp_path, records, settings, recorded, list(reports), None)
    return tmp_path


def test_the_class_report_counts_what_the_gradebook_says(tmp_path):
    reports = {
        "s1": _report({}),
        "s2": _report({"pad_batch": False, "one_hot_batch": False}, message="off by one\nmore"),
        "s3": _report({"pad_batch": False, "build_vocabulary": False}, message="off by one"),
        "s4": _report({"pad_batch": False}, message="wrong dtype"),
        "s6": {"notebooks": [{"path": f"x/{CHAPTER}.md", "chapter": CHAPTER, "exercises": [
            {"id": e, "track": "numpy", "status": "failed", "reason": "unreadable", "message": "not UTF-8"}
            for e in NUMPY]}]},
        "s5": None,
    }
    out = _class(tmp_path, reports, {"s5": "the grader failed (exit status 3)"})
    long_rows = list(csv.DictReader((out / "grades_long.csv").open(encoding="utf-8")))
    page = (out / "report.html").read_text(encoding="utf-8")
    parser = _Rows()
    parser.feed(page)
    by_exercise = {d["exercise"]: d for d in parser.found if "exercise" in d}
    graded = [r for r in long_rows if r["student"] != "s5"]
    for exercise in NUMPY:
        rows = [r for r in graded if r["exercise"] == exercise]
        assert int(by_exercise[exercise]["passed"]) == sum(r["status"] == "passed" for r in rows)
        assert int(by_exercise[exercise]["graded"]) == len(rows) == 5
    assert re.search(r"<td>off by one</td><td>2</td>", page)  # pad_batch: the first line, shared by two students
    assert "not UTF-8" not in page  # an unreadable notebook says nothing of a misconception
    book = list(csv.DictReader((out / "gradebook.csv").open(encoding="utf-8")))
    finals, top = [float(r["final"]) for r in book], float(book[0]["max"])
    assert top == len(NUMPY) + 1  # pad_batch is worth 2
    bins = [d for d in parser.found if "count" in d]
    assert len(bins) == classreport.BINS and sum(int(b["count"]) for b in bins) == len(finals) == 6
    width = top / classreport.BINS
    for total in finals:
        index = min(int(total / width), classreport.BINS - 1)
        assert float(bins[index]["low"]) <= total
    assert int(bins[-1]["count"]) == finals.count(top) == 1 and int(bins[0]["count"]) == finals.count(0.0) == 2
    ungraded = [d["student"] for d in parser.found if "student" in d]
    assert ungraded == ["s5"] and "the grader failed (exit status 3)" in page
    assert "<script" not in page and "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_changes_list_what_a_regrade_changed(tmp_path):
    _class(tmp_path, {"s1": _report({"pad_batch": False, "one_hot_batch": False}), "s2": _report({})})
    assert (tmp_path / "changes.csv").read_text(encoding="utf-8").splitlines() == [",".join(classreport.CHANGES_HEADER)]
    _class(tmp_path, {"s1": _report({"one_hot_batch": False}), "s2": _report({}), "s3": _report({})})
    rows = list(csv.DictReader((tmp_path / "changes.csv").open(encoding="utf-8")))
    assert [(r["student"], r["exercise"], r["status_before"], r["status_after"], r["final_before"],
             r["final_after"]) for r in rows] == [
        ("s1", "pad_batch", "failed", "passed", "0", "2"),
        *[("s3", e, "", "passed", "", "2" if e == "pad_batch" else "1") for e in NUMPY],
    ]


def test_the_roster_and_submission_times_are_never_shipped_to_students(tmp_path):
    (tmp_path / "grading.toml").write_text('[grading]\nroster = "private/roster.csv"\n[late]\n'
                                           'submitted = "private/times.csv"\n', encoding="utf-8")
    assert release.instructor_files(tmp_path) == {"private/roster.csv", "private/times.csv"}
