"""The pieces of the grader that face untrusted input, one at a time: the link jail, the text cleaner, the protocol's
limits, the seccomp program and the sandbox's command line. The whole catalogue of attacks is graded in
tests/test_grader_tampering.py.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from companion.grade import FAILED, grade, junit_xml
from companion.grade.launcher import bwrap_command, sandbox_status, tmpfs_bytes
from companion.grade.notebooks import leaves_folder
from companion.grade.results import ExerciseResult, GradeReport, NotebookResult, clean_result, clean_text
from companion.grade.sandbox import protocol as P
from companion.grade.seccomp import REFUSED, filter_program

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "01_text_as_numbers.md"


# -- links -----------------------------------------------------------------------------------------------------


def test_links_that_leave_the_student_folder_are_refused_and_those_inside_are_not(tmp_path):
    carol, bob = tmp_path / "carol" / "exercises", tmp_path / "bob" / "exercises"
    carol.mkdir(parents=True)
    bob.mkdir(parents=True)
    shutil.copy(SOLUTION, bob)
    (carol / "01_text_as_numbers.md").symlink_to("../../bob/exercises/01_text_as_numbers.md")
    (carol / "02_attention.md").symlink_to(ROOT / "solutions" / "02_attention.md")
    (carol / "draft.md").write_text("# a draft\n", encoding="utf-8")
    (carol / "03_multihead_attention.md").symlink_to("draft.md")
    assert "leads out of the student's folder" in leaves_folder(carol / "01_text_as_numbers.md")
    assert "leads out of the student's folder" in leaves_folder(carol / "02_attention.md")
    assert leaves_folder(carol / "03_multihead_attention.md") == ""  # a link inside the folder is fine
    assert leaves_folder(bob / "01_text_as_numbers.md") == ""
    report = grade([carol], tracks=["numpy"], chapters=["01", "02"], timeout=30)
    assert not report.ok
    refused = [n for n in report.notebooks if n.chapter in ("01_text_as_numbers", "02_attention")]
    assert len(refused) == 2
    for notebook in refused:
        assert notebook.missing and "refused" in notebook.error, notebook
        assert all(r.status == FAILED and r.reason == "missing-notebook" for r in notebook.exercises
                   if r.track == "numpy")
    assert "BEGIN SOLUTION" not in json.dumps(report.to_dict())


def test_a_folder_that_is_a_link_out_of_its_parent_is_missing_work(tmp_path):
    (tmp_path / "carol").mkdir()
    bob = tmp_path / "bob" / "exercises"
    bob.mkdir(parents=True)
    shutil.copy(SOLUTION, bob)
    (tmp_path / "carol" / "exercises").symlink_to(bob)
    linked = tmp_path / "carol" / "exercises"
    assert "is a link that leads out of the folder that holds it" in leaves_folder(linked)
    report = grade([linked], tracks=["numpy"], chapters=["01"], timeout=30)
    assert [n.missing for n in report.notebooks] == [True]
    assert "link" in report.notebooks[0].exercises[0].message


def test_class_grading_refuses_a_classmates_notebook(tmp_path):
    submissions = tmp_path / "submissions"
    for student in ("bob", "carol"):
        (submissions / student / "exercises").mkdir(parents=True)
    shutil.copy(SOLUTION, submissions / "bob" / "exercises")
    (submissions / "carol" / "exercises" / "01_text_as_numbers.md").symlink_to(
        "../../bob/exercises/01_text_as_numbers.md")
    out = tmp_path / "grades"
    done = subprocess.run([sys.executable, "-m", "companion.grade", "class", str(submissions), "--out", str(out),
                           "--chapters", "01", "--track", "numpy", "--jobs", "1"],
                          capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          timeout=600)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    carol = json.loads((out / "students" / "carol" / "report.json").read_text(encoding="utf-8"))
    bob = json.loads((out / "students" / "bob" / "report.json").read_text(encoding="utf-8"))
    assert carol["passed"] == 0 and carol["missing_chapters"] == ["01_text_as_numbers"]
    assert bob["passed"] > 0 and bob["failed"] == 0


# -- reports ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, shown", [
    ("\x1b[2J", "\\x1b[2J"), ("ok\rTotal: OK", "ok\\x0dTotal: OK"), ("\x00\x08\x0b\x0c\x1f\x7f", "\\x00\\x08\\x0b"
                                                                                           "\\x0c\\x1f\\x7f"),
    ("\x9b31m", "\\x9b31m"), ("\u202eevil", "\\u202eevil"), ("\ud800\ufffe\uffff", "\\ud800\\ufffe\\uffff"),
    ("line\n\ttab, é, 漢字, 🙂", "line\n\ttab, é, 漢字, 🙂"),
])
def test_clean_text_shows_every_unsafe_character_as_text(raw, shown):
    assert clean_text(raw) == shown
    assert clean_text(clean_text(raw)) == shown


def test_a_report_of_unsafe_strings_is_valid_xml_and_json():
    nasty = "\x1b]0;x\x07\x00\ud800\ufffe"
    notebook = NotebookResult(path=f"{nasty}/01.md", chapter=nasty, error=nasty, problems=[nasty])
    notebook.exercises.append(ExerciseResult(nasty, "numpy", nasty, FAILED, "wrong", nasty, output=nasty))
    report = GradeReport([clean_result(notebook)], sandbox="on")
    ET.fromstring(ET.tostring(junit_xml(report).getroot()))
    text = json.dumps(report.to_dict(), ensure_ascii=False)
    assert "\x1b" not in text and "\\\\x1b]0;x\\\\x07" in text


# -- protocol --------------------------------------------------------------------------------------------------


def _reader_of(data: bytes) -> P.Reader:
    """A reader of ``data`` (a file: a pipe would not hold a large message without a reader)."""
    read = os.memfd_create("message")
    os.write(read, data)
    os.lseek(read, 0, os.SEEK_SET)
    return P.Reader(read)


def test_the_reader_refuses_a_header_over_its_limit_before_reading_it():
    message = struct.pack("<QQ", P.MAX_HEADER + 1, 0) + b"{"
    with pytest.raises(P.ProtocolError, match="limits"):
        _reader_of(message).read(deadline=None)


def test_the_reader_turns_deep_json_into_a_protocol_error():
    header = b"[" * 200_000 + b"]" * 200_000
    with pytest.raises(P.ProtocolError):
        _reader_of(struct.pack("<QQ", len(header), 0) + header).read(deadline=None)


@pytest.mark.parametrize("tree", [{"list": 5}, {"dict": [[1]]}, {"dict": [5]}, {"cb": [1]}, {"array": "x"},
                                  {"tuple": [{"list": [{"set": [{"list": []}]}]}]}, {"unknown": 1}])
def test_a_malformed_value_is_a_protocol_error(tree):
    def resolve(node):
        return {}[node["cb"]]

    with pytest.raises(P.ProtocolError):
        P.decode(tree, [], resolve)


# -- the sandbox -----------------------------------------------------------------------------------------------


def test_the_seccomp_program_refuses_the_listed_calls():
    program = filter_program("x86_64")
    instructions = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    assert instructions[-1] == (0x06, 0, 0, 0x00050001)  # return EPERM
    assert instructions[-2] == (0x06, 0, 0, 0x7FFF0000)  # return ALLOW
    tests = [(index, k, jt) for index, (code, jt, jf, k) in enumerate(instructions) if code == 0x15 and jt]
    refused = {k for _, k, _ in tests}
    assert {165, 166, 272, 308, 101, 250, 321} <= refused  # mount, umount2, unshare, setns, ptrace, keyctl, bpf
    assert len(refused) == len(REFUSED)
    for index, _, jump in tests:  # every test jumps to the final EPERM
        assert index + 1 + jump == len(instructions) - 1
    assert filter_program("aarch64") is not None and filter_program("mips") is None


def test_the_sandbox_drops_capabilities_and_limits_its_writable_places():
    command = bwrap_command(None, memory=2 * 10**9, seccomp_fd=7)
    for option in ("--cap-drop", "--disable-userns", "--uid", "--new-session", "--die-with-parent", "--seccomp"):
        assert option in command
    assert command[command.index("--cap-drop") + 1] == "ALL"
    sizes = [command[i + 1] for i, part in enumerate(command) if part == "--size"]
    assert sizes == [str(tmpfs_bytes(2 * 10**9))] * 2 and tmpfs_bytes(2 * 10**9) == 250_000_000
    assert command[command.index("--tmpfs", command.index("--tmpfs") + 1) + 1] == "/dev/shm"
    assert ["--remount-ro", "/dev", "--remount-ro", "/"] == command[-6:-2]


@pytest.mark.skipif(not sandbox_status()[0], reason="bubblewrap cannot start here")
def test_inside_the_sandbox_there_is_no_capability_and_no_way_to_remount(tmp_path):
    from companion.grade.seccomp import filter_fd

    fd = filter_fd()
    code = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
            "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0], os.getuid(), "
            "libc.mount(None, b'/usr', None, 32 | 4096, None), libc.unshare(0x10000000))")
    done = subprocess.run([*bwrap_command(None, seccomp_fd=fd), sys.executable, "-I", "-c", code],
                          capture_output=True, text=True, pass_fds=(fd,), timeout=60)
    os.close(fd)
    assert done.stdout.split() == ["0000000000000000", "65534", "-1", "-1"], done.stderr
