"""The student release (make release DEST=...): what it ships, that no reference answer is in it, that its book
builds and that its own companion grades its stubs as failing and the solutions as passing.

The book check is a Sphinx build of the release with notebook execution off and warnings as errors (-W): it proves
that the configuration, the table of contents, every cross-reference and every literalinclude resolve without the
files the release leaves out, in about 20 s on an idle 2-core machine; executing the chapters (several minutes) is
what `make book` and CI do for the course itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from companion.instructor import release

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    dest = tmp_path_factory.mktemp("release") / "course-student"
    written = release.build_release(dest)
    return dest, written


def _grade(dest: Path, folder: Path, tmp: Path) -> dict:
    """Grade ``folder`` with the release's own companion (not this checkout's)."""
    report = tmp / "report.json"
    env = {**os.environ, "PYTHONPATH": str(dest), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-m", "companion.grade", str(folder), "--json", str(report), "--quiet"],
                          cwd=dest, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    data = json.loads(report.read_text(encoding="utf-8"))
    assert all(Path(n["path"]).resolve().is_relative_to(folder.resolve()) for n in data["notebooks"])
    return data


def test_the_release_ships_the_course_but_no_answers_and_no_instructor_files(built):
    dest, written = built
    top = {name.split("/", 1)[0] for name in written}
    assert {"notebooks", "exercises", "companion", "book", "data", "benchmarks", ".github", "_config.yml",
            "_toc.yml"} <= top
    assert {p.name for p in (ROOT / "benchmarks/results").glob("*.json")} == \
        {p.name for p in (dest / "benchmarks/results").glob("*.json")}           # the evidence chapters 7-9 read
    for absent in ("solutions", "tests", "grading.toml", "CONTRIBUTING.md", ".ci",
                   "companion/instructor"):
        assert not (dest / absent).exists(), absent
    # The instructor's tools are left out as a folder: every module in it, this one and any added later.
    assert (ROOT / "companion/instructor/release.py").exists()
    assert not [name for name in written if name.startswith("companion/instructor")]
    assert "companion/grade/__init__.py" in written and "companion/checks/__init__.py" in written
    assert (dest / ".github/workflows/grade.yml").read_bytes() == (ROOT / ".github/workflows/grade.yml").read_bytes()
    assert sorted(p.name for p in (dest / "exercises").glob("*.md")) == \
        sorted(p.name for p in (ROOT / "solutions").glob("*.md"))
    assert "make test" not in (dest / "Makefile").read_text() and "grade:" in (dest / "Makefile").read_text()


def test_no_solution_body_is_anywhere_in_the_release(built):
    dest, _ = built
    bodies = release.solution_bodies()
    assert len(bodies) >= 40  # every marked answer of every chapter, code and prose
    leaks, twins = release.find_solution_text(dest)
    assert leaks == []
    # The only copies are the companion's public functions listed in PUBLIC_TWINS, each where it is listed.
    assert {line.split(":")[0] for line in twins} == {f for files in release.PUBLIC_TWINS.values() for f in files}


def test_the_scan_finds_an_answer_pasted_anywhere(built, tmp_path):
    dest, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(dest, copy, ignore=shutil.ignore_patterns("_build"))
    notebook, owner, body = release.solution_bodies()[5]
    (copy / "book" / "notes.md").write_text("A hint:\n\n```python\n" + body + "\n```\n", encoding="utf-8")
    leaks, _ = release.find_solution_text(copy)
    assert leaks and leaks[0].startswith("book/notes.md: the answer of")
    with pytest.raises(ValueError, match="new or empty folder"):
        release.build_release(copy)


def test_the_release_grades_its_stubs_as_failing_and_the_solutions_as_passing(built, tmp_path):
    dest, _ = built
    stubs = _grade(dest, dest / "exercises", tmp_path)
    assert stubs["passed"] == 0 and stubs["failed"] >= 39
    assert len(stubs["notebooks"]) == len(list((ROOT / "solutions").glob("*.md")))
    answered = tmp_path / "answered"
    shutil.copytree(ROOT / "solutions", answered)
    solved = _grade(dest, answered, tmp_path)
    assert solved["ok"] and solved["failed"] == 0 and solved["passed"] == stubs["failed"]


def test_the_release_book_builds(built, tmp_path):
    dest, _ = built
    assert "book/_ext/edition.py html en" in (dest / "Makefile").read_text(encoding="utf-8")
    extensions = sorted(path.name for path in (ROOT / "book" / "_ext").glob("*.py"))
    assert {"edition.py", "page_order.py", "warm_kernels.py", "chinese_search.py"} <= set(extensions)
    assert sorted(path.name for path in (dest / "book" / "_ext").glob("*.py")) == extensions
    book = tmp_path / "book"
    shutil.copytree(dest, book)
    config = book / "_config.yml"
    text = config.read_text(encoding="utf-8")
    assert "execute_notebooks: force" in text
    config.write_text(text.replace("execute_notebooks: force", 'execute_notebooks: "off"'), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(book), "TF_CPP_MIN_LOG_LEVEL": "3"}
    builder = Path(sys.executable).parent / "jupyter-book"
    done = subprocess.run([str(builder), "build", str(book), "--builder", "html", "-W", "--keep-going"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    pages = {p.relative_to(book / "_build/html").as_posix() for p in (book / "_build/html").rglob("*.html")}
    assert {"book/intro.html", "book/grading.html", "notebooks/04_masking.html"} <= pages
    assert not any(p.startswith(("solutions/", "exercises/")) for p in pages)


def test_the_instructors_extra_checks_are_never_shipped(tmp_path):
    assert release.instructor_files(tmp_path) == set()
    (tmp_path / "grading.toml").write_text('[grading]\nextra_checks = "companion/checks/hidden.py"\n', encoding="utf-8")
    assert release.instructor_files(tmp_path) == {"companion/checks/hidden.py"}
    (tmp_path / "grading.toml").write_text('[grading]\nextra_checks = "../elsewhere.py"\n', encoding="utf-8")
    assert release.instructor_files(tmp_path) == set()
