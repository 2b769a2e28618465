"""The tampering catalogue (tests/grader_fixtures/tamper_*), graded through the command line as a submission.

Every exercise of every tampering notebook must fail; afterwards no process of the grader's may be left, no file
outside the sandbox may have changed (the notebooks, the virtual environment, `/usr`, `/dev/shm`, the course), the
reports must be valid XML and JSON with no terminal escape in them, unchanged a few seconds after the grader
exits, and the trusted process's peak memory must stay bounded. The catalogue runs twice: with the sandbox where
bubblewrap works (CI installs it), and with it switched off, where the limits, the subreaper, the link jail, the
parser's limits and the trust split must still hold. The attempts that act on the machine itself (remounting,
planting files, filling shared memory) run only in the sandbox: without it they would succeed, which is why the
sandbox exists. Run as root (as CI does) and as an unprivileged user (`setpriv --reuid=65534 ...`), it holds the
same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
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
#: Attempts on the machine itself: graded only inside the sandbox.
SANDBOX_ONLY = {"tamper_remount", "tamper_namespaces", "tamper_pth_at_load", "tamper_shared_memory"}
#: A case folder whose name is made of terminal escapes (made by the test: Git would carry it badly).
ESCAPED_NAME = "tamper_report_name_\x1b[2J\x1b[H\r\x07"
#: What each case may fail with (the reason), and a word its message must contain; "*" for every exercise.
LINKED = {"*": ("missing-notebook", "is a link that leads out of the student's folder")}
UNREADABLE = {"*": ("unreadable", "cannot grade this notebook")}
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
    # escape
    "tamper_remount": {"pad_batch": ("wrong", "remount /usr again: refused")},
    "tamper_namespaces": {"pad_batch": ("wrong", "ptrace the parent: refused")},
    "tamper_pth_at_load": {"pad_batch": ("wrong", "planted in: ")},
    # links
    "tamper_link_relative": LINKED,
    "tamper_link_absolute": LINKED,
    "tamper_link_classmate": LINKED,
    "tamper_link_host_file": LINKED,
    "tamper_link_extra_checks": LINKED,
    # memory
    "tamper_shared_memory": {"pad_batch": ("wrong", "/dev/shm: stopped after")},
    "tamper_reply_huge": {"pad_batch": ("crash", "protocol")},
    # parser crashes
    "tamper_reply_nested": {"pad_batch": ("crash", "protocol")},
    "tamper_deep_source": {"pad_batch": ("missing", "nested too deeply"),
                           "build_vocabulary": ("missing", "nested too deeply")},
    "tamper_deep_ipynb": {"*": ("unreadable", "nested too deeply")},
    "tamper_cell_not_text": UNREADABLE,
    # report corruption
    "tamper_report_escapes": {"pad_batch": ("wrong", "\\x1b[2J\\x1b[H\\x1b]0;graded\\x07\\x0dTotal"),
                              "build_vocabulary": ("wrong", "")},
    "tamper_nbformat_escapes": {"*": ("unreadable", "\\x1b[2J")},
}
#: The catalogue's classes, for the count printed by the tests and the book.
CLASSES = {
    "escape": ["tamper_remount", "tamper_namespaces", "tamper_pth_at_load", "tamper_solutions", "tamper_outlive"],
    "links": [c for c in EXPECTED if c.startswith("tamper_link_")],
    "memory": ["tamper_memory", "tamper_shared_memory", "tamper_reply_huge", "tamper_processes"],
    "parser crashes": ["tamper_reply_nested", "tamper_deep_source", "tamper_deep_ipynb", "tamper_cell_not_text"],
    "report corruption": ["tamper_report_escapes", "tamper_nbformat_escapes", "tamper_forged_messages"],
    "checker tampering": ["tamper_stack_frame", "tamper_patch_and_restore", "tamper_gc_guard",
                          "tamper_import_implementation"],
}
#: The trusted process's peak resident memory under the whole catalogue (numpy track), in MB.
PEAK_MB = 500
#: VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the process that forked (here, pytest) across exec.
_PEAK = "import sys; from companion.grade.__main__ import main; status = main(sys.argv[1:]); " \
        "peak = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]; " \
        "print('trusted-peak-kb', peak, file=sys.stderr); sys.exit(status)"


def _deep_source() -> str:
    additions = "+".join(["1"] * 60_000)
    cell = "\n```\n\n```{code-cell} ipython3\n"
    return (f"def pad_batch(batch, length, pad_id=0):\n    return {additions}{cell}"
            f"def build_vocabulary(sentences):\n    return {'-' * 100_000}1{cell}"
            f"NESTED = {'(' * 1000}1{')' * 1000}")


SUBSTITUTE = {"__DEEP_SOURCE__": _deep_source, '"__DEEP_JSON__"': lambda: "[" * 100_000 + "]" * 100_000}


def _copy_case(name: str, target: Path, report: Path) -> None:
    """Copy a case with its links: a link into the course is re-pointed at the same file (made absolute for
    `_absolute` cases), a link to a classmate or a host file is kept as it is."""
    shutil.copytree(FIXTURES / name, target, symlinks=True)
    for path in target.iterdir():
        if path.is_symlink():
            original = FIXTURES / name / path.name
            aim = original.resolve()
            if aim.is_relative_to(ROOT):
                path.unlink()
                path.symlink_to(aim if name.endswith("_absolute") else os.path.relpath(aim, target))
            continue
        text = path.read_text(encoding="utf-8").replace("__REPORT__", str(report)).replace("__ROOT__", str(ROOT))
        for marker, make in SUBSTITUTE.items():
            if marker in text:
                text = text.replace(marker, make())
        path.write_text(text, encoding="utf-8")


def _host_state(folder: Path) -> dict[str, str]:
    """A digest of every file the attempts aim at outside the sandbox."""
    state = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.suffix in (".md", ".ipynb"):
            state[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    for path in (ROOT / "solutions" / "01_text_as_numbers.md", ROOT / "tests" / "extra_checks_example.py"):
        state[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    places = {*site.getsitepackages(), sys.prefix, "/usr/lib", "/dev/shm", "/tmp"}
    for place in sorted(places):
        for name in ("companion_tamper.pth", "companion_tamper", "companion_tamper_0"):
            state[f"{place}/{name}"] = str(os.path.exists(os.path.join(place, name)))
    return state


def _leftovers(marker: str) -> list[str]:
    """Processes whose command line names this run's folder (bwrap binds it) or the tampering marker."""
    done = subprocess.run(["ps", "-eo", "pid,pgid,sid,cmd"], capture_output=True, text=True, check=True)
    return [line for line in done.stdout.splitlines()[1:] if marker in line and "ps -eo" not in line]


@pytest.fixture(scope="module", params=["on", "off"])
def tampered(request, tmp_path_factory):
    mode = request.param
    if mode == "on" and not sandbox_status()[0]:
        pytest.skip(f"bubblewrap cannot start here: {sandbox_status()[1]}")
    folder = tmp_path_factory.mktemp(f"tamper_{mode}")
    folder.chmod(0o755)
    report = folder / "grade.json"
    junit = folder / "grade.xml"
    classmate = folder / "classmate"
    classmate.mkdir()
    shutil.copy(ROOT / "solutions" / "01_text_as_numbers.md", classmate)
    names = [c for c in CASES if mode == "on" or c not in SANDBOX_ONLY]
    cases = []
    for name in names:
        _copy_case(name, folder / name, report)
        cases.append(str(folder / name))
    _copy_case("tamper_report_escapes", folder / ESCAPED_NAME, report)
    cases.append(str(folder / ESCAPED_NAME))
    before = _host_state(folder)
    command = [sys.executable, "-c", _PEAK, *cases, "--chapters", "01", "--track", "numpy", "--timeout", "20",
               "--json", str(report), "--junit", str(junit), "--sandbox", mode, "--memory", "2G"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900, env=env,
                          errors="backslashreplace")
    exited = time.monotonic()
    left = _leftovers(str(folder))
    written = (report.read_bytes(), junit.read_bytes())
    time.sleep(max(0.0, 6.0 - (time.monotonic() - exited)))  # the outliving processes would write after 4 s
    after = (report.read_bytes(), junit.read_bytes())
    data = json.loads(written[0])
    by_case = {Path(n["path"]).parent.name: n for n in data["notebooks"]}
    peak = [line for line in done.stderr.splitlines() if line.startswith("trusted-peak-kb")]
    return SimpleNamespace(mode=mode, done=done, left=left, changed=written != after, data=data, cases=by_case,
                           late=_leftovers(str(folder)), names=names, written=written, host=before,
                           host_after=_host_state(folder), peak_mb=int(peak[-1].split()[1]) / 1024 if peak else None)


def test_the_grader_exits_with_failure_and_no_traceback(tampered):
    assert tampered.done.returncode == 1, tampered.done.stdout + tampered.done.stderr
    assert "Traceback" not in tampered.done.stdout + tampered.done.stderr
    sandbox = tampered.data["sandbox"]
    assert sandbox == "on" if tampered.mode == "on" else sandbox.startswith("off")
    assert f"sandbox: {sandbox}" in tampered.done.stdout


def test_no_process_is_left_and_the_reports_are_untouched(tampered):
    assert tampered.left == [] and tampered.late == []
    assert not tampered.changed
    assert "forged by" not in json.dumps(tampered.data)


def test_no_file_outside_the_sandbox_changed(tampered):
    changed = {k: (v, tampered.host_after.get(k)) for k, v in tampered.host.items() if tampered.host_after.get(k) != v}
    assert changed == {}
    assert "SUCCEEDED" not in json.dumps(tampered.data)


def test_the_reports_are_valid_and_show_escapes_as_text(tampered):
    ET.fromstring(tampered.written[1])  # strict XML: a control character would fail here
    for text in (tampered.written[0].decode("utf-8"), tampered.written[1].decode("utf-8"), tampered.done.stdout):
        assert not any(ord(c) < 32 and c not in "\n\t" or 0x7F <= ord(c) <= 0x9F for c in text)
        assert "\u202e" not in text and "\ufffe" not in text
    escaped = "tamper_report_name_\\x1b[2J\\x1b[H\\x0d\\x07"
    assert escaped in tampered.cases, sorted(tampered.cases)
    assert tampered.cases[escaped]["exercises"][0]["status"] == "failed"


def test_nothing_behind_a_link_reaches_the_report(tampered):
    text = json.dumps(tampered.data) + tampered.done.stdout
    assert "def check_" not in text and "### BEGIN SOLUTION" not in text
    if os.access("/etc/shadow", os.R_OK):  # as root: the grader could have read it, and must not have
        assert Path("/etc/shadow").read_text().splitlines()[0][:12] not in text


def test_the_trusted_process_memory_stays_bounded(tampered):
    print(f"trusted process peak ({tampered.mode}): {tampered.peak_mb:.0f} MB")
    assert tampered.peak_mb is not None and tampered.peak_mb < PEAK_MB, tampered.peak_mb


@pytest.mark.parametrize("case", CASES)
def test_every_tampering_attempt_fails(tampered, case):
    if case not in tampered.names:
        pytest.skip("acts on the machine itself: graded only inside the sandbox")
    if case == "tamper_solutions" and tampered.mode == "off":
        # Without the sandbox the reference answers can be read: the one thing only the sandbox prevents.
        return
    notebook = tampered.cases[case]
    assert notebook["exercises"], notebook
    for exercise in notebook["exercises"]:
        if exercise["track"] != "numpy":
            assert exercise["status"] == "skipped"
            continue
        assert exercise["status"] == "failed", (case, exercise)
        expected = EXPECTED[case]
        reason, word = expected.get(exercise["id"], expected.get("*", ("missing", "")))
        if reason:
            assert exercise["reason"] == reason, (case, exercise)
        assert word in exercise["message"], (case, exercise)


def test_the_catalogue_covers_every_case():
    assert set(CASES) == set(EXPECTED), "a tampering fixture without expectations"
    classified = [case for cases in CLASSES.values() for case in cases]
    assert sorted(classified) == sorted(CASES), "a tampering fixture without a class"
    print({name: len(cases) for name, cases in CLASSES.items()})


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


#: Each answer reaches a forbidden computation by a path no list of names stops, and what the report names.
EVASIONS = {
    "embed_torch": "aten.embedding",
    "embed_keras": "the grader's monitoring was switched off",
    "attention_torch": "_scaled_dot_product_attention_math",
    "attention_keras": "dot_product_attention",
    "multi_head_attention_torch": "scaled_dot_product",
    "layer_norm_torch": "native_layer_norm",
    "layer_norm_keras": "layer_normalization",
    "layer_norm_input_grad": "torch.autograd.backward",
    "masked_nll_torch": "nll_loss",
    "masked_nll_keras": "sparse_categorical_crossentropy",
}


def test_shortcuts_are_seen_by_what_runs_not_by_their_names():
    """Private kernels, second names, Keras ops, a closure's original, autograd: seen while the answer runs."""
    folder = FIXTURES / "shortcut_evasions"
    report = grade([folder], chapters=sorted(p.stem.split("_")[0] for p in folder.glob("*.md")), timeout=60)
    results = {r.id: r for notebook in report.notebooks for r in notebook.exercises}
    for exercise_id, words in EVASIONS.items():
        result = results[exercise_id]
        assert (result.status, result.reason) == (FAILED, "shortcut"), result
        assert words in result.message, result.message
    assert len(EVASIONS) == 10
