"""Red team for class grading: a student graded by the same worker, from the same shared zygote, right after
another, sees nothing of the other student (files, module state, framework settings, threads, processes, IPC).

Two students hand in chapter 1 with the reference answers; the first also leaves behind everything it can while
its definitions load (a class body runs then). The second's ``pad_batch``
fails, naming what it found, if anything of the first is still there. Both print the start time of the process
that forked them, so the test knows they came from one zygote. A second test grades a small synthetic class with
and without the shared zygote and compares the gradebooks.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from companion.grade import classroom
from companion.grade.gradebook import Settings
from companion.grade.launcher import sandbox_status
from companion.instructor import synthetic

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "01_text_as_numbers"
SOLUTION = ROOT / "solutions" / f"{CHAPTER}.md"

pytestmark = pytest.mark.skipif(not sandbox_status()[0], reason="the shared zygote needs the sandbox (bubblewrap)")

_PARENT_START = '''
def _parent_start():
    import os
    with open(f"/proc/{os.getppid()}/stat", encoding="ascii") as file:
        return file.read().rpartition(")")[2].split()[19]
'''

LEAKER = _PARENT_START + '''

def _leave_everything_behind():
    import builtins, ctypes, os, subprocess, sys, threading, time, types
    import numpy
    import keras
    import torch

    for path in ("/tmp/companion_leak", "/dev/shm/companion_leak", "companion_leak.txt"):
        with open(path, "w") as file:
            file.write("left by the previous student")
    os.makedirs("/tmp/companion_leak_dir/locked", exist_ok=True)
    os.chmod("/tmp/companion_leak_dir", 0)
    numpy.companion_leak = True

    def concatenate(*args, **kwargs):
        return original(*args, **kwargs)

    original = numpy.concatenate
    concatenate.companion_leak = True
    numpy.concatenate = concatenate
    sys.modules["companion_leak"] = types.ModuleType("companion_leak")
    builtins.companion_leak = True
    os.environ["COMPANION_LEAK"] = "1"
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(1234)
    keras.config.set_floatx("float64")

    def keep_writing(path):
        while True:
            try:
                with open(path, "w") as file:
                    file.write("a thread of the previous student")
            except OSError:
                pass
            time.sleep(0.02)

    threading.Thread(target=keep_writing, args=("/tmp/companion_leak_thread",), daemon=True).start()
    loop = ("import time\\nwhile True:\\n    open('/tmp/companion_leak_process', 'w').write('x')\\n"
            "    time.sleep(0.02)")
    subprocess.Popen([sys.executable, "-c", loop], start_new_session=True)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", loop.replace("process", "orphan")])
        os._exit(0)
    libc = ctypes.CDLL(None, use_errno=True)
    segment = libc.shmget(0x5EED, 4096, 0o1000 | 0o666)  # IPC_CREAT
    assert segment >= 0, "shmget failed"
    # A new Python process takes a while to start on a slow or busy machine: wait until all three writers wrote.
    deadline = time.monotonic() + 20
    writers = ("/tmp/companion_leak_thread", "/tmp/companion_leak_process", "/tmp/companion_leak_orphan")
    while not all(os.path.exists(path) for path in writers) and time.monotonic() < deadline:
        time.sleep(0.05)


class _AtLoad:
    _leave_everything_behind()


def _wrap(_):
    original = globals()["pad_batch"]  # the reference answer defined above (not yet replaced)

    def pad_batch(*args, **kwargs):
        import builtins
        import os

        print("companion-parent:", _parent_start())
        writers = ("/tmp/companion_leak_thread", "/tmp/companion_leak_process", "/tmp/companion_leak_orphan")
        if getattr(builtins, "companion_leak", False) and all(os.path.exists(path) for path in writers):
            print("companion-leak: left")
        return original(*args, **kwargs)

    return pad_batch


@_wrap
def pad_batch():
    pass
'''

VICTIM = _PARENT_START + '''

def _left_behind():
    import builtins, ctypes, os, sys, time
    import numpy

    time.sleep(0.3)  # time for any thread or process of the previous student to write again
    found = [path for path in ("/tmp/companion_leak", "/dev/shm/companion_leak", "companion_leak.txt",
                               "/tmp/companion_leak_dir", "/tmp/companion_leak_thread",
                               "/tmp/companion_leak_process", "/tmp/companion_leak_orphan") if os.path.exists(path)]
    found += ["numpy"] * (hasattr(numpy, "companion_leak") or hasattr(numpy.concatenate, "companion_leak"))
    found += ["sys.modules"] * ("companion_leak" in sys.modules)
    found += ["builtins"] * hasattr(builtins, "companion_leak")
    found += ["os.environ"] * ("COMPANION_LEAK" in os.environ)
    torch, keras = sys.modules.get("torch"), sys.modules.get("keras")
    if torch is not None:
        found += ["torch dtype"] * (torch.get_default_dtype() != torch.float32)
        found += ["torch seed"] * (torch.initial_seed() == 1234)
    if keras is not None:
        found += ["keras floatx"] * (keras.config.floatx() != "float32")
    found += ["System V shared memory"] * (ctypes.CDLL(None).shmget(0x5EED, 0, 0) != -1)
    return found


def _wrap(_):
    original = globals()["pad_batch"]

    def pad_batch(*args, **kwargs):
        print("companion-parent:", _parent_start())
        found = _left_behind()
        if found:
            raise RuntimeError("left by the previous student: " + ", ".join(found))
        return original(*args, **kwargs)

    return pad_batch


@_wrap
def pad_batch():
    pass
'''


def _student(submissions: Path, name: str, extra: str) -> None:
    folder = submissions / name / "exercises"
    folder.mkdir(parents=True)
    text = SOLUTION.read_text(encoding="utf-8")
    (folder / f"{CHAPTER}.md").write_text(f"{text}\n```{{code-cell}} ipython3\n{extra}```\n", encoding="utf-8")


def _pad_batch(out: Path, student: str) -> dict:
    report = json.loads((out / "students" / student / "report.json").read_text(encoding="utf-8"))
    return next(e for n in report["notebooks"] for e in n["exercises"] if e["id"] == "pad_batch")


def test_nothing_of_a_student_reaches_the_next_one_from_the_same_zygote(tmp_path):
    submissions, out = tmp_path / "submissions", tmp_path / "out"
    _student(submissions, "a-leaker", LEAKER)
    _student(submissions, "b-victim", VICTIM)
    settings = Settings(chapters=[CHAPTER], tracks=["numpy"], timeout=30.0)
    grades, _ = classroom.grade_class(submissions, out, settings, jobs=1, progress=False)
    leaker, victim = _pad_batch(out, "a-leaker"), _pad_batch(out, "b-victim")
    assert "companion-leak: left" in leaker["output"], leaker  # the leaker did leave everything behind
    assert leaker["status"] == "passed", leaker
    assert victim["status"] == "passed", victim["message"]  # and the next student saw none of it
    started = [e["output"].split("companion-parent:")[1].split()[0] for e in (leaker, victim)]
    assert started[0] == started[1]  # both forked by one zygote (its start time, in clock ticks since boot)
    assert [g.total for g in grades] == [g.max_points for g in grades]


def test_the_shared_zygote_changes_no_grade(tmp_path):
    """A small class (every kind of answer of chapter 1, every track) graded with and without the shared zygote:
    the same gradebook, the same verdicts and messages."""
    submissions = tmp_path / "submissions"
    synthetic.build_class(submissions, students=5, chapters=[CHAPTER],
                          kinds=("solution", "mutant", "stubs", "mutant", "not_notebook"))
    settings = Settings(chapters=[CHAPTER], timeout=30.0)
    tables = {}
    for share in (True, False):
        out = tmp_path / f"out-{share}"
        classroom.grade_class(submissions, out, settings, jobs=2, progress=False, share_sandbox=share)
        with (out / "grades_long.csv").open(encoding="utf-8", newline="") as handle:
            long = [{k: v for k, v in row.items() if "second" not in k} for row in csv.DictReader(handle)]
        tables[share] = ((out / "gradebook.csv").read_text(encoding="utf-8"), long)
    assert tables[True][0] == tables[False][0]
    assert tables[True][1] == tables[False][1]


def test_a_reset_keeps_the_sandboxs_binds_and_removes_the_rest(tmp_path):
    """A virtual environment or the course under /tmp is bound read-only into the sandbox's /tmp: bubblewrap makes
    the folders that lead to it. A reset empties those folders of anything else and leaves the bind."""
    from companion.grade.sandbox import zygote

    bind = tmp_path / "course" / ".venv"
    (bind / "lib").mkdir(parents=True)
    (bind / "lib" / "site.py").write_text("kept", encoding="utf-8")
    (tmp_path / "course" / "left.txt").write_text("left by a student", encoding="utf-8")
    (tmp_path / "course" / "hidden").mkdir(mode=0)
    (tmp_path / "top.txt").write_text("left by a student", encoding="utf-8")
    kept = frozenset({str(bind)})
    assert sorted(zygote._files_in(str(tmp_path), kept)) == [
        str(tmp_path / "course" / "hidden"), str(tmp_path / "course" / "left.txt"), str(tmp_path / "top.txt")]
    zygote._empty(str(tmp_path), kept)
    assert zygote._files_in(str(tmp_path), kept) == []
    assert (bind / "lib" / "site.py").read_text(encoding="utf-8") == "kept"
