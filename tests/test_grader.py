"""The grader end to end: every solution passes through the command line, every stub fails, and broken or tampered
notebooks (tests/grader_fixtures/) get a clear verdict without crashing the grader.

Grading is slow to start (each notebook's student process imports torch and TensorFlow), so each module-scoped
fixture grades many notebooks in one run and several tests read its report. The tampering catalogue is in
tests/test_grader_tampering.py.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import jupytext
import pytest

from companion.checks import CheckFailed, exercises_for, registry, run_check
from companion.grade import FAILED, PASSED, SKIPPED, grade, write_junit
from companion.grade.__main__ import main, parser
from companion.instructor.exercises import find_the_bug_symbols
from companion.notebook_code import code_cells, definitions

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "grader_fixtures"
SOLUTIONS = sorted(p for p in (ROOT / "solutions").glob("*.md") if exercises_for(p.stem))
STUBS = sorted(p for p in (ROOT / "exercises").glob("*.md") if exercises_for(p.stem))
CATALOGUE_TIMEOUT = 2.0
#: The requirement: grading every solution of every chapter takes under two minutes on the course's 2-core CPU.
SOLUTIONS_BUDGET_SECONDS = 120.0


# ---------------------------------------------------------------------------------------------------------------
# Every solution passes, through the command line
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def solutions_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("solutions_report")
    junit, report = folder / "grade.xml", folder / "grade.json"
    stdout = io.StringIO()
    start = time.perf_counter()
    with redirect_stdout(stdout):
        code = main([str(p) for p in SOLUTIONS] + ["--junit", str(junit), "--json", str(report)])
    seconds = time.perf_counter() - start
    print(f"\ngraded {len(SOLUTIONS)} solution notebooks in {seconds:.1f} s")
    return SimpleNamespace(code=code, stdout=stdout.getvalue(), junit=ET.parse(junit),
                           data=json.loads(report.read_text(encoding="utf-8")), seconds=seconds)


def test_every_solution_passes_through_the_cli(solutions_run):
    assert SOLUTIONS, "no solution notebook with registered exercises"
    assert solutions_run.code == 0, solutions_run.stdout
    assert solutions_run.stdout.rstrip().endswith(": OK"), solutions_run.stdout
    assert solutions_run.seconds < SOLUTIONS_BUDGET_SECONDS


def test_junit_report_has_one_passing_testcase_per_exercise(solutions_run):
    root = solutions_run.junit.getroot()
    suites = root.findall("testsuite")
    assert [s.get("file") for s in suites] == [str(p) for p in SOLUTIONS]
    for suite, path in zip(suites, SOLUTIONS, strict=True):
        expected = [e.id for e in exercises_for(path.stem)]
        assert [case.get("name") for case in suite.findall("testcase")] == expected
        assert suite.get("tests") == str(len(expected)) and suite.get("failures") == "0"
        assert not suite.findall(".//failure") and not suite.findall(".//error") and not suite.findall(".//skipped")
    total = sum(len(exercises_for(p.stem)) for p in SOLUTIONS)
    assert root.get("tests") == str(total) and root.get("failures") == "0"


def test_json_report_matches(solutions_run):
    data = solutions_run.data
    total = sum(len(exercises_for(p.stem)) for p in SOLUTIONS)
    assert data["version"] == 1 and data["ok"] is True
    assert (data["passed"], data["failed"], data["skipped"]) == (total, 0, 0)
    for notebook, path in zip(data["notebooks"], SOLUTIONS, strict=True):
        assert notebook["chapter"] == path.stem and notebook["error"] == ""
        assert [e["id"] for e in notebook["exercises"]] == [e.id for e in exercises_for(path.stem)]
        assert all(e["status"] == PASSED and e["reason"] == "ok" for e in notebook["exercises"])


# ---------------------------------------------------------------------------------------------------------------
# Every untouched stub fails every exercise
# ---------------------------------------------------------------------------------------------------------------


def test_every_stub_fails_every_exercise():
    report = grade(STUBS)
    assert not report.ok
    for notebook, path in zip(report.notebooks, STUBS, strict=True):
        assert [r.id for r in notebook.exercises] == [e.id for e in exercises_for(path.stem)]
        solution = (ROOT / "solutions" / path.name).read_text(encoding="utf-8")
        buggy = find_the_bug_symbols(solution)
        for result in notebook.exercises:
            symbol = registry()[result.id].symbol
            if symbol in buggy:  # a find-the-bug stub runs, and its check names the bug
                assert (result.status, result.reason) == (FAILED, "wrong"), (path.name, result)
            else:
                assert (result.status, result.reason) == (FAILED, "not-implemented"), (path.name, result)
                assert "not implemented yet" in result.message


def test_track_option_grades_numpy_and_the_chosen_track():
    solution = ROOT / "solutions" / "01_text_as_numbers.md"
    report = grade([solution], tracks=["torch"])
    tracks = {r.id: (r.track, r.status) for r in report.notebooks[0].exercises}
    assert {t: s for t, s in tracks.values()} == {"numpy": PASSED, "torch": PASSED, "keras": SKIPPED}
    assert report.ok
    assert parser().parse_args(["x.md", "--track", "torch,keras"]).track == ["torch", "keras"]
    with pytest.raises(SystemExit), redirect_stderr(io.StringIO()) as error:
        parser().parse_args(["x.md", "--track", "jax"])
    assert "choose among numpy,torch,keras" in error.getvalue()


# ---------------------------------------------------------------------------------------------------------------
# Robustness catalogue: broken and tampered notebooks
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory):
    ipynb = tmp_path_factory.mktemp("ipynb") / "01_text_as_numbers.ipynb"
    jupytext.write(jupytext.read(ROOT / "solutions" / "01_text_as_numbers.md"), ipynb)
    folders = sorted(p for p in FIXTURES.iterdir() if p.is_dir() and not p.name.startswith("__"))
    folders = [f for f in folders if not f.name.startswith(("tamper_", "shortcut_"))]
    report = grade(folders + [ipynb], timeout=CATALOGUE_TIMEOUT, tracks=["numpy"], chapters=["01"])
    junit = tmp_path_factory.mktemp("catalogue_report") / "grade.xml"
    write_junit(report, junit)
    by_case = {folder.name: notebook for folder, notebook in zip(folders, report.notebooks, strict=False)}
    by_case["ipynb"] = report.notebooks[-1]
    assert len(report.notebooks) == len(folders) + 1
    return SimpleNamespace(report=report, cases=by_case, junit=ET.parse(junit))


# case -> {exercise: (status, reason, regular expression the message must match)}; problems: notebook messages.
EXPECTED = {
    "syntax_error": {
        "build_vocabulary": (PASSED, "ok", ""),
        "pad_batch": (FAILED, "missing", r"^`pad_batch` could not be loaded: code cell 3 .*syntax error on line 2"),
        "one_hot_batch": (PASSED, "ok", ""),
    },
    "infinite_loop": {
        "build_vocabulary": (PASSED, "ok", ""),
        "pad_batch": (FAILED, "timeout", r"did not finish within 2 s: is there an endless loop in `pad_batch`"),
        "one_hot_batch": (PASSED, "ok", ""),
    },
    "import_error": {
        "build_vocabulary": (PASSED, "ok", ""),
        "pad_batch": (FAILED, "wrong", r"raised NameError: .* \(at code cell 3 .*line 5\).*ModuleNotFoundError: No "
                                        "module named 'no_such_package_for"),
        "one_hot_batch": (FAILED, "missing", r"^`one_hot_batch` could not be loaded: code cell 4 .*ZeroDivisionError"),
    },
    "missing_function": {
        "build_vocabulary": (PASSED, "ok", ""),
        "pad_batch": (FAILED, "missing", r"^define `pad_batch`: .*inside another block"),
        "one_hot_batch": (FAILED, "missing", r"^define `one_hot_batch`: .*top-level statement"),
    },
    "wrong_shape_dtype": {
        "build_vocabulary": (PASSED, "ok", ""),
        "pad_batch": (FAILED, "wrong", r"INTEGER array; got dtype float64"),
        "one_hot_batch": (FAILED, "wrong", r"should have shape \(3, 5, 12\); got \(3, 5, 13\)"),
    },
    "nan_output": {
        "pad_batch": (PASSED, "ok", ""),
        "one_hot_batch": (FAILED, "wrong", r"contains NaN or infinity"),
    },
    "print_flood": {name: (PASSED, "ok", "") for name in ("build_vocabulary", "pad_batch", "one_hot_batch")},
    "deleted_checks": {name: (PASSED, "ok", "") for name in ("build_vocabulary", "pad_batch", "one_hot_batch")},
    "redefined_check": {
        "build_vocabulary": (FAILED, "wrong", r"Likely: the text says: ids start at 1; 0 stays free for PAD"),
        "pad_batch": (FAILED, "wrong", r"Likely: the text says: short sequences are filled with pad_id on the RIGHT"),
    },
    "monkeypatched_companion": {
        "build_vocabulary": (FAILED, "wrong", r"Likely: the text says: ids start at 1"),
        "pad_batch": (FAILED, "missing", r"could not be loaded: .*NameError: name 'ch01' is not defined"),
        "one_hot_batch": (FAILED, "wrong", r"differs from the expected values"),
    },
    "fake_equality": {
        "build_vocabulary": (FAILED, "wrong", r"expected plain values .*got Anything"),
        "pad_batch": (FAILED, "wrong", r"expected an array of numbers"),
        "one_hot_batch": (PASSED, "ok", ""),
    },
    "crash": {
        "build_vocabulary": (PASSED, "ok", ""),
        "pad_batch": (FAILED, "crash", r"student's process died while `pad_batch` was checked \(exit code 3\)"),
        "one_hot_batch": (FAILED, "wrong", r"raised SystemExit: bye \(at code cell 4 .*line 2\)"),
    },
    "not_json": {name: (FAILED, "unreadable", r"not valid JSON \(.* on line 6, column 1\)")
                 for name in ("build_vocabulary", "pad_batch", "one_hot_batch")},
    "not_utf8": {name: (FAILED, "unreadable", r"not UTF-8 text \(byte 0xe9 on line 15\)")
                 for name in ("build_vocabulary", "pad_batch", "one_hot_batch")},
    "ipynb": {name: (PASSED, "ok", "") for name in ("build_vocabulary", "pad_batch", "one_hot_batch")},
}
EXPECTED_PROBLEMS = {
    "syntax_error": [r"code cell 3 \(`def pad_batch.*syntax error on line 2.*the cell was skipped"],
    "infinite_loop": [r"code cell 4 \(`class Stuck:`\): loading its definitions did not finish within 2 s"],
    "import_error": [r"code cell 3 .*line 1: ModuleNotFoundError", r"code cell 4 .*line 1: ZeroDivisionError"],
    "monkeypatched_companion": [
        r"code cell 1 .*line 4: ModuleNotFoundError: No module named 'companion.checks.ch01'",
        r"code cell 4 \(`class Sneaky:`\): line 2: NameError",
        r"code cell 5 .*line 1: NameError",
        r"code cell 6 .*line 2: NameError",
    ],
    "unknown_chapter": [r"not graded: no exercises are registered for chapter '99_not_a_chapter'"],
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_catalogue_verdicts(catalogue, case):
    notebook = catalogue.cases[case]
    for exercise_id, (status, reason, pattern) in EXPECTED[case].items():
        result = notebook.result(exercise_id)
        assert (result.status, result.reason) == (status, reason), result
        assert re.search(pattern, result.message), result.message
    # The torch and keras exercises were not selected: skipped, not failed.
    assert all(r.status == SKIPPED for r in notebook.exercises if r.track != "numpy")
    problems = EXPECTED_PROBLEMS.get(case, [])
    assert len(notebook.problems) == len(problems), notebook.problems
    for pattern, problem in zip(problems, notebook.problems, strict=True):
        assert re.search(pattern, problem), problem


def test_catalogue_notebooks_that_cannot_be_graded(catalogue):
    for case in ("not_json", "not_utf8"):
        assert catalogue.cases[case].error.startswith("cannot grade this notebook: the file is not")
    unknown = catalogue.cases["unknown_chapter"]
    assert unknown.exercises == [] and unknown.error == ""  # found in a folder: a note, not an error
    assert re.search(EXPECTED_PROBLEMS["unknown_chapter"][0], unknown.problems[0])
    assert set(catalogue.cases) == set(EXPECTED) | {"unknown_chapter"}, "a fixture without expectations"
    assert catalogue.report.sandbox in ("on", "off") or catalogue.report.sandbox.startswith("off (")
    assert not catalogue.report.ok


def test_printed_output_is_capped(catalogue):
    result = catalogue.cases["print_flood"].result("build_vocabulary")
    assert result.output_chars >= 2_000_000 * 3  # three calls of two megabytes
    assert result.output == "x" * 4000
    assert len(json.dumps(catalogue.report.to_dict())) < 200_000


def test_catalogue_junit_is_valid(catalogue):
    root = catalogue.junit.getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == sum(len(n.exercises) for n in catalogue.report.notebooks)
    failures = root.findall(".//failure")
    assert len(failures) == catalogue.report.count(FAILED) == int(root.get("failures"))
    assert all(f.get("message") and f.text for f in failures)
    assert int(root.get("skipped")) == catalogue.report.count(SKIPPED)


def test_cli_exit_status_and_no_traceback():
    command = [sys.executable, "-m", "companion.grade", str(FIXTURES / "not_utf8"), "--track", "numpy", "--chapters",
               "01"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not UTF-8 text" in done.stdout and "Traceback" not in done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("FAILED")
    with pytest.raises(SystemExit) as usage, redirect_stderr(io.StringIO()):
        parser().parse_args(["x.md", "--timeout", "0"])
    assert usage.value.code == 2


def test_without_the_sandbox_the_verdicts_are_the_same(catalogue):
    """Where bubblewrap cannot start (macOS, no user namespaces), the student's process runs without it."""
    report = grade([FIXTURES / "redefined_check"], tracks=["numpy"], sandbox="off", chapters=["01"])
    assert report.sandbox.startswith("off")
    unboxed = [(r.id, r.status, r.reason, r.message) for r in report.notebooks[0].exercises]
    boxed = [(r.id, r.status, r.reason, r.message) for r in catalogue.cases["redefined_check"].exercises]
    assert unboxed == boxed


# ---------------------------------------------------------------------------------------------------------------
# Mutation catalogue of chapter 1, through the grader: the same messages as the checks in process
# ---------------------------------------------------------------------------------------------------------------

MUTANTS = [
    ("build_vocabulary", "start_at_zero", """\
    ids = {}
    for sentence in sentences:
        for word in sentence.split():
            ids.setdefault(word, len(ids))
    return ids
""", "0 stays free for PAD"),
    ("pad_batch", "pad_left", """\
    rows = [[pad_id] * (length - len(ids[:length])) + list(ids[:length]) for ids in batch]
    return np.array(rows, dtype=np.int64)
""", "yours went on the left"),
    ("pad_batch", "keep_end", """\
    rows = [list(ids[-length:]) + [pad_id] * (length - len(ids[-length:])) for ids in batch]
    return np.array(rows, dtype=np.int64)
""", "yours kept the end"),
    ("one_hot_batch", "depth_short", """\
    return np.eye(num_words, dtype=np.float32)[ids]
""", "one position short"),
    ("embed_torch", "unscaled", """\
    return torch.nn.functional.one_hot(ids.long(), table.shape[0]).to(table.dtype) @ table
""", "as the Transformer does; the factor is missing"),
]
_BLOCK = r"(def {symbol}\(.*?\n[ \t]*### BEGIN SOLUTION[^\n]*\n).*?(^[ \t]*### END SOLUTION)"


def _notebooks_of_mutants() -> list[list[tuple]]:
    """Group the mutants so that no notebook holds two mutants of the same exercise (fewer notebooks to grade)."""
    groups: list[list[tuple]] = []
    for mutant in MUTANTS:
        group = next((g for g in groups if all(m[0] != mutant[0] for m in g)), None)
        if group is None:
            groups.append(group := [])
        group.append(mutant)
    return groups


@pytest.fixture(scope="module")
def mutants(tmp_path_factory):
    solution = (ROOT / "solutions" / "01_text_as_numbers.md").read_text(encoding="utf-8")
    paths, where = [], {}
    for group in _notebooks_of_mutants():
        text = solution
        for symbol, _, body, _ in group:
            pattern = re.compile(_BLOCK.format(symbol=symbol), re.S | re.M)
            text, count = pattern.subn(lambda m, body=body: m[1] + body + m[2], text)
            assert count == 1, f"no solution block for {symbol}"
        path = tmp_path_factory.mktemp("mutants") / "01_text_as_numbers.md"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
        where.update({mutant[1]: path for mutant in group})
    report = grade(paths)
    notebooks = dict(zip(paths, report.notebooks, strict=True))
    return {name: (path, notebooks[path]) for name, path in where.items()}


def _in_process(path: Path, symbol: str):
    """The mutant loaded in this process: the notebook's first cell (imports) and the cell that defines it.

    Only for the NumPy exercises: importing torch here would cost this file seconds, and the in-process messages
    of the framework exercises are tested in tests/test_exercises.py.
    """
    cells = code_cells(path)
    namespace: dict = {}
    for cell in [cells[0]] + [c for c in cells if f"def {symbol}(" in c]:
        exec(definitions(cell)[0], namespace)
    return namespace[symbol]


@pytest.mark.parametrize("symbol, name, body, message", MUTANTS, ids=[m[1] for m in MUTANTS])
def test_mutants_get_the_same_message_through_the_grader(mutants, symbol, name, body, message):
    path, notebook = mutants[name]
    result = notebook.result(symbol)
    assert (result.status, result.reason) == (FAILED, "wrong"), result
    assert re.search(message, result.message), result.message
    if result.track == "numpy":
        with pytest.raises(CheckFailed) as in_process:
            run_check(symbol, _in_process(path, symbol))
        assert str(in_process.value) == f"{symbol}: {result.message}"
    mutated = {m[0] for m in MUTANTS if mutants[m[1]][0] == path}
    assert all(r.status == PASSED for r in notebook.exercises if r.id not in mutated), notebook.exercises


# ---------------------------------------------------------------------------------------------------------------
# Pieces the grader relies on
# ---------------------------------------------------------------------------------------------------------------


def test_only_definitions_and_literal_constants_are_kept():
    source = "import os\nD_MODEL = 8\nA = B = (1, -2.5, 'x')\nZ = make()\nobj.attr = 1\nprint(D_MODEL)\ndef f(): pass\n"
    kept, problems = definitions(source)
    assert problems == []
    lines = [line for line in kept.splitlines() if line]
    assert lines == ["import os", "D_MODEL = 8", "A = B = (1, -2.5, 'x')", "def f():", "    pass"]
    assert definitions("def f(:\n")[1] == ["syntax error on line 1: invalid syntax"]


def test_a_chapter_whose_checks_do_not_import_is_left_out(tmp_path, monkeypatch):
    import companion.checks as checks

    (tmp_path / "ch98.py").write_text("this is not python(\n", encoding="utf-8")
    monkeypatch.setattr(checks, "__path__", [*checks.__path__, str(tmp_path)])
    try:
        assert "build_vocabulary" in checks.registry()
        assert checks.import_errors()["companion.checks.ch98"].startswith("SyntaxError")
        with pytest.raises(KeyError, match="ch98 failed to import"):
            run_check("no_such_exercise", len)
    finally:
        checks._IMPORT_ERRORS.pop("companion.checks.ch98", None)


# ---------------------------------------------------------------------------------------------------------------
# Missing work
# ---------------------------------------------------------------------------------------------------------------


def test_renamed_or_missing_notebooks_count_as_missing_work(tmp_path):
    """A folder of stubs renamed: nothing is graded, every chapter is missing, and the exit status says so."""
    for path in STUBS:
        (tmp_path / f"renamed_{path.name}").write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    report_path = tmp_path / "grade.json"
    command = [sys.executable, "-m", "companion.grade", str(tmp_path), "--json", str(report_path)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    data = json.loads(report_path.read_text(encoding="utf-8"))
    chapters = sorted({e.chapter for e in registry().values()})
    assert data["missing_chapters"] == chapters == data["expected_chapters"]
    missing = [n for n in data["notebooks"] if n["missing"]]
    assert [n["chapter"] for n in missing] == chapters
    for notebook in missing:
        assert notebook["path"] == f"{tmp_path}/{notebook['chapter']}.md"
        assert {e["status"] for e in notebook["exercises"]} == {"failed"}
        assert {e["reason"] for e in notebook["exercises"]} == {"missing-notebook"}
    assert "missing notebooks" in done.stdout and done.stdout.rstrip().endswith("FAILED")


def test_chapters_restricts_what_is_expected(tmp_path):
    (tmp_path / "01_text_as_numbers.md").write_text((ROOT / "solutions" / "01_text_as_numbers.md").read_text(
        encoding="utf-8"), encoding="utf-8")
    report = grade([tmp_path], tracks=["numpy"], chapters=["01"])
    assert report.ok and report.expected_chapters == ["01_text_as_numbers"]
    report = grade([tmp_path], tracks=["numpy"], chapters=["01", "02"])
    assert not report.ok and [n.chapter for n in report.notebooks if n.missing] == ["02_attention"]
    with pytest.raises(ValueError, match="no chapter '42'"):
        grade([tmp_path], chapters=["42"])
    # A named notebook that is not there (as a roster grader names them): missing work too.
    report = grade([tmp_path / "01_text_as_numbers.md", tmp_path / "02_attention.md"], tracks=["numpy"])
    assert [(n.chapter, n.missing) for n in report.notebooks] == [("01_text_as_numbers", False),
                                                                 ("02_attention", True)]
    assert report.notebooks[1].path == str(tmp_path / "02_attention.md") and not report.ok
    assert parser().parse_args(["x", "--chapters", "01,02"]).chapters == ["01", "02"]
    assert parser().parse_args(["x", "--memory", "2G"]).memory == 2 * 10**9


def test_extra_checks_fail_without_revealing_the_case(tmp_path):
    extra = ROOT / "tests" / "extra_checks_example.py"
    solution = (ROOT / "solutions" / "01_text_as_numbers.md").read_text(encoding="utf-8")
    (tmp_path / "right").mkdir()
    (tmp_path / "right" / "01_text_as_numbers.md").write_text(solution, encoding="utf-8")
    # Refuses an empty sentence: passes the course's check (which has none), fails the hidden one.
    block = re.compile(_BLOCK.format(symbol="pad_batch"), re.S | re.M)
    body = ("    assert all(len(s) for s in batch)\n"
            "    return np.array([(list(s[:length]) + [pad_id] * length)[:length] for s in batch], dtype=np.int64)\n")
    (tmp_path / "wrong").mkdir()
    (tmp_path / "wrong" / "01_text_as_numbers.md").write_text(block.sub(lambda m: m[1] + body + m[2], solution),
                                                               encoding="utf-8")
    report = grade([tmp_path / "right", tmp_path / "wrong"], tracks=["numpy"], chapters=["01"], extra_checks=extra)
    right, wrong = report.notebooks
    assert right.ok, right.exercises
    assert wrong.result("build_vocabulary").passed
    result = wrong.result("pad_batch")
    assert (result.status, result.reason) == (FAILED, "hidden")
    assert result.message == "hidden check failed (your code raised an exception on a hidden case)"
    assert grade([tmp_path / "wrong"], tracks=["numpy"], chapters=["01"]).notebooks[0].result("pad_batch").passed
    with pytest.raises(ValueError, match="no exercise 'nothing'"):
        bad = tmp_path / "bad.py"
        bad.write_text("def check_nothing(answer):\n    pass\n", encoding="utf-8")
        grade([tmp_path / "right"], extra_checks=bad)


def test_a_new_chapter_is_expected_without_other_registration(tmp_path, monkeypatch):
    import companion.checks as checks
    from companion.grade.runner import expected_chapters

    (tmp_path / "ch97.py").write_text(
        "from companion.checks import exercise\n\n\n@exercise('97_new_chapter', 'new_answer', 'a new exercise')\n"
        "def check_new_answer(new_answer):\n    assert new_answer(2) == 4\n", encoding="utf-8")
    monkeypatch.setattr(checks, "__path__", [*checks.__path__, str(tmp_path)])
    try:
        assert "97_new_chapter" in expected_chapters(None)
        assert expected_chapters(["97"]) == ["97_new_chapter"]
    finally:
        checks._REGISTRY.pop("new_answer", None)
        sys.modules.pop("companion.checks.ch97", None)


def test_notebooks_graded_side_by_side_get_the_same_verdicts(catalogue):
    cases = ["crash", "infinite_loop", "redefined_check"]
    report = grade([FIXTURES / c for c in cases], tracks=["numpy"], chapters=["01"], jobs=2,
                   timeout=CATALOGUE_TIMEOUT)
    for case, notebook in zip(cases, report.notebooks, strict=True):
        side = [(r.id, r.status, r.reason) for r in notebook.exercises]
        alone = [(r.id, r.status, r.reason) for r in catalogue.cases[case].exercises]
        assert side == alone, case


def test_zygotes_look_up_the_tripwires_of_the_chapters_they_serve():
    """The names a zygote imports once for its student processes: the chapters' shortcuts whose library is here."""
    from companion.grade.shortcuts import tripwire_names

    chapter9 = tripwire_names(["09_modern_decoder"])
    declared = {s for e in registry().values() if e.chapter == "09_modern_decoder" for s in e.shortcuts}
    assert "torch.nn.RMSNorm" in chapter9 and set(chapter9) <= declared
    assert tripwire_names(["05_positional_encoding"]) == []  # no shortcut declared there
    assert set(tripwire_names()) >= set(chapter9) | set(tripwire_names(["02_attention"]))
