"""The single-student command: ``python -m companion.grade PATH... [--junit FILE] [--json FILE] ...``.

:mod:`companion.grade.__main__` runs it (and dispatches ``class`` and ``merge``); a class worker
(:mod:`.classworker`) runs it in each grader it forks.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from companion.checks import TRACKS

from . import report as reports
from .launcher import DEFAULT_MEMORY
from .results import clean_text
from .runner import DEFAULT_OUTPUT_LIMIT, DEFAULT_TIMEOUT, DEFAULT_TOTAL_TIMEOUT, grade
from .steps import stalled_checks

EPILOG = """\
The chapter of a notebook is its file name without extension (exercises/02_attention.md is chapter
02_attention). Only the notebook's imports, functions and classes are loaded, in a separate, contained
process (bubblewrap where it works: the table says `sandbox: on` or `off`); its other statements (check
cells, prints, experiments) never run. A folder must hold every chapter's notebook (or those of --chapters):
a missing or renamed notebook scores zero. Exit status: 0 when every expected exercise passes, 1 otherwise,
2 for a usage error.

examples:
  python -m companion.grade exercises/01_text_as_numbers.md
  python -m companion.grade exercises --track torch
  python -m companion.grade exercises --junit grade.xml --json grade.json
  python -m companion.grade exercises --chapters 01,02 --extra-checks instructor_checks.py
"""


def _tracks(text: str) -> list[str]:
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in TRACKS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose among {','.join(TRACKS)} (comma-separated); got {text!r}")
    return chosen


def _chapters(text: str) -> list[str]:
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    if not chosen:
        raise argparse.ArgumentTypeError(f"expected chapters such as 01,02; got {text!r}")
    return chosen


def parse_size(text: str) -> int:
    """A memory size such as ``4G`` or ``2000000000``, in bytes (at least 256 MB); ``--memory``'s type."""
    units = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    raw = text.strip().lower().removesuffix("b")
    factor = units.get(raw[-1:], 1)
    try:
        value = int(float(raw[:-1] if raw[-1:] in units else raw) * factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size in bytes such as 4G or 2000000000; got {text!r}") from None
    if value < 2**28:
        raise argparse.ArgumentTypeError(f"the memory limit must be at least 256 MB; got {text!r}")
    return value


def _positive(kind: type) -> Callable[[str], float]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number; got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number; got {text!r}")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m companion.grade",
        description="Grade exercise notebooks (MyST .md or .ipynb) with the course's checks.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="notebooks, or folders of notebooks")
    parser.add_argument("--junit", metavar="FILE", help="write a JUnit XML report (one testcase per exercise)")
    parser.add_argument("--json", metavar="FILE", help="write a JSON report")
    parser.add_argument("--timeout", type=_positive(float), default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="time allowed to each exercise's check and to loading each cell "
                             f"(default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--total-timeout", type=_positive(float), default=DEFAULT_TOTAL_TIMEOUT, metavar="SECONDS",
                        help="time allowed to the whole run; what is not checked by then fails and the reports are "
                             f"written (default {DEFAULT_TOTAL_TIMEOUT:g})")
    parser.add_argument("--track", type=_tracks, default=list(TRACKS), metavar="TRACKS",
                        help="grade only these tracks, e.g. --track torch (numpy exercises are always graded; "
                             "default: numpy,torch,keras)")
    parser.add_argument("--jobs", "-j", type=_positive(int), default=1, metavar="N",
                        help="notebooks graded at the same time (default 1)")
    parser.add_argument("--output-limit", type=_positive(int), default=DEFAULT_OUTPUT_LIMIT, metavar="CHARS",
                        help=f"printed output kept per exercise for the reports (default {DEFAULT_OUTPUT_LIMIT})")
    parser.add_argument("--chapters", type=_chapters, default=None, metavar="LIST",
                        help="the chapters expected, e.g. 01,02 (default: every chapter when a folder is graded)")
    parser.add_argument("--memory", type=parse_size, default=DEFAULT_MEMORY, metavar="BYTES",
                        help=f"address-space limit of the student's process (default {DEFAULT_MEMORY // 10**9}G)")
    parser.add_argument("--extra-checks", metavar="PATH", default=None,
                        help="an instructor's Python file of extra checks (functions check_<exercise id>); a "
                             "failure reads 'hidden check failed'")
    parser.add_argument("--sandbox", choices=("auto", "on", "off"), default="auto",
                        help="run student code under bubblewrap: auto (where it works), on (required), off")
    parser.add_argument("--quiet", "-q", action="store_true", help="print only the total")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Grade the notebooks ``argv`` names; the exit status (0: every expected exercise passed, 1, 2: usage)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # The command's own process: TensorFlow's start-up log would fill the terminal (numerics are left alone).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    args = parser().parse_args(argv)
    printed: dict[int, str] = {}
    next_index = [0]

    def show(index: int, notebook) -> None:  # print the notebooks in the order given, as they finish
        printed[index] = reports.notebook_table(notebook)
        while next_index[0] in printed:
            table = printed.pop(next_index[0])
            if not args.quiet:
                print(table, flush=True)
            next_index[0] += 1

    try:
        result = grade(
            args.paths,
            timeout=args.timeout,
            tracks=args.track,
            jobs=args.jobs,
            output_limit=args.output_limit,
            on_notebook=show,
            chapters=args.chapters,
            memory=args.memory,
            extra_checks=args.extra_checks,
            sandbox=args.sandbox,
            total_timeout=args.total_timeout,
        )
    except (ValueError, RuntimeError) as error:
        print(f"python -m companion.grade: error: {clean_text(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: no report written", file=sys.stderr)
        return 130
    if args.junit:
        reports.write_junit(result, args.junit)
    if args.json:
        reports.write_json(result, args.json)
    print(reports.summary(result))
    code = 0 if result.ok else 1
    if stalled_checks():
        # A checker the watchdog gave up is still stuck in C code (a math library's lock or spin): the reports are
        # written, and ending the interpreter normally could wait on that thread's locks for ever.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
