"""How fast a class is graded, and where the time goes: a synthetic class, every chapter, ``companion.grade class``.

The class (companion/instructor/synthetic.py) mixes right answers, stubs, typical mistakes and broken students (a
missing notebook, a non-UTF-8 file, a cut-off .ipynb, an answer that loops until the time limit). The script
prints the students graded per minute and a breakdown of the time, summed over the students (seconds of a job
slot, so the sum is about ``--jobs`` times the wall time):

- checks: the exercises' checks (the student's code and the checker's reference computations);
- loading answers: the rest of each notebook's grading (parsing it, loading its cells into the student process);
- sandbox start: the grader's time outside its notebooks: reading them, and getting the slot's shared student-process
  server (a zygote under bubblewrap that imported NumPy, PyTorch and TensorFlow once) emptied of the previous
  student and given this student's notebooks;
- grader process: the forked grader's time outside its grading (its start, the reports it writes);
- worker start: waiting for a job slot's worker to import the grading code and the frameworks and to start its
  shared server (once per slot).

It also times one start of that server here (paid once per job slot, and again only after a student broke it),
then grades the same class again (nothing changed: every student is read from the stamps) and prints how much
faster the re-run is.

    .venv/bin/python benchmarks/bench_grading.py [--students 40] [--jobs N] [--timeout 10]

Goal: 200 students in under 10 minutes on an idle 2-core machine. The load average is printed with the figures:
on a shared machine they are inflated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from companion.grade import classroom  # noqa: E402
from companion.grade.gradebook import Settings  # noqa: E402
from companion.instructor import synthetic  # noqa: E402


def breakdown(out: Path) -> dict[str, float]:
    """Seconds summed over the students graded into ``out``, by part (see the module's doc)."""
    parts = dict.fromkeys(("checks", "loading answers", "sandbox start", "grader process", "worker start"), 0.0)
    for folder in sorted((out / "students").iterdir()):
        stamp_path, report_path = folder / "stamp.json", folder / "report.json"
        if not stamp_path.exists():
            continue
        stamp = json.loads(stamp_path.read_text(encoding="utf-8"))
        waited = float(stamp.get("worker_start_seconds", 0.0))
        parts["worker start"] += waited
        student = float(stamp.get("seconds", 0.0)) - waited
        if not report_path.exists():  # the grader was stopped or wrote nothing: all of it is the grader's
            parts["grader process"] += student
            continue
        report = json.loads(report_path.read_text(encoding="utf-8"))
        notebooks = sum(float(n.get("seconds", 0.0)) for n in report["notebooks"])
        checks = sum(float(e.get("seconds", 0.0)) for n in report["notebooks"] for e in n.get("exercises", []))
        parts["checks"] += checks
        parts["loading answers"] += notebooks - checks
        parts["sandbox start"] += float(report.get("seconds", 0.0)) - notebooks
        parts["grader process"] += student - float(report.get("seconds", 0.0))
    return parts


def server_start_seconds() -> float:
    """One start of the sandboxed student-process server with both frameworks, until it is ready."""
    from companion.grade import forkserver, launcher

    with tempfile.TemporaryDirectory() as tmp:
        notebook = Path(tmp) / "01_text_as_numbers.md"
        notebook.write_text("", encoding="utf-8")
        usable, _ = launcher.sandbox_status()
        start = time.perf_counter()
        zygote = forkserver.Zygote((notebook.parent, ("torch", "keras")), [notebook], ["torch", "keras"],
                                   launcher.Limits(cpu_seconds=600), usable)
        try:
            zygote.wait_ready(time.monotonic() + 600)
            return time.perf_counter() - start
        finally:
            zygote.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per exercise check (an endless loop "
                                                                    "costs this much)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        submissions, out = Path(tmp) / "submissions", Path(tmp) / "out"
        manifest = synthetic.build_class(submissions, students=args.students)
        settings = Settings(timeout=args.timeout)
        load = os.getloadavg()[0]
        start = time.perf_counter()
        grades, _ = classroom.grade_class(submissions, out, settings, jobs=args.jobs, progress=True)
        first = time.perf_counter() - start
        load_during = os.getloadavg()[1]  # the 5-minute average, at the end of the first run
        parts = breakdown(out)
        start = time.perf_counter()
        _, again = classroom.grade_class(submissions, out, settings, jobs=args.jobs, progress=False)
        second = time.perf_counter() - start
        wrong = [g.student for g in grades
                 if {x.exercise: x.points > 0 for x in g.grades} != manifest[g.student]["expected"]]
    server = server_start_seconds()
    print(f"{len(grades)} students, every chapter, {args.jobs} at a time, {os.cpu_count()} cores, load average "
          f"{load:.1f} before, {load_during:.1f} over the last 5 minutes of the run")
    print(f"first run : {first:7.1f} s = {len(grades) / first * 60:.1f} students per minute "
          f"({'under' if first < 600 else 'OVER'} 10 minutes)")
    total = sum(parts.values())
    print(f"where the time went, summed over the students ({total:.0f} s of job slots, {args.jobs} slots x "
          f"{first:.0f} s = {args.jobs * first:.0f} s available):")
    for name, seconds in parts.items():
        print(f"  {name:<16} {seconds:8.1f} s  {100 * seconds / total if total else 0:5.1f}%  "
              f"{seconds / len(grades):6.2f} s per student")
    print(f"  one start of the sandboxed student-process server (bubblewrap, NumPy, PyTorch, TensorFlow): "
          f"{server:.2f} s, once per job slot (its students share it)")
    print(f"re-run    : {second:7.1f} s ({sum(o.cached for o in again)} of {len(again)} unchanged), "
          f"{first / second:.0f}x faster than the first run")
    print(f"grades as the builder expected: {len(grades) - len(wrong)} of {len(grades)} students"
          + (f" (differ: {', '.join(wrong)})" if wrong else ""))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
