"""Shards of a class merged into one folder are the files a single run writes, hidden checks included.

One small class (chapter 1, numpy track) is graded three times: whole, and as shards 1/2 and 2/2 merged. The
instructor file has a due date, a late penalty, a roster and extra checks whose failure message and source hold
a marker that must appear in no file a student or an LMS receives.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from companion.checks import exercises_for
from companion.grade import classroom, gradebook, merge
from companion.instructor import synthetic

CHAPTER = "01_text_as_numbers"
KINDS = ("solution", "mutant", "not_utf8", "empty", "solution")
SECRET = "EXPECTED-7f3a"  # in the hidden check's message and in its source
SUBMITTED = "2026-10-07T12:00:00+00:00"  # the first student's commit: 1 day 12 h 1 min after the due date


def _files(folder: Path) -> dict[str, bytes]:
    """Every class file (the per-student grader folders aside: their logs hold times)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.relative_to(folder).parts[0] != "students"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    submissions = root / "submissions"
    manifest = synthetic.build_class(submissions, students=len(KINDS), chapters=[CHAPTER], kinds=KINDS)
    first = submissions / "student001-solution"
    env = {**os.environ, "GIT_AUTHOR_DATE": SUBMITTED, "GIT_COMMITTER_DATE": SUBMITTED, "GIT_AUTHOR_NAME": "s",
           "GIT_AUTHOR_EMAIL": "s@example.org", "GIT_COMMITTER_NAME": "s", "GIT_COMMITTER_EMAIL": "s@example.org"}
    for command in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "answers"]):
        subprocess.run(["git", "-C", str(first), *command], check=True, env=env, capture_output=True)
    extra = root / "hidden_checks.py"
    extra.write_text(f'def check_pad_batch(pad_batch):\n    """{SECRET} in the source"""\n'
                     f'    assert False, "{SECRET} in the message"\n', encoding="utf-8")
    (root / "roster.csv").write_text(
        "student,name,canvas_id,sis_user_id,sis_login_id,section,github_username,roster_identifier\n"
        "student001-solution,Ada Lovelace,101,S1,ada,A,ada-gh,ada@uni\n"
        "student002-mutant,Alan Turing,102,S2,alan,B,alan-gh,alan@uni\n"
        "student003-not_utf8,Grace Hopper,103,S3,grace,A,grace-gh,grace@uni\n"
        "student005-solution,Edsger Dijkstra,105,S5,edsger,B,,\n"
        "student009-absent,Barbara Liskov,109,S9,barbara,A,barbara-gh,barbara@uni\n", encoding="utf-8")
    config = root / "grading.toml"
    config.write_text(f'[grading]\nchapters = ["{CHAPTER}"]\ntracks = ["numpy"]\ntimeout = 3\nroster = "roster.csv"\n'
                      f'extra_checks = "hidden_checks.py"\n\n[points]\nbuild_vocabulary = 2.5\n\n'
                      f'[late]\npenalty_per_day = 0.15\nmax_penalty = 0.5\n[late.due]\n'
                      f'{CHAPTER} = 2026-10-05T23:59:00Z\n\n[canvas]\n{CHAPTER} = "Text as numbers (4242)"\n',
                      encoding="utf-8")
    settings = gradebook.load_settings(config)
    whole, _ = classroom.grade_class(submissions, root / "whole", settings, jobs=2, progress=False)
    for index in (1, 2):
        done = subprocess.run([sys.executable, "-m", "companion.grade", "class", str(submissions), "--out",
                               str(root / f"shard{index}"), "--config", str(config), "--shard", f"{index}/2",
                               "--no-progress"], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    done = subprocess.run([sys.executable, "-m", "companion.grade", "merge", str(root / "shard2"),
                           str(root / "shard1"), "--out", str(root / "merged")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return root, manifest, whole


def test_merged_shards_equal_a_single_run(runs):
    root, manifest, whole = runs
    single, merged = _files(root / "whole"), _files(root / "merged")
    assert "gradebook.csv" in single and "report.html" in single and "canvas.csv" in single
    assert sorted(single) == sorted(merged)
    for name in single:
        assert single[name] == merged[name], name
    # Each shard graded its own slice (positions 0, 2, 4 and 1, 3 of the sorted roster), and only that.
    names = sorted(manifest)
    for index, expected in ((1, names[0::2]), (2, names[1::2])):
        state = json.loads((root / f"shard{index}" / "class.json").read_text(encoding="utf-8"))
        assert [s["student"] for s in state["students"]] == expected and state["shard"] == [index, 2]
        assert sorted(p.name for p in (root / f"shard{index}" / "students").iterdir()) == expected
    # A shard's canvas.csv has its own students' rows, and the roster's entries that have no folder.
    shard_rows = [r[0] for r in csv.reader((root / "shard1" / "canvas.csv").open(encoding="utf-8"))][1:]
    assert shard_rows == ["Ada Lovelace", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov"]
    assert len(whole) == len(KINDS)


def test_the_late_student_loses_the_capped_fraction_of_raw_points(runs):
    root, *_ = runs
    rows = {r["student"]: r for r in csv.DictReader((root / "whole" / "gradebook.csv").open(encoding="utf-8"))}
    late, on_time = rows["student001-solution"], rows["student005-solution"]
    ids = [e.id for e in exercises_for(CHAPTER) if e.track == "numpy"]
    raw = len(ids) - 1 + 2.5 - 1  # every exercise passes but pad_batch (its hidden check fails)
    assert float(late["raw"]) == float(on_time["raw"]) == raw
    assert float(late["penalty"]) == pytest.approx(raw * 2 * 0.15)  # 2 started days late
    assert float(late["final"]) == pytest.approx(raw - raw * 0.3)
    assert on_time["penalty"] == "0" and float(on_time["final"]) == raw  # no commit: no time, no penalty
    long_rows = list(csv.DictReader((root / "whole" / "grades_long.csv").open(encoding="utf-8")))
    assert {r["late_days"] for r in long_rows if r["student"] == "student001-solution"} == {"2"}


def test_exports_keep_fractions_and_follow_the_roster(runs):
    root, *_ = runs
    out = root / "whole"
    final = {r["student"]: r["final"] for r in csv.DictReader((out / "gradebook.csv").open(encoding="utf-8"))}
    canvas = list(csv.reader((out / "canvas.csv").open(encoding="utf-8")))
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Text as numbers (4242)"]
    assert [r[0] for r in canvas[1:]] == ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra",
                                          "Barbara Liskov"]
    assert canvas[1][1:5] == ["101", "S1", "ada", "A"] and canvas[1][5] == final["student001-solution"]
    assert "." in canvas[4][5] and canvas[4][5] == final["student005-solution"]  # 2.5 points kept as 2.5
    assert canvas[5][5] == "0"  # in the roster, no folder
    github = list(csv.reader((out / "github_classroom.csv").open(encoding="utf-8")))
    assert github[0] == ["github_username", "roster_identifier", "points_awarded", "points_available"]
    assert github[1][:2] == ["ada-gh", "ada@uni"] and github[1][2] == final["student001-solution"]
    assert ["student005-solution", ""] == github[5][:2]  # no user in the roster: the folder's name
    assert "student004-empty" in (out / "report.html").read_text(encoding="utf-8")  # not in the roster: said
    results = json.loads((out / "gradescope" / "student001-solution" / "results.json").read_text(encoding="utf-8"))
    assert results["score"] == float(final["student001-solution"])
    assert sum(t["score"] for t in results["tests"]) == pytest.approx(results["score"])
    assert {t["name"].split(": ")[1] for t in results["tests"]} == {e.id for e in exercises_for(CHAPTER)
                                                                    if e.track == "numpy"}
    assert all(set(t) >= {"name", "score", "max_score", "output", "visibility"} for t in results["tests"])


def test_hidden_checks_stay_hidden_in_every_export(runs):
    root, *_ = runs
    out = root / "whole"
    for name, data in _files(out).items():
        assert SECRET.encode() not in data, name
        assert b"assert False" not in data, name
    for student in ("student001-solution", "student005-solution"):
        results = json.loads((out / "gradescope" / student / "results.json").read_text(encoding="utf-8"))
        pad = next(t for t in results["tests"] if t["name"].endswith(": pad_batch"))
        assert pad["visibility"] == "after_due_date" and pad["output"].startswith("hidden check failed")
        assert pad["score"] == 0
        assert {t["visibility"] for t in results["tests"] if t is not pad} == {"visible"}


def test_merge_refuses_what_is_not_one_class(runs, tmp_path):
    root, *_ = runs
    with pytest.raises(ValueError, match="shards must be 1/2 to 2/2"):
        merge.merge([root / "shard1", root / "shard1"], tmp_path / "a")
    with pytest.raises(ValueError, match="shards must be 1/1 to 1/1"):
        merge.merge([root / "shard2"], tmp_path / "b")
    with pytest.raises(ValueError, match="outputs of `python -m companion.grade class"):
        merge.merge([tmp_path], tmp_path / "c")
    for bad in ("0/2", "3/2", "a/b", "2"):
        with pytest.raises(ValueError, match="shard must be I/N"):
            merge.parse_shard(bad)


def test_the_class_workflow_fans_out_shards_and_merges_them():
    """Its actionlint run is tests/test_workflows.py's (every workflow); here, what it must do."""
    import yaml

    path = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "grade-class.yml"
    flow = yaml.safe_load(path.read_text(encoding="utf-8"))
    jobs = flow["jobs"]
    assert jobs["grade"]["strategy"]["matrix"]["shard"] == "${{ fromJSON(needs.plan.outputs.shards) }}"
    grade = next(s for s in jobs["grade"]["steps"] if "companion.grade class" in s.get("run", ""))
    assert '--shard "$SHARD"' in grade["run"] and grade["env"]["SHARD"].startswith("${{ matrix.shard }}/")
    merged = next(s for s in jobs["merge"]["steps"] if "companion.grade merge" in s.get("run", ""))
    assert "shards/shard-*" in merged["run"] and jobs["merge"]["needs"] == "grade"
    assert flow["permissions"] == {"contents": "read"}
    assert "CLASS_TOKEN" in path.read_text(encoding="utf-8") and "extraheader" in path.read_text(encoding="utf-8")
