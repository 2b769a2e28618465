"""Grading a class: python -m companion.grade class.

One small synthetic class (chapter 1, numpy track, so each student's grading takes a few seconds) is graded once
for the module; the students cover every kind the class grader must survive: a right answer, typical mistakes,
an answer that loops forever, a notebook that is not UTF-8, an .ipynb that is not JSON, a student with no notebook.
"""

from __future__ import annotations

import csv
import json
import random
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from companion.checks import exercises_for
from companion.grade import classroom, classworker, gradebook
from companion.grade.gradebook import Settings
from companion.instructor import synthetic

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "01_text_as_numbers"
KINDS = ("solution", "mutant", "endless", "not_utf8", "not_json", "not_notebook", "empty")
SETTINGS = dict(chapters=[CHAPTER], tracks=["numpy"], timeout=3.0)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    submissions = root / "submissions"
    manifest = synthetic.build_class(submissions, students=len(KINDS), chapters=[CHAPTER], kinds=KINDS)
    # A folder name that a spreadsheet would read as a formula.
    (submissions / "student007-empty").rename(submissions / "=1+1")
    manifest["=1+1"] = manifest.pop("student007-empty")
    out = root / "out"
    grades, outcomes = classroom.grade_class(submissions, out, Settings(**SETTINGS), jobs=2, progress=False)
    return submissions, out, manifest, grades, outcomes


def _rows(path: Path) -> list[dict]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def test_every_student_gets_a_row_with_the_expected_points(graded):
    submissions, out, manifest, grades, outcomes = graded
    numpy_ids = [e.id for e in exercises_for(CHAPTER) if e.track == "numpy"]
    rows = {r["student"].lstrip("'"): r for r in _rows(out / "gradebook.csv")}
    assert sorted(rows) == sorted(manifest)
    header = list(_rows(out / "gradebook.csv")[0])
    assert header == ["student", *numpy_ids, "raw", "penalty", "final", "max", "note"]
    for student, info in manifest.items():
        earned = {e: float(rows[student][e]) for e in numpy_ids}
        expected = {e: 1.0 if info["expected"][e] else 0.0 for e in numpy_ids}
        assert earned == expected, student
        assert float(rows[student]["raw"]) == float(rows[student]["final"]) == sum(expected.values())
        assert rows[student]["penalty"] == "0"
        assert float(rows[student]["max"]) == len(numpy_ids)
    assert rows["student001-solution"]["note"] == ""
    assert "did not finish within 3 s" in rows["student003-endless"]["note"]
    assert "not UTF-8" in rows["student004-not_utf8"]["note"]
    assert "not valid JSON" in rows["student005-not_json"]["note"]
    assert "no answer is defined" in rows["student006-not_notebook"]["note"]
    assert "no notebook of 01_text_as_numbers" in rows["=1+1"]["note"]
    assert not any(o.cached for o in outcomes)


def test_a_folder_name_is_never_a_spreadsheet_formula(graded):
    _, out, *_ = graded
    names = [r["student"] for r in _rows(out / "gradebook.csv")]
    assert "'=1+1" in names and "=1+1" not in names


def test_long_table_feedback_and_junit_carry_the_same_messages(graded):
    _, out, manifest, grades, _ = graded
    numpy_ids = [e.id for e in exercises_for(CHAPTER) if e.track == "numpy"]
    long_rows = _rows(out / "grades_long.csv")
    assert len(long_rows) == len(manifest) * len(numpy_ids)
    wrong = [e for e in numpy_ids if not manifest["student002-mutant"]["expected"][e]]
    mutant = [r for r in long_rows if r["student"] == "student002-mutant" and r["status"] == "failed"]
    assert wrong and [r["exercise"] for r in mutant] == wrong
    assert all("Likely:" in r["message"] for r in mutant)  # the checker named the typical mistake
    feedback = (out / "feedback" / "student002-mutant.md").read_text(encoding="utf-8")
    assert f"**{len(numpy_ids) - len(wrong)} of {len(numpy_ids)} points.**" in feedback
    for row in mutant:
        assert gradebook._md(row["message"]) in feedback
    assert (out / "feedback" / "_1_1.md").exists()  # the formula-like name, made safe for a file name
    suites = ET.parse(out / "junit.xml").getroot()
    ungraded = sum(bool(g.note) for g in grades)  # a student with no notebook: one error testcase says why
    assert ungraded == 1 and int(suites.get("errors")) == ungraded
    assert int(suites.get("tests")) == len(manifest) * len(numpy_ids) + ungraded
    assert int(suites.get("failures")) == sum(r["status"] == "failed" for r in long_rows)
    suite = suites.find("testsuite[@name='student002-mutant']")
    assert [c.find("failure").text for c in suite.iter("testcase") if c.find("failure") is not None] == \
        [r["message"] for r in mutant]


def test_a_rerun_grades_only_what_changed(graded, tmp_path):
    submissions, out, manifest, _, _ = graded
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    # Points are applied after grading: new points, nobody graded again.
    settings = Settings(**SETTINGS, points={"pad_batch": 5})
    grades, outcomes = classroom.grade_class(submissions, copy, settings, jobs=2, progress=False)
    assert all(o.cached for o in outcomes)
    by_name = {g.student: g for g in grades}
    numpy_count = sum(e.track == "numpy" for e in exercises_for(CHAPTER))
    assert by_name["student001-solution"].total == numpy_count - 1 + 5 == by_name["student001-solution"].max_points
    # One student hands in again: only that student is graded again.
    changed = tmp_path / "submissions"
    shutil.copytree(submissions, changed)
    (changed / "student001-solution" / "exercises" / f"{CHAPTER}.md").write_text(
        (ROOT / "exercises" / f"{CHAPTER}.md").read_text(encoding="utf-8"), encoding="utf-8")
    grades, outcomes = classroom.grade_class(changed, copy, settings, jobs=2, progress=False)
    regraded = [o.student for o in outcomes if not o.cached]
    assert regraded == ["student001-solution"]
    assert {g.student: g.total for g in grades}["student001-solution"] == 0
    # Another time limit is another grading: everyone with notebooks is graded again.
    assert classroom.student_key([], Settings(**SETTINGS), "code", None) != \
        classroom.student_key([], Settings(**{**SETTINGS, "timeout": 4.0}), "code", None)


def test_the_command_line_reads_the_instructor_file(graded, tmp_path):
    submissions, out, manifest, _, _ = graded
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    config = tmp_path / "grading.toml"
    config.write_text('[grading]\nchapters = ["01_text_as_numbers"]\ntracks = ["numpy"]\ntimeout = 3\n\n'
                      '[points]\nbuild_vocabulary = 2\n', encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "companion.grade", "class", str(submissions), "--out", str(copy),
                           "--config", str(config), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{len(manifest)} students ({len(manifest)} unchanged since the last run)" in done.stdout
    full = sum(e.track == "numpy" for e in exercises_for(CHAPTER)) - 1 + 2
    assert re.search(rf"^student001-solution +{full} / {full} *$", done.stdout, re.M), done.stdout
    bad = subprocess.run([sys.executable, "-m", "companion.grade", "class", str(submissions), "--out", str(copy),
                          "--track", "fortran"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "tracks must be among" in bad.stderr


@pytest.mark.parametrize("script, note", [
    # A grader that never ends, with a child of its own: both are stopped.
    ("import subprocess, time; subprocess.Popen(['sleep', '61.25']); time.sleep(60)", "did not finish within 1 s"),
    ("raise SystemExit(3)", "the grader failed (exit status 3; it wrote no report)"),
    ("import sys; open(sys.argv[1], 'w').write('[1, 2')", "its report is unusable"),
])
def test_a_grader_that_hangs_or_fails_costs_one_row_and_is_tried_again(tmp_path, monkeypatch, script, note):
    submissions = tmp_path / "submissions"
    synthetic.build_class(submissions, students=2, chapters=[CHAPTER], kinds=("solution", "empty"))
    monkeypatch.setattr(classroom, "grader_command",
                        lambda files, work, *_: [sys.executable, "-c", script, str(work / "report.json")])
    settings = Settings(**SETTINGS, student_timeout=1.0)
    grades, outcomes = classroom.grade_class(submissions, tmp_path / "out", settings, jobs=2, progress=False)
    assert grades[0].total == 0 and note in grades[0].summary
    assert "no notebook" in grades[1].summary
    assert not (tmp_path / "out" / "students" / "student001-solution" / "stamp.json").exists()  # tried again next time
    left = subprocess.run(["pgrep", "-f", "sleep 61.25"], capture_output=True, text=True)
    assert left.stdout == ""


def test_the_example_instructor_file_and_its_errors(tmp_path):
    example = gradebook.load_settings(ROOT / "grading.toml")
    assert example.points_for("pad_batch") >= 0 and example.tracks[0] == "numpy"
    cases = {
        "[grading]\nchapter = [1]\n": "unknown key",
        "[grading]\nchapters = [99]\n": "chapters must be",
        "[grading]\ntracks = [\"fortran\"]\n": "tracks must be among",
        "[grading]\ntimeout = -1\n": "grading.timeout must be a positive number",
        "[points]\npad_batch = \"two\"\n": "points.pad_batch must be a number",
        "[points]\nno_such_exercise = 1\n": "points.no_such_exercise: no exercise",
        "[grade]\n": "unknown table",
        "[grading\n": "not valid TOML",
    }
    for text, message in cases.items():
        path = tmp_path / "grading.toml"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=message):
            gradebook.load_settings(path)
    assert gradebook.resolve_chapters(["2", "03_multihead_attention"]) == ["02_attention", "03_multihead_attention"]


def test_new_grader_options_are_passed_only_when_asked_for(tmp_path):
    plain = classroom.grader_command([Path("a.md")], tmp_path, Settings(), None)
    assert not {"--chapters", "--extra-checks", "--memory"} & set(plain)
    extra = tmp_path / "extra.py"
    extra.write_text("", encoding="utf-8")
    full = classroom.grader_command([Path("a.md")], tmp_path, Settings(extra_checks=extra, memory="2G"), "02_attention")
    assert full[full.index("--chapters") + 1] == "02_attention"
    assert full[full.index("--extra-checks") + 1] == str(extra) and full[full.index("--memory") + 1] == "2G"


def test_columns_follow_the_course_and_add_exercises_only_a_report_names():
    report = {"notebooks": [{"path": "x/02_attention.md", "chapter": "02_attention", "exercises": [
        {"id": "hidden_check", "track": "numpy", "status": "passed"},
        {"id": "attention_keras", "track": "keras", "status": "skipped", "reason": "track"}]}]}
    settings = Settings(chapters=["02_attention"], tracks=["numpy", "torch"])
    cols = gradebook.columns(settings, [report, None])
    ids = [c[1] for c in cols]
    assert ids[-1] == "hidden_check" and "attention_keras" not in ids and "attention_torch" in ids
    grades = gradebook.student_grades("a", report, "", settings, cols)
    assert grades.total == 1 and grades.max_points == len(ids)
    missing = gradebook.student_grades("b", None, "", settings, cols)
    assert missing.summary == "missing notebook: 02_attention"


def test_the_synthetic_builder_refuses_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="chapters must be among"):
        synthetic.build_class(tmp_path, students=1, chapters=["99_nothing"])
    with pytest.raises(ValueError, match="students must be at least 1"):
        synthetic.build_class(tmp_path, students=0)
    with pytest.raises(ValueError, match="kind must be one of"):
        synthetic.build_student(tmp_path, "genius", [CHAPTER], random.Random(0))
    assert json.loads(json.dumps(synthetic.mutants_by_exercise([CHAPTER])))["pad_batch"]


def test_due_notebooks_are_chosen_by_chapter(tmp_path):
    for name in ("01_text_as_numbers.md", "02_attention.md", "02_attention.ipynb", "08_hidden.md", "notes.txt"):
        (tmp_path / name).write_text("", encoding="utf-8")
    chosen = classroom.notebooks_to_grade(tmp_path, Settings(chapters=["02_attention"]))
    assert [p.name for p in chosen] in (["02_attention.md"], ["02_attention.ipynb"])  # the newer of the two
    every = classroom.notebooks_to_grade(tmp_path, Settings())
    assert {p.stem for p in every} == {"01_text_as_numbers", "02_attention"}
    extra = tmp_path / "extra.py"
    extra.write_text("", encoding="utf-8")
    with_extra = classroom.notebooks_to_grade(tmp_path, Settings(extra_checks=extra))
    assert "08_hidden.md" in {p.name for p in with_extra}  # extra checks may add chapters: every notebook


def test_graders_forked_by_a_worker_are_stopped_alone(tmp_path, monkeypatch):
    """With the standard command, each job slot's worker forks the graders; one stopped at its time limit costs
    its own row, the worker forks the next, and nothing of any of them is left running. (The endless answer takes
    the 3 s step limit, so its grader always outlasts the 2 s limit of a student.)"""
    submissions = tmp_path / "submissions"
    synthetic.build_class(submissions, students=2, chapters=[CHAPTER], kinds=("endless", "endless"))
    forked: list[int] = []
    start = classworker.Worker.start

    def recording(self, argv, log):
        grader = start(self, argv, log)
        forked.extend([grader.pid, self.process.pid])
        return grader

    monkeypatch.setattr(classworker.Worker, "start", recording)
    settings = Settings(**SETTINGS, student_timeout=2.0)
    grades, _ = classroom.grade_class(submissions, tmp_path / "out", settings, jobs=1, progress=False)
    assert len(set(forked)) == 3  # one worker, two graders
    assert all("did not finish within 2 s" in g.summary for g in grades), [g.summary for g in grades]
    for pid in forked:
        assert not Path(f"/proc/{pid}").exists(), pid
    left = subprocess.run(["pgrep", "-f", str(submissions)], capture_output=True, text=True)
    assert left.stdout == ""


def test_students_graded_without_the_shared_sandbox_are_counted_and_told(tmp_path, monkeypatch, capsys):
    """When a worker's shared zygote cannot start, its graders start sandboxes of their own: as isolated, slower.
    The class grader says how many students that was instead of running slowly in silence."""
    submissions = tmp_path / "submissions"
    synthetic.build_class(submissions, students=2, chapters=[CHAPTER], kinds=("solution", "solution"))
    start = classworker.Worker.start

    def without_shared_zygote(self, argv, log):
        grader = start(self, argv, log)
        assert grader.shared in (True, None)  # what the worker said: shared where the sandbox works, else not asked
        grader.shared = False
        return grader

    monkeypatch.setattr(classworker.Worker, "start", without_shared_zygote)
    code = classroom.main([str(submissions), "--out", str(tmp_path / "out"), "--chapters", CHAPTER, "--track",
                           "numpy", "--jobs", "1", "--no-progress"])
    assert code == 0 and classroom._SLOTS.unshared == 2
    assert "note: 2 students were graded without the shared sandbox" in capsys.readouterr().err
