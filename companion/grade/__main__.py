"""Command line: ``python -m companion.grade PATH... [--junit FILE] [--json FILE] [--timeout SECONDS] ...``.

``python -m companion.grade class ...`` grades a class (:mod:`.classroom`), ``python -m companion.grade merge ...``
combines the shards of a class (:mod:`.merge`); anything else is the single-student command (:mod:`.command`).
"""

from __future__ import annotations

import os
import sys

from .command import parser

__all__ = ["main", "parser"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The command's own process: TensorFlow's start-up log would fill the terminal (numerics are left alone).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if argv and argv[0] == "class":  # grade a whole class: companion/grade/classroom.py
        from .classroom import main as class_main
        return class_main(argv[1:])
    if argv and argv[0] == "merge":  # combine the shards of a class: companion/grade/merge.py
        from .merge import main as merge_main
        return merge_main(argv[1:])
    from .command import main as grade_main

    return grade_main(argv)


if __name__ == "__main__":
    sys.exit(main())
