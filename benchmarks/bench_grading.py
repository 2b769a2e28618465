"""How fast a class is graded: a synthetic class of 40 students, every chapter, ``python -m companion.grade class``.

The class (companion/grade/synthetic.py) mixes right answers, stubs, typical mistakes and broken students (a
missing notebook, a non-UTF-8 file, a cut-off .ipynb, an answer that loops until the time limit). The script
prints the students graded per minute, then grades the same class again (nothing changed: every student is read
from the stamps) and prints how much faster the re-run is, measured in the same process.

    .venv/bin/python benchmarks/bench_grading.py [--students 40] [--jobs N] [--timeout 10]

Goal: 40 students in under 10 minutes on an idle 2-core machine. The load average is printed with the figures:
on a shared machine they are inflated.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from companion.grade import classroom, synthetic  # noqa: E402
from companion.grade.gradebook import Settings  # noqa: E402


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
        start = time.perf_counter()
        _, again = classroom.grade_class(submissions, out, settings, jobs=args.jobs, progress=False)
        second = time.perf_counter() - start
        wrong = [g.student for g in grades
                 if {x.exercise: x.points > 0 for x in g.grades} != manifest[g.student]["expected"]]
    print(f"{len(grades)} students, every chapter, {args.jobs} at a time, {os.cpu_count()} cores, "
          f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"first run : {first:7.1f} s = {len(grades) / first * 60:.1f} students per minute "
          f"({'under' if first < 600 else 'OVER'} the 10-minute goal)")
    print(f"re-run    : {second:7.1f} s ({sum(o.cached for o in again)} of {len(again)} unchanged), "
          f"{first / second:.0f}x faster than the first run")
    print(f"grades as the builder expected: {len(grades) - len(wrong)} of {len(grades)} students"
          + (f" (differ: {', '.join(wrong)})" if wrong else ""))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
