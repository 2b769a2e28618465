"""The tampering catalogue (tests/grader_fixtures/tamper_*), graded through the command line as a submission.

Every exercise of every tampering notebook must fail; afterwards no process of the grader's may be left, and the
reports must be unchanged a few seconds after the grader exits. The catalogue runs twice: with the sandbox where
bubblewrap works (CI installs it), and with it switched off, where the limits, the subreaper and the trust split
must still hold (only reading `solutions/` then succeeds, which is why the sandbox exists).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from companion.grade import FAILED, grade
from companion.grade.launcher import sandbox_status
from companion.grade.notebooks import read_cells
from companion.grade.shortcuts import find_shortcuts

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "grader_fixtures"
CASES = sorted(p.name for p in FIXTURES.iterdir() if p.name.startswith("tamper_"))
#: What each case may fail with (the reason), and a word its message must contain.
EXPECTED = {
    "tamper_stack_frame": {"pad_batch": ("wrong", "")},
    "tamper_patch_and_restore": {"pad_batch": ("shortcut", "companion.checks.expect_close")},
    "tamper_gc_guard": {"pad_batch": ("", "")},
    "tamper_forged_messages": {"pad_batch": ("crash", "protocol")},
    "tamper_outlive": {"pad_batch": ("wrong", "")},
    "tamper_solutions": {"pad_batch": ("", "")},
    "tamper_import_implementation": {"pad_batch": ("missing", "companion"),
                                     "build_vocabulary": ("missing", "companion"),
                                     "one_hot_batch": ("wrong", "No module named 'companion.text'")},
    "tamper_memory": {"pad_batch": ("wrong", "MemoryError")},
    "tamper_processes": {"pad_batch": ("", "")},
}


def _leftovers(marker: str) -> list[str]:
    """Processes whose command line names this run's folder (bwrap binds it) or the tampering marker."""
    done = subprocess.run(["ps", "-eo", "pid,pgid,sid,cmd"], capture_output=True, text=True, check=True)
    return [line for line in done.stdout.splitlines()[1:] if marker in line and "ps -eo" not in line]


@pytest.fixture(scope="module", params=["auto", "off"])
def tampered(request, tmp_path_factory):
    mode = request.param
    folder = tmp_path_factory.mktemp(f"tamper_{mode}")
    report = folder / "grade.json"
    junit = folder / "grade.xml"
    cases = []
    for name in CASES:
        target = folder / name
        shutil.copytree(FIXTURES / name, target)
        notebook = target / "01_text_as_numbers.md"
        text = notebook.read_text(encoding="utf-8").replace("__REPORT__", str(report)).replace("__ROOT__", str(ROOT))
        notebook.write_text(text, encoding="utf-8")
        cases.append(str(target))
    command = [sys.executable, "-m", "companion.grade", *cases, "--chapters", "01", "--track", "numpy",
               "--timeout", "20", "--json", str(report), "--junit", str(junit), "--sandbox", mode,
               "--memory", "2G"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    exited = time.monotonic()
    left = _leftovers(str(folder))
    before = (report.read_bytes(), junit.read_bytes())
    time.sleep(max(0.0, 6.0 - (time.monotonic() - exited)))  # the outliving processes would write after 4 s
    after = (report.read_bytes(), junit.read_bytes())
    data = json.loads(before[0])
    by_case = {Path(n["path"]).parent.name: n for n in data["notebooks"]}
    return SimpleNamespace(mode=mode, done=done, left=left, changed=before != after, data=data, cases=by_case,
                           late=_leftovers(str(folder)))


def test_the_grader_exits_with_failure_and_no_traceback(tampered):
    assert tampered.done.returncode == 1, tampered.done.stdout + tampered.done.stderr
    assert "Traceback" not in tampered.done.stdout + tampered.done.stderr
    sandbox = tampered.data["sandbox"]
    if tampered.mode == "off":
        assert sandbox.startswith("off")
    else:
        assert sandbox == ("on" if sandbox_status()[0] else f"off ({sandbox_status()[1]})")
    assert f"sandbox: {sandbox}" in tampered.done.stdout


def test_no_process_is_left_and_the_reports_are_untouched(tampered):
    assert tampered.left == [] and tampered.late == []
    assert not tampered.changed
    assert "forged by" not in json.dumps(tampered.data)


@pytest.mark.parametrize("case", CASES)
def test_every_tampering_attempt_fails(tampered, case):
    if case == "tamper_solutions" and tampered.data["sandbox"].startswith("off"):
        # Without the sandbox the reference answers can be read: the one thing only the sandbox prevents.
        assert tampered.data["sandbox"].startswith("off")
        return
    notebook = tampered.cases[case]
    assert notebook["exercises"], notebook
    for exercise in notebook["exercises"]:
        if exercise["track"] != "numpy":
            assert exercise["status"] == "skipped"
            continue
        assert exercise["status"] == "failed", (case, exercise)
        reason, word = EXPECTED[case].get(exercise["id"], ("missing", ""))
        if reason:
            assert exercise["reason"] == reason, (case, exercise)
        assert word in exercise["message"], (case, exercise)


def test_the_catalogue_covers_every_case():
    assert set(CASES) == set(EXPECTED), "a tampering fixture without expectations"
    assert len(CASES) >= 9


def test_one_call_shortcuts_fail_with_the_call_named():
    """Directly, through a helper, and through a name built at run time (the tripwire in the student's process)."""
    report = grade([FIXTURES / "shortcut_attention"], chapters=["02"], timeout=60)
    results = {r.id: r for r in report.notebooks[0].exercises}
    expected = {
        "attention_torch": "reaches `torch.nn.functional.scaled_dot_product_attention`",
        "attention_keras": "called `keras.ops.dot_product_attention`",
        "SelfAttention_torch": "reaches `torch.nn.MultiheadAttention`",
        "SelfAttention_keras": "reaches `keras.layers.",
    }
    for exercise_id, words in expected.items():
        result = results[exercise_id]
        assert (result.status, result.reason) == (FAILED, "shortcut"), result
        assert words in result.message and "write it yourself" in result.message, result.message


def test_the_source_scan_follows_helpers_and_imports(tmp_path):
    notebook = tmp_path / "02_attention.md"
    notebook.write_text(
        "```{code-cell} ipython3\nfrom torch import nn\nimport companion.torch as mine\n"
        "from companion.checks import check\n\n\ndef helper(x):\n    return mine.scaled_dot_product_attention(x)\n\n\n"
        "def uses_helper(x):\n    return helper(x)\n\n\ndef own(x, embedding=None):\n    check('own', x)\n"
        "    self_embedding = x.embedding\n    return x\n\n\nclass Layer(nn.Module):\n"
        "    def __init__(self):\n        self.mha = nn.MultiheadAttention(4, 1)\n```\n", encoding="utf-8")
    cells = read_cells(notebook)
    forbidden = ("torch.nn.MultiheadAttention", "torch.nn.functional.embedding")
    found = find_shortcuts(cells, "uses_helper", forbidden)
    assert found and all("`companion.torch" in f and "course's own implementation" in f for f in found), found
    assert find_shortcuts(cells, "own", forbidden) == []  # a variable or attribute named like a call is fine
    assert find_shortcuts(cells, "Layer", forbidden) == ["`torch.nn.MultiheadAttention`"]
