"""The student processes of one folder are forked from one zygote (companion/grade/forkserver.py): what one
notebook's code does in its process (patching NumPy, killing the zygote) must not change another notebook's
verdicts, and nothing may be left running afterwards.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from companion.grade import FAILED, PASSED, grade
from companion.grade.sandbox.processes import children_of

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"

PATCH_NUMPY = """
```{code-cell} ipython3
import numpy as np


class Sneaky:
    # A class body runs when the grader loads the cell: NumPy of this notebook's process is patched from here on.
    np.sqrt = lambda x: 1.0
    np.eye = lambda *args, **kwargs: np.zeros((1, 1))
```
"""

KILL_THE_ZYGOTE = """
```{code-cell} ipython3
import os
import signal


class Parricide:
    os.kill(os.getppid(), signal.SIGKILL)
```
"""


def _live_children() -> set[int]:
    """This process's children that are not zombies (other tests may leave zombies to a subreaper)."""
    alive = set()
    for pid in children_of(os.getpid()):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _verdicts(report, chapter: str) -> dict[str, tuple[str, str, str]]:
    notebook = next(n for n in report.notebooks if n.chapter == chapter)
    return {r.id: (r.status, r.reason, r.message) for r in notebook.exercises}


def _student(folder: Path, extra_cell: str) -> Path:
    folder.mkdir()
    first = (SOLUTIONS / "01_text_as_numbers.md").read_text(encoding="utf-8")
    (folder / "01_text_as_numbers.md").write_text(first + extra_cell, encoding="utf-8")
    shutil.copy(SOLUTIONS / "02_attention.md", folder / "02_attention.md")
    return folder


@pytest.fixture(scope="module", params=["auto", "off"])
def alone(request, tmp_path_factory):
    """Chapter 2's reference answers, graded on their own."""
    folder = tmp_path_factory.mktemp("alone")
    shutil.copy(SOLUTIONS / "02_attention.md", folder / "02_attention.md")
    report = grade([folder], tracks=["numpy"], chapters=["02"], sandbox=request.param)
    return request.param, _verdicts(report, "02_attention")


def test_a_patch_of_numpy_in_one_notebook_does_not_reach_the_next(alone, tmp_path):
    mode, expected = alone
    assert all(status == PASSED for status, reason, _ in expected.values() if reason != "track")
    folder = _student(tmp_path / "student", PATCH_NUMPY)
    report = grade([folder], tracks=["numpy"], chapters=["01", "02"], sandbox=mode)
    first = _verdicts(report, "01_text_as_numbers")
    # The patch took effect in its own notebook's process ...
    assert first["one_hot_batch"][:2] != (PASSED, "ok"), first["one_hot_batch"]
    assert first["build_vocabulary"][0] == PASSED
    # ... and chapter 2, graded next from the same zygote, sees the NumPy of a fresh process.
    assert _verdicts(report, "02_attention") == expected


def test_a_notebook_that_kills_the_zygote_fails_alone(alone, tmp_path):
    mode, expected = alone
    folder = _student(tmp_path / "student", KILL_THE_ZYGOTE)
    before = _live_children()
    report = grade([folder], tracks=["numpy"], chapters=["01", "02"], sandbox=mode)
    first = _verdicts(report, "01_text_as_numbers")
    # Its own steps fail (which ones depends on when the zygote's end is noticed); each exercise has a verdict.
    assert all(status in (PASSED, FAILED) for status, reason, _ in first.values() if reason != "track"), first
    assert _verdicts(report, "02_attention") == expected
    assert _live_children() - before == set()  # the zygotes and everything they forked are gone
