"""Grade a whole class: ``python -m companion.grade class SUBMISSIONS --out DIR [--config grading.toml]``.

``SUBMISSIONS`` holds one folder per student (a clone of the student's repository, or what GitHub Classroom's
assistant downloads); the student's notebooks are in its ``exercises/`` folder (``notebooks`` in the instructor
file changes that; a student folder with no such folder is read directly). Each student is graded by the
single-student command, ``python -m companion.grade NOTEBOOKS --json ... --junit ...``, in a process of its own,
so a class gets exactly the isolation, time limits and messages of one student. ``--jobs`` students are graded at
the same time. Each job slot has a worker (:mod:`.classworker`) that imports the grading code and the frameworks
once and forks that command's process for each student, rather than starting it anew.

``DIR`` receives:

- ``gradebook.csv``: one row per student, one column of points per exercise, ``total``, ``max``, ``note``;
- ``grades_long.csv``: one row per student and exercise, with the status, reason and message;
- ``feedback/STUDENT.md``: the student's table, with the same messages;
- ``junit.xml``: one testsuite per student, one testcase per exercise;
- ``students/STUDENT/``: the grader's own JSON and JUnit reports, its log, and ``stamp.json``;
- ``canvas.csv``, ``github_classroom.csv``, ``gradescope/STUDENT/results.json``: the LMS exports (:mod:`.exports`);
- ``report.html`` and ``changes.csv``: the class report, and what changed since the last run (:mod:`.classreport`);
- ``class.json``: what :mod:`.merge` needs to combine shards (``--shard I/N``) into one folder.

Late penalties (``[late]`` in the instructor file, :mod:`.policy`) are applied with the points, after grading.

A re-run grades again only the students whose notebooks, grading settings or grading code changed since their
``stamp.json`` was written (``--force`` grades everyone). Points are applied afterwards, so changing them in the
instructor file re-writes the gradebook without grading anyone again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from . import exports, gradebook, merge, policy
from .classworker import ForkedGrader, Slots, WorkerLost
from .command import parse_size
from .gradebook import Settings
from .launcher import DEFAULT_MEMORY
from .steps import DEFAULT_TOTAL_TIMEOUT

NOTEBOOK_SUFFIXES = (".md", ".ipynb")
#: Set for the graders and their student processes (which keep them) to the cores per job slot, unless set: with
#: one compute thread per core in every slot, a checker's small tensors cost PyTorch's and MKL's threads a barrier
#: each, and slots that wait on one another's threads spend most of their time so.
COMPUTE_THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: Seconds allowed to a grader process beyond its steps' time limits (start-up: importing the frameworks).
STARTUP_ALLOWANCE = 300.0
_LOG_LIMIT = 200_000
#: Files that turn reports into points and class files: they change no student's report (nor does anything in
#: companion/instructor/, which builds test classes and the student edition).
_OWN_FILES = {"classroom.py", "gradebook.py", "policy.py", "exports.py", "classreport.py", "merge.py"}


_RUNNING: set[subprocess.Popen | ForkedGrader] = set()  # the graders running now, stopped on Ctrl-C
_LOCK = threading.Lock()
_CANCELLED = threading.Event()
_SLOTS = Slots()  # while grade_class runs: each job slot forks its graders from a worker


@dataclass
class Outcome:
    student: str
    report: dict | None
    note: str
    cached: bool
    seconds: float
    submitted: dict[str, str] | None = None  # chapter -> ISO time handed in (chapters with a due date)


def notebook_folder(student: Path, settings: Settings) -> Path:
    inner = student / settings.notebooks
    return inner if inner.is_dir() else student


def notebooks_to_grade(folder: Path, settings: Settings) -> list[Path]:
    """The student's notebooks of the due chapters (of every chapter when none is named); ``.md`` or ``.ipynb``,
    the more recently modified one when both exist.

    With extra checks and no chapters named, every notebook: the extra checks may add chapters the course lacks.
    """
    if not folder.is_dir():
        return []
    by_stem: dict[str, list[Path]] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix in NOTEBOOK_SUFFIXES and path.is_file():
            by_stem.setdefault(path.stem, []).append(path)
    if settings.chapters is None and settings.extra_checks is not None:
        return [path for paths in by_stem.values() for path in paths]
    due = settings.chapters or gradebook.known_chapters()
    return [max(by_stem[c], key=lambda p: (p.stat().st_mtime, p.suffix == ".ipynb")) for c in due if c in by_stem]


def grading_code_hash() -> str:
    """A hash of the package that grades (the checks, the grader and the companion they compare with)."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        if path.parent.name == "grade" and path.name in _OWN_FILES or path.parent.name == "instructor":
            continue
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def student_key(files: list[Path], settings: Settings, code: str, chapters_flag: str | None) -> str:
    """A hash of what decides a student's report: the notebooks, the grading settings and the grading code."""
    state = {"settings": settings.grading_key(), "code": code, "chapters_flag": chapters_flag}
    digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode())
    for path in files:
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def grader_command(files: list[Path], work: Path, settings: Settings, chapters_flag: str | None) -> list[str]:
    """The single-student command; flags the grader gained later are only passed when they are asked for."""
    command = [sys.executable, "-m", "companion.grade", *map(str, files), "--json", str(work / "report.json"),
               "--junit", str(work / "junit.xml"), "--timeout", f"{settings.timeout:g}",
               "--track", ",".join(settings.tracks), "--quiet"]
    if chapters_flag:
        command += ["--chapters", chapters_flag]
    if settings.extra_checks is not None:
        command += ["--extra-checks", str(settings.extra_checks)]
    if settings.memory:
        command += ["--memory", settings.memory]
    return command


def _stop(process: subprocess.Popen | ForkedGrader) -> None:
    """Interrupt the grader (it then ends its workers), and kill what is left of its process group."""
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def grade_student(student: Path, work: Path, settings: Settings, code: str, force: bool,
                  chapters_flag: str | None) -> Outcome:
    """Grade one student into ``work`` (or reuse the report there when nothing changed)."""
    start = time.perf_counter()
    name = student.name
    folder = notebook_folder(student, settings)
    files = notebooks_to_grade(folder, settings)
    work.mkdir(parents=True, exist_ok=True)
    stamp_path, report_path = work / "stamp.json", work / "report.json"
    submitted = policy.submission_times(name, student, files, settings.late)
    try:
        key = student_key(files, settings, code, chapters_flag)
    except OSError as error:
        return Outcome(name, None, f"cannot read the notebooks: {error}", False, 0.0, submitted)
    if not force and stamp_path.exists():
        try:
            stamp = json.loads(stamp_path.read_text(encoding="utf-8"))
            if stamp.get("key") == key:
                report = json.loads(report_path.read_text(encoding="utf-8")) if stamp.get("report") else None
                return Outcome(name, report, stamp.get("note", ""), True, time.perf_counter() - start, submitted)
        except (OSError, ValueError):
            pass  # a stamp or report cut short: grade again
    stamp_path.unlink(missing_ok=True)
    report_path.unlink(missing_ok=True)
    report, note, waited = None, "", 0.0
    if not files:
        due = ", ".join(settings.chapters) if settings.chapters else "any chapter"
        note = f"no notebook of {due} in {folder.name}/" if folder.is_dir() else "the folder cannot be read"
    else:
        whole_folder = settings.chapters is None and settings.extra_checks is not None
        report, note, waited = _run_grader([folder] if whole_folder else files, work, settings, chapters_flag)
    if report is not None or not files:  # a grader that failed or was stopped is tried again next time
        stamp = {"key": key, "note": note, "report": report is not None, "files": [p.name for p in files],
                 "seconds": round(time.perf_counter() - start, 3), "worker_start_seconds": round(waited, 3)}
        stamp_path.write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
    return Outcome(name, report, note, False, time.perf_counter() - start, submitted)


def _run_grader(files: list[Path], work: Path, settings: Settings, chapters_flag: str | None
                ) -> tuple[dict | None, str, float]:
    """The grader's report (None when it gave none), a note, and the seconds spent waiting for the slot's worker
    to start (its imports: once per slot)."""
    command = grader_command(files, work, settings, chapters_flag)
    limit = settings.student_timeout or STARTUP_ALLOWANCE + DEFAULT_TOTAL_TIMEOUT  # the grader's own limit ends first
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONHASHSEED": "0"}
    for name in COMPUTE_THREADS:  # unless the instructor's environment says otherwise
        env.setdefault(name, str(_SLOTS.threads))
    log = work / "log.txt"
    worker = _SLOTS.worker(env, _memory(settings)) if command[:3] == [sys.executable, "-m", "companion.grade"] \
        else None
    with log.open("wb") as output:
        output.write(("$ " + shlex.join(command) + "\n").encode())
        output.flush()
        waiting = time.perf_counter()
        if worker is not None:
            try:
                worker.wait_ready()
            except WorkerLost:
                worker = _SLOTS.drop()
        waited = time.perf_counter() - waiting
        with _LOCK:
            if _CANCELLED.is_set():
                return None, "interrupted", waited
            process: subprocess.Popen | ForkedGrader | None = None
            if worker is not None:
                try:  # its own session too; the same command, forked from the slot's worker
                    process = worker.start(command[3:], str(log))
                    if process.shared is False:
                        _SLOTS.count_unshared()
                except WorkerLost:
                    _SLOTS.drop()
            if process is None:
                # Its own session: Ctrl-C reaches the class grader only, which then stops every grader it started.
                process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output,
                                           stderr=subprocess.STDOUT, env=env, start_new_session=True)
            _RUNNING.add(process)
        try:
            code = process.wait(limit)
        except subprocess.TimeoutExpired:
            _stop(process)
            return None, f"grading did not finish within {limit:g} s (the grader was stopped)", waited
        finally:
            with _LOCK:
                _RUNNING.discard(process)
        if _CANCELLED.is_set():
            return None, "interrupted", waited
    if log.stat().st_size > _LOG_LIMIT:
        data = log.read_bytes()
        log.write_bytes(data[: _LOG_LIMIT // 2] + b"\n[... cut ...]\n" + data[-_LOG_LIMIT // 2:])
    try:
        report = json.loads((work / "report.json").read_text(encoding="utf-8"))
        if not isinstance(report, dict) or not isinstance(report.get("notebooks"), list):
            raise ValueError("not a grader report")
    except (OSError, ValueError) as error:
        lines = [" ".join(line.split()) for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
        last = next((line for line in reversed(lines) if line), "no output")
        reason = "it wrote no report" if isinstance(error, FileNotFoundError) else f"its report is unusable: {error}"
        return None, f"the grader failed (exit status {code}; {reason}): {last[-300:]}", waited
    if code not in (0, 1):
        return report, f"the grader ended with exit status {code}", waited
    return report, "", waited


def _memory(settings: Settings) -> int:
    """The students' memory limit in bytes (the grader itself reports a value it cannot read)."""
    try:
        return parse_size(settings.memory) if settings.memory else DEFAULT_MEMORY
    except argparse.ArgumentTypeError:
        return DEFAULT_MEMORY


def settings_from(args: argparse.Namespace) -> tuple[Settings, str | None]:
    """Defaults, then the instructor file, then the command line."""
    settings = gradebook.load_settings(args.config) if args.config else Settings()
    chapters_flag = None
    if args.extra_checks:
        settings.extra_checks = Path(args.extra_checks).resolve()
    if args.chapters:
        settings.chapters = gradebook.resolve_chapters(args.chapters.split(","),
                                                       allow_unknown=settings.extra_checks is not None)
        chapters_flag = ",".join(settings.chapters)
    if args.track:
        settings.tracks = gradebook.resolve_tracks(args.track.split(","))
    for key in ("timeout", "student_timeout", "memory", "notebooks"):
        if getattr(args, key) is not None:
            setattr(settings, key, getattr(args, key))
    if settings.extra_checks is not None and not settings.extra_checks.is_file():
        raise ValueError(f"extra checks: no such file {settings.extra_checks}")
    return settings, chapters_flag


def grader_options() -> str:
    """The single-student grader's ``--help`` text, to see which options it has."""
    done = subprocess.run([sys.executable, "-m", "companion.grade", "--help"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return done.stdout


def check_grader_options(settings: Settings, chapters_flag: str | None) -> str | None:
    """Refuse options the grader lacks; drop ``--chapters`` there (choosing the files already restricts the
    chapters). Returns the ``--chapters`` value to pass."""
    wanted = ["--extra-checks"] * (settings.extra_checks is not None) + ["--memory"] * bool(settings.memory)
    if not wanted and not chapters_flag:
        return chapters_flag
    options = grader_options()
    missing = [flag for flag in wanted if flag not in options]
    if missing:
        raise ValueError(f"this version of the grader (python -m companion.grade) has no {', '.join(missing)} option")
    return chapters_flag if chapters_flag and "--chapters" in options else None


def students_in(submissions: Path) -> list[Path]:
    if not submissions.is_dir():
        raise ValueError(f"SUBMISSIONS must be a folder holding one folder per student; got {submissions}")
    return sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))


def grade_class(submissions: str | Path, out: str | Path, settings: Settings | None = None, jobs: int | None = None,
                force: bool = False, progress: bool = True, chapters_flag: str | None = None,
                shard: tuple[int, int] | None = None, share_sandbox: bool = True,
                ) -> tuple[list[gradebook.StudentGrades], list[Outcome]]:
    """Grade every student folder of ``submissions`` (those of ``shard`` ``(I, N)`` only, when given) and write
    the gradebook into ``out``; see the module doc. ``share_sandbox=False``: no shared zygote in the workers
    (each student's grader starts its own sandboxed zygote; the grades are the same, only slower)."""
    settings = settings or Settings()
    jobs = jobs or os.cpu_count() or 1
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1; got {jobs}")
    out = Path(out)
    students = [s for s in students_in(Path(submissions)) if s.resolve() != out.resolve()]
    names: dict[str, str] = {}  # student -> folder name under out/students, unique
    for student in students:
        base = candidate = gradebook.safe_name(student.name)
        while candidate in names.values():
            candidate = f"{base}-{len(names)}"
        names[student.name] = candidate
    everyone = [s.name for s in students]
    # Import every chapter's checks now, in this thread: registry() is not safe to call for the first time from
    # several threads at once (one may see a chapter whose module another is still importing).
    gradebook.known_chapters()
    students = [s for position, s in enumerate(students) if merge.in_shard(position, shard)]
    roster = exports.read_roster(settings.roster) if settings.roster else None
    chapters_flag = check_grader_options(settings, chapters_flag)
    code = grading_code_hash()
    outcomes: dict[str, Outcome] = {}
    from tqdm import tqdm

    bar = tqdm(total=len(students), unit="student", disable=not progress, file=sys.stderr, dynamic_ncols=True)
    _CANCELLED.clear()
    _SLOTS.open(share_sandbox, threads=max(1, (os.cpu_count() or 1) // jobs))
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = {pool.submit(grade_student, s, out / "students" / names[s.name], settings, code, force,
                               chapters_flag): s for s in students}
        for future in as_completed(futures):
            student = futures[future]
            try:
                outcome = future.result()
            except Exception as error:  # a bug of ours must not lose the other students' grades
                outcome = Outcome(student.name, None, f"the class grader failed: {type(error).__name__}: {error}",
                                  False, 0.0)
            outcomes[student.name] = outcome
            bar.set_postfix_str(f"{student.name}{' (unchanged)' if outcome.cached else ''}", refresh=False)
            bar.update()
    except KeyboardInterrupt:
        _CANCELLED.set()
        with _LOCK:
            running = list(_RUNNING)
        for process in running:
            _stop(process)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _SLOTS.close()
        bar.close()
    ordered = [outcomes[s.name] for s in students]
    records = [merge.StudentRecord(o.student, names[o.student], o.report, o.note, o.submitted or {}) for o in ordered]
    recorded = merge.settings_json(settings, roster, exports.hidden_exercises(settings.extra_checks))
    grades = merge.write_class(out, records, settings, recorded, everyone, shard)
    return grades, ordered


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m companion.grade class",
        description="Grade a class: one folder per student, graded each in its own process; writes a gradebook.",
        epilog="example: python -m companion.grade class submissions/ --out grades/ --config grading.toml",
    )
    p.add_argument("submissions", type=Path, help="folder holding one folder per student")
    p.add_argument("--out", type=Path, required=True, help="folder for the gradebook, feedback and reports")
    p.add_argument("--config", type=Path, help="instructor file (see grading.toml): chapters, tracks, points")
    p.add_argument("--jobs", "-j", type=int, default=None, help="students graded at the same time (default: cores)")
    p.add_argument("--chapters", help="due chapters, comma-separated names or numbers (default: every chapter); "
                                      "also passed to the grader")
    p.add_argument("--track", help="tracks to grade, e.g. numpy,torch (default: all)")
    p.add_argument("--timeout", type=float, help="seconds allowed to each exercise's check (default 60)")
    p.add_argument("--student-timeout", type=float, help="seconds allowed to one student's whole grading")
    p.add_argument("--extra-checks", help="the instructor's extra checks, passed to the grader")
    p.add_argument("--memory", help="memory limit per grading process, passed to the grader")
    p.add_argument("--notebooks", help="folder of the notebooks inside a student's folder (default: exercises)")
    p.add_argument("--shard", type=merge.parse_shard_argument, metavar="I/N",
                   help="grade only the I-th of N slices of the sorted roster (merge them with `companion.grade "
                        "merge`)")
    p.add_argument("--force", action="store_true", help="grade every student again, even if nothing changed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings, chapters_flag = settings_from(args)
        for key in ("timeout", "student_timeout"):
            value = getattr(settings, key)
            if value is not None and value <= 0:
                raise ValueError(f"--{key.replace('_', '-')} must be a positive number of seconds; got {value}")
        start = time.perf_counter()
        grades, outcomes = grade_class(args.submissions, args.out, settings, args.jobs, args.force,
                                       not args.no_progress, chapters_flag, args.shard)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: students graded so far are kept; run again to go on", file=sys.stderr)
        return 130
    width = max([len(g.student) for g in grades] + [7])
    for g in grades:
        print(f"{g.student:<{width}}  {gradebook._points(g.total):>5} / {gradebook._points(g.max_points):<5}"
              f"  {g.summary}".rstrip())
    cached = sum(o.cached for o in outcomes)
    print(f"{len(grades)} students ({cached} unchanged since the last run) in {time.perf_counter() - start:.1f} s; "
          f"gradebook: {args.out / 'gradebook.csv'}, feedback: {args.out / 'feedback'}, class report: "
          f"{args.out / 'report.html'}")
    if _SLOTS.unshared:
        print(f"note: {_SLOTS.unshared} students were graded without the shared sandbox (it could not start), each "
              f"in sandboxes of its own: as isolated, but slower", file=sys.stderr)
    return 0
