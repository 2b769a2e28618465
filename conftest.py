"""Test-session set-up shared by the unit tests and nbval.

nbval reads only ``.ipynb``; the chapters and solutions are MyST Markdown. Before collection, the controller
process writes an ``.ipynb`` next to each source (ignored by git) so relative paths behave as in the book.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Set before any test imports TensorFlow or torch: quiet logs, one thread per test worker. TensorFlow keeps its
# default numerics (oneDNN on), the setting of the book and of a reader's Jupyter: the tests check what they run.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).parent
NOTEBOOK_DIRS = ("notebooks", "solutions")


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller has converted already
        return
    if not config.getoption("--nbval-lax", default=False) and not config.getoption("--nbval", default=False):
        return
    import jupytext

    for folder in NOTEBOOK_DIRS:
        for source in sorted((ROOT / folder).glob("*.md")):
            target = source.with_suffix(".ipynb")
            if target.exists() and target.stat().st_mtime >= source.stat().st_mtime:
                continue
            try:
                jupytext.write(jupytext.read(source), target)
            except Exception as error:  # say which notebook is broken instead of an INTERNALERROR traceback
                raise pytest.UsageError(f"cannot convert {source.relative_to(ROOT)} for nbval: {error}") from error


def pytest_ignore_collect(collection_path: Path, config):
    # Only the jupytext conversions are notebooks; the exercises are expected to fail their checks.
    if collection_path.suffix == ".ipynb" and collection_path.parent.name == "exercises":
        return True
    return None


_notebook_cells: dict[str, list[str]] = {}


def pytest_runtest_logreport(report) -> None:
    # Runs in the controller for every test, xdist workers included: tally notebook cells per file.
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb") and report.when == "call":
        _notebook_cells.setdefault(path, []).append(report.outcome)


def pytest_terminal_summary(terminalreporter) -> None:
    if not _notebook_cells:
        return
    terminalreporter.section("notebooks run by nbval")
    for path, outcomes in sorted(_notebook_cells.items()):
        failed = sum(o == "failed" for o in outcomes)
        status = "FAILED" if failed else "ok"
        terminalreporter.write_line(f"{path}: {len(outcomes)} cells, {failed} failed: {status}")
