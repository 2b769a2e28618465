"""Partial credit: a check with named parts (companion.checks.part), the fraction it earns in the gradebook, the
exports and the class report, and the ways of failing that earn nothing."""

from __future__ import annotations

import json

import pytest

from companion.checks import _REGISTRY, CheckFailed, call, exercise, part
from companion.grade import classreport, exports, gradebook
from companion.grade.gradebook import Settings
from companion.grade.steps import _run_checker

CHAPTER = "99_parts_demo"


@pytest.fixture
def three_parts():
    """A checker of three parts, registered for the test only: add, multiply, and a part that needs both."""

    def check_arithmetic(answer) -> None:
        with part("adds"):
            if call(answer, "add", 2, 3) != 5:
                raise CheckFailed("adds: 2 + 3 should be 5")
        with part("multiplies"):
            if call(answer, "mul", 2, 3) != 6:
                raise CheckFailed("multiplies: 2 * 3 should be 6")
        with part("both"):
            assert call(answer, "add", call(answer, "mul", 2, 2), 1) == 5, "both: 2 * 2 + 1 should be 5"

    exercise(CHAPTER, "arithmetic_demo", "adds and multiplies")(check_arithmetic)
    yield _REGISTRY["arithmetic_demo"].checker
    _REGISTRY.pop("arithmetic_demo")


def right(op, a, b):
    return a + b if op == "add" else a * b


def no_multiply(op, a, b):
    return a + b if op == "add" else a + b


def not_implemented(op, a, b):
    raise NotImplementedError


def test_the_first_part_that_fails_is_the_message_and_every_part_is_counted(three_parts):
    assert _run_checker(three_parts, right) == ("ok", "", [])
    reason, message, parts = _run_checker(three_parts, no_multiply)
    assert reason == "wrong"
    assert message == "multiplies: 2 * 3 should be 6"  # as without parts: the first failure
    assert parts == [["adds", True], ["multiplies", False], ["both", True]]  # 2 * 2 happens to equal 2 + 2
    reason, _, parts = _run_checker(three_parts, lambda op, a, b: 0)
    assert parts == [["adds", False], ["multiplies", False], ["both", False]]


def test_failing_other_than_in_a_part_earns_no_parts(three_parts):
    assert _run_checker(three_parts, not_implemented) == (
        "not-implemented", "not implemented yet (replace the `raise NotImplementedError`)", [])

    def outside(answer) -> None:  # a failure after the parts, outside every part
        with part("adds"):
            pass
        raise CheckFailed("outside")

    exercise(CHAPTER, "outside_demo", "fails outside its parts")(outside)
    try:
        assert _run_checker(_REGISTRY["outside_demo"].checker, right) == ("wrong", "outside", [])
    finally:
        _REGISTRY.pop("outside_demo")


def test_part_needs_a_name_and_runs_as_a_plain_block_outside_a_checker():
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        with part(""):
            pass
    with pytest.raises(CheckFailed, match="plain"):
        with part("plain"):
            raise CheckFailed("plain")


def _report(reason: str, parts: list) -> dict:
    return {"notebooks": [{"chapter": CHAPTER, "path": f"{CHAPTER}.md", "exercises": [
        {"id": "arithmetic_demo", "track": "numpy", "status": "failed", "reason": reason, "message": "m",
         "parts": parts}]}]}


@pytest.mark.parametrize("allowed, reason, parts, points", [
    (True, "wrong", [["adds", True], ["multiplies", False], ["both", True]], 2.0),
    (False, "wrong", [["adds", True], ["multiplies", False], ["both", True]], 0.0),  # not allowed: nothing
    (True, "shortcut", [["adds", True], ["multiplies", False], ["both", True]], 0.0),  # only wrong answers
    (True, "wrong", [], 0.0),
    (True, "wrong", [["adds", "yes"], ["both", 1]], 0.0),  # only a real True counts
])
def test_the_gradebook_awards_the_fraction_of_parts_passed(allowed, reason, parts, points):
    settings = Settings(points={"arithmetic_demo": 3.0}, partial_credit=allowed)
    cols = [(CHAPTER, "arithmetic_demo", "numpy")]
    student = gradebook.student_grades("ann", _report(reason, parts), "", settings, cols)
    (grade,) = student.grades
    assert grade.status == "failed" and grade.points == pytest.approx(points)
    assert ("(2 of 3 parts)" in gradebook.feedback_markdown(student)) == (points > 0)


def test_fractions_reach_the_gradebook_the_exports_and_the_class_report(tmp_path):
    settings = Settings(partial_credit=True)
    cols = [(CHAPTER, "arithmetic_demo", "numpy")]
    report = _report("wrong", [["adds", True], ["multiplies", False], ["both", False]])
    students = [gradebook.student_grades("ann", report, "", settings, cols)]
    gradebook.write_gradebook(tmp_path / "gradebook.csv", students, cols)
    assert "ann,0.333333,0.333333,0,0.333333,1," in (tmp_path / "gradebook.csv").read_text(encoding="utf-8")
    results = exports.gradescope_results(students[0], set())
    assert results["score"] == pytest.approx(0.333333) and results["tests"][0]["score"] == pytest.approx(0.333333)
    json.dumps(results)
    page = classreport.report_html(students)
    assert 'data-exercise="arithmetic_demo" data-passed="0" data-graded="1" data-partial="1"' in page


def test_the_instructor_file_switches_partial_credit_on(tmp_path):
    path = tmp_path / "grading.toml"
    path.write_text("[grading]\npartial_credit = true\n", encoding="utf-8")
    assert gradebook.load_settings(path).partial_credit is True
    path.write_text("[grading]\npartial_credit = \"yes\"\n", encoding="utf-8")
    with pytest.raises(ValueError, match="partial_credit must be true or false"):
        gradebook.load_settings(path)
    assert Settings().partial_credit is False


def test_the_graded_answers_of_chapters_1_and_4_have_a_part_per_answer():
    from companion.checks import registry

    checks = registry()
    right_answers = {"cross_mask_from": "source", "lowest_float16": -65504.0,
                     "minus_1e9_in_float16": float("-inf"), "weight_on_zero_filled_key": 0.25}
    assert _run_checker(checks["masking_answers"].checker, lambda: right_answers)[2] == []
    two_wrong = {**right_answers, "cross_mask_from": "target", "lowest_float16": 65504.0}
    reason, message, parts = _run_checker(checks["masking_answers"].checker, lambda: two_wrong)
    assert reason == "wrong" and message.startswith("cross_mask_from")
    assert parts == [["cross_mask_from", False], ["lowest_float16", False], ["minus_1e9_in_float16", True],
                     ["weight_on_zero_filled_key", True]]
    _, _, parts = _run_checker(checks["one_hot_answers"].checker,
                               lambda: {"positions_needed": 11, "id_without_position": 11})
    assert parts == [["positions_needed", False], ["id_without_position", True]]
    _, _, parts = _run_checker(checks["one_hot_answers"].checker, lambda: [12, 11])  # not a dict: outside the parts
    assert parts == []
