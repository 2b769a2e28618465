"""Imported by the fork server before it forks the grading processes: the frameworks and every companion module.

``COMPANION_GRADE_PRELOAD`` (set by the runner before the server starts) names the frameworks to import,
e.g. ``torch,keras``. Their start-up messages on stdout and stderr are silenced, so they do not mix with the
grader's table; each worker then starts with everything imported and only the student's definitions to load.
"""

import importlib
import os

from companion.grade.worker import FRAMEWORKS, preload_companion


def _preload() -> None:
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        for framework in os.environ.get("COMPANION_GRADE_PRELOAD", "").split(","):
            for module in FRAMEWORKS.get(framework.strip(), ()):
                try:
                    importlib.import_module(module)
                except ImportError:
                    break
        preload_companion()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


_preload()
