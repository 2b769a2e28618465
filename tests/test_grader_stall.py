"""The grader never hangs without a word (issue #36).

``--jobs 2`` over 304 notebooks livelocked the trusted process inside OpenBLAS for 40 minutes: the launcher set
the student process's limits in ``subprocess.Popen(preexec_fn=...)``, which makes CPython start it with
``fork()``; fork runs OpenBLAS's fork handler in the trusted process, which shuts OpenBLAS's thread pool down
while a checker thread is inside a threaded float64 matrix product, and that thread then spins for ever waiting
for workers that are gone (and every later product waits on its lock). The launcher now starts every process
with ``vfork()`` (no ``preexec_fn``; :mod:`companion.grade.rlimits` sets the limits after exec), and a watchdog
gives up any check that still runs in the trusted process well past its time limit.

The stress tests grade, through the command line, many notebooks with ``--jobs 2`` and ``--jobs 4`` (and a
class, several students at once) while instructor's extra checks run chapter 2's float64 products
(``_layer_variants``, the frames of the stack dump) in the trusted process, so sandboxes start while those
products run. Before the fix each of those single-student runs hung; the test reads a run that does not finish
within :data:`RUN_LIMIT` seconds as that hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import companion.grade.steps as steps
from companion.checks import registry
from companion.grade import FAILED, PASSED, grade
from companion.grade.launcher import Child, Limits

ROOT = Path(__file__).resolve().parents[1]
#: Chapter 5: its numpy exercises have no tripwires, so a student process imports only NumPy and starts in a second
#: (chapter 1's would import PyTorch and Keras for their tripwires).
CHAPTER = "05_positional_encoding"
NUMPY_EXERCISES = ["positional_encoding", "shift_encoding", "angular_frequencies", "offset_similarity",
                   "learned_table_outcome"]
#: The exercise of the one wrong answer, and the one whose check is made to stall.
WRONG, STUCK = "offset_similarity", "shift_encoding"
#: Seconds a stress run may take before it is read as hung (it takes well under a minute on an idle 2-core machine).
RUN_LIMIT = 240.0
#: A solution with one wrong answer: a later cell redefines offset_similarity (sines where cosines belong).
WRONG_ANSWER = """
```{code-cell} ipython3
def offset_similarity(d_model, offsets):
    omega = 10000.0 ** (-np.arange(0, d_model, 2) / d_model)
    return np.sin(np.asarray(offsets, dtype=np.float64)[:, None] * omega).sum(axis=-1)
```
"""
#: The instructor's extra checks: chapter 2's float64 products, for a while, on every numpy exercise that passed.
HEAVY_CHECKS = f'''"""BLAS-heavy checks in the trusted process: the products of check_self_attention_* (issue #36)."""
import time

import numpy as np

from companion.checks.ch02 import LAYER_SIZES, _layer_variants, _projection_weights


def _products(answer, seconds=0.25):
    d_in, d_out, seq_len = LAYER_SIZES[0]
    generator = np.random.default_rng(36)
    x = generator.standard_normal((2, seq_len, d_in)).astype(np.float32)
    weights = _projection_weights(generator, d_in, d_out)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        _layer_variants(x, weights)


{chr(10).join(f"check_{name} = _products" for name in NUMPY_EXERCISES)}
'''
KINDS = ("solution", "one_wrong", "stub")


def _notebook(kind: str) -> str:
    if kind == "stub":
        return (ROOT / "exercises" / f"{CHAPTER}.md").read_text(encoding="utf-8")
    text = (ROOT / "solutions" / f"{CHAPTER}.md").read_text(encoding="utf-8")
    return text + WRONG_ANSWER if kind == "one_wrong" else text


def _expected(kind: str) -> dict[str, str]:
    if kind == "stub":
        return dict.fromkeys(NUMPY_EXERCISES, FAILED)
    return {name: FAILED if (kind == "one_wrong" and name == WRONG) else PASSED for name in NUMPY_EXERCISES}


def _students(root: Path, count: int) -> dict[str, str]:
    """``count`` folders of one chapter-5 notebook each (every folder starts a sandbox of its own); name -> kind."""
    kinds = {}
    for index in range(count):
        kind = KINDS[index % len(KINDS)]
        folder = root / f"student{index:02d}-{kind}"
        folder.mkdir(parents=True)
        (folder / f"{CHAPTER}.md").write_text(_notebook(kind), encoding="utf-8")
        kinds[folder.name] = kind
    return kinds


def _threads_of(pid: int) -> str:
    """What each thread of ``pid`` is doing (state, CPU ticks, kernel wait channel): evidence of a hang."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            wchan = (task / "wchan").read_text() if (task / "wchan").exists() else "?"
            lines.append(f"thread {task.name}: state {fields[0]}, cpu {int(fields[11]) + int(fields[12])} ticks, "
                         f"waiting in {wchan or 'nothing (running)'}")
        except (OSError, IndexError, ValueError):
            pass
    return "\n".join(lines)


def _run(command: list[str], log: Path) -> float:
    """Run ``command`` in a session of its own; fail with its threads' state when it does not end in RUN_LIMIT."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONHASHSEED": "0"}
    env.pop("OMP_NUM_THREADS", None)  # as an instructor runs it: OpenBLAS with its thread pool
    start = time.monotonic()
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=ROOT, env=env, start_new_session=True)
        try:
            process.wait(RUN_LIMIT)
        except subprocess.TimeoutExpired:
            threads = _threads_of(process.pid)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            pytest.fail(f"the grader made no progress for {RUN_LIMIT:g} s and was killed (issue #36: a hang of the "
                        f"trusted process); its threads:\n{threads}\nits output:\n"
                        f"{log.read_text(errors='replace')[-3000:]}")
    assert process.returncode in (0, 1), log.read_text(errors="replace")[-3000:]
    return time.monotonic() - start


def _check_verdicts(reports: dict[str, dict], kinds: dict[str, str]) -> None:
    assert set(reports) == set(kinds)
    for student, report in reports.items():
        (notebook,) = report["notebooks"]
        got = {e["id"]: (e["status"], e["reason"]) for e in notebook["exercises"] if e["track"] == "numpy"}
        assert {k: status for k, (status, _) in got.items()} == _expected(kinds[student]), (student, got)
        assert not [k for k, (_, reason) in got.items() if reason in ("stalled", "timeout", "crash", "hidden")], \
            (student, got)


@pytest.mark.parametrize("jobs", [2, 4])
def test_many_notebooks_side_by_side_with_blas_heavy_checks_never_hang(tmp_path, jobs):
    kinds = _students(tmp_path / "submissions", 12)
    (tmp_path / "heavy.py").write_text(HEAVY_CHECKS, encoding="utf-8")
    folders = sorted((tmp_path / "submissions").iterdir())
    seconds = _run([sys.executable, "-m", "companion.grade", *map(str, folders), "--jobs", str(jobs),
                    "--track", "numpy", "--chapters", "05", "--extra-checks", str(tmp_path / "heavy.py"),
                    "--json", str(tmp_path / "report.json"), "--quiet", "--timeout", "60"], tmp_path / "log.txt")
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    by_student = {Path(n["path"]).parent.name: {"notebooks": [n]} for n in report["notebooks"]}
    _check_verdicts(by_student, kinds)
    print(f"--jobs {jobs}: {len(folders)} notebooks in {seconds:.1f} s")


def test_a_class_graded_several_students_at_once_with_blas_heavy_checks_never_hangs(tmp_path):
    kinds = _students(tmp_path / "submissions", 6)
    (tmp_path / "heavy.py").write_text(HEAVY_CHECKS, encoding="utf-8")
    out = tmp_path / "out"
    seconds = _run([sys.executable, "-m", "companion.grade", "class", str(tmp_path / "submissions"), "--out", str(out),
                    "--jobs", "2", "--track", "numpy", "--chapters", "05", "--extra-checks",
                    str(tmp_path / "heavy.py"), "--timeout", "60", "--no-progress"], tmp_path / "log.txt")
    reports = {student: json.loads((out / "students" / student / "report.json").read_text(encoding="utf-8"))
               for student in kinds}
    _check_verdicts(reports, kinds)
    print(f"class of {len(kinds)} students, --jobs 2: {seconds:.1f} s")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process's limits in /proc")
def test_student_processes_start_without_fork_and_with_their_limits():
    """No ``preexec_fn`` (nor user or group), so CPython uses vfork(); the limits are still set, by rlimits.py."""
    import companion.grade.launcher as launcher

    seen: list[dict] = []
    real = launcher.subprocess.Popen

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            seen.append(kwargs)
            super().__init__(*args, **kwargs)

    launcher.subprocess.Popen = Recording
    try:
        child = Child(None, Limits(memory=3 * 10**9, cpu_seconds=1234, processes=0), sandbox=False)
    finally:
        launcher.subprocess.Popen = real
    try:
        (kwargs,) = seen
        assert kwargs.get("preexec_fn") is None
        assert all(kwargs.get(name) is None for name in ("user", "group", "extra_groups", "umask"))
        pid = child.process.pid
        deadline = time.monotonic() + 30
        while True:  # until rlimits.py has exec'd the student's program (before, the cmdline is ours, then its)
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"sandbox.child" in cmdline and b"rlimits.py" not in cmdline:
                break
            assert time.monotonic() < deadline, "the student process did not start"
            time.sleep(0.02)
        limits = Path(f"/proc/{pid}/limits").read_text()
    finally:
        child.kill()
    rows = {line[:26].strip(): line[26:].split()[:2] for line in limits.splitlines()[1:]}
    assert rows["Max cpu time"] == ["1234", "1239"]
    assert rows["Max address space"] == [str(3 * 10**9)] * 2
    assert rows["Max core file size"] == ["0", "0"]
    assert rows["Max file size"][0] != "unlimited"


def test_a_check_that_stalls_in_the_trusted_process_fails_alone_and_the_run_goes_on(tmp_path, monkeypatch):
    """A checker stuck in this process (here: waiting on an event nobody sets) is given up after its time limit
    and the grace; the exercise fails with reason `stalled`, the notebook's other exercises and the other
    notebooks are graded as usual."""
    kinds = _students(tmp_path, 3)
    release = threading.Event()
    stuck_checker = registry()[STUCK].checker
    real = steps._run_checker

    def stalling(checker, answer):
        if checker is stuck_checker:
            release.wait()  # in C (a lock), as the OpenBLAS livelock was: no Python line runs meanwhile
        return real(checker, answer)

    monkeypatch.setattr(steps, "_run_checker", stalling)
    monkeypatch.setattr(steps, "STALL_GRACE", 1.0)
    start = time.monotonic()
    try:
        report = grade(sorted(tmp_path.iterdir()), tracks=["numpy"], chapters=["05"], jobs=2, timeout=5)
        assert steps.stalled_checks() >= 1
    finally:
        release.set()
    seconds = time.monotonic() - start
    assert seconds < 60, f"the run took {seconds:.0f} s"
    for notebook in report.notebooks:
        kind = kinds[Path(notebook.path).parent.name]
        got = {e.id: e for e in notebook.exercises if e.track == "numpy"}
        stuck = got.pop(STUCK)  # its checker is stuck whatever the answer (the stub's too)
        assert (stuck.status, stuck.reason) == (FAILED, "stalled"), stuck
        assert "the grader stalled" in stuck.message and f"`{STUCK}`" in stuck.message
        expected = _expected(kind)
        assert {k: e.status for k, e in got.items()} == {k: v for k, v in expected.items() if k != STUCK}
    deadline = time.monotonic() + 10
    while steps.stalled_checks() and time.monotonic() < deadline:  # released: the given-up threads end
        time.sleep(0.05)
    assert steps.stalled_checks() == 0


STUCK_CHECKS = f'''"""A hidden check stuck in C code for good: the trusted process cannot get this thread back."""
import time


def check_{STUCK}(answer):
    time.sleep(10**6)
'''


def test_the_command_writes_its_reports_and_exits_when_a_check_is_stuck_for_good(tmp_path):
    kinds = _students(tmp_path / "submissions", 1)
    (tmp_path / "stuck.py").write_text(STUCK_CHECKS, encoding="utf-8")
    (folder,) = (tmp_path / "submissions").iterdir()
    arguments = [str(folder), "--track", "numpy", "--chapters", "05", "--extra-checks", str(tmp_path / "stuck.py"),
                 "--json", str(tmp_path / "report.json"), "--junit", str(tmp_path / "junit.xml"), "--timeout", "5"]
    script = ("import sys; import companion.grade.steps as steps; steps.STALL_GRACE = 2.0; "
              "from companion.grade.__main__ import main; sys.exit(main(sys.argv[1:]))")
    seconds = _run([sys.executable, "-c", script, *arguments], tmp_path / "log.txt")
    assert seconds < RUN_LIMIT
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert (tmp_path / "junit.xml").exists()
    got = {e["id"]: e for e in report["notebooks"][0]["exercises"] if e["track"] == "numpy"}
    assert (got[STUCK]["status"], got[STUCK]["reason"]) == (FAILED, "stalled")
    assert all(got[name]["status"] == PASSED for name in NUMPY_EXERCISES if name != STUCK), (kinds, got)
