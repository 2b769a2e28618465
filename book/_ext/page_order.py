"""Reading the book's pages in parallel, the longest first (``make book`` runs Sphinx with two processes).

Sphinx reads pages in parallel by cutting the sorted list of pages into a few long runs (``make_chunks``), one
process per run. Most of this book's reading time is the execution of a few chapters (chapter 7 alone is about
two fifths of it), so a run that happens to hold two of them sets the length of the whole build. Here every page is
a run of its own and the pages start heaviest first: while one process executes the longest chapter, the other
works through the rest (the longest-first rule of scheduling). A page's weight is a guess made before anything
runs: executed notebooks before plain pages, and among each, the longer source first.

Sphinx's ``ParallelTasks`` starts the first tasks it is given in order, one per process, and keeps the others
waiting; when a process frees up it starts the waiting task it was given *last* (``dict.popitem``). Handed over in
plain order, the third-heaviest chapter would start after every short page. So the chunks past the first ``nproc``
are handed over in reverse, and start heaviest first (tests/test_page_order.py runs Sphinx's own ``ParallelTasks``
to check the order they start in).

Sphinx reads in one process if any extension does not declare itself safe to run in several. Three that
jupyter-book loads say nothing; what they do was read (in the versions this course installs) and is safe, so
:data:`SAFE_BY_READING` declares it for them. A build with one process (``jupyter-book build .``) reads in Sphinx's
own order; nothing here changes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sphinx.builders
from course_book import API_LINE  # the line that makes a page document a module (book/_ext)
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment

# Extension -> why it is safe to read and write pages in several processes.
SAFE_BY_READING = {
    "sphinx_multitoc_numbering": "numbers sections after reading, in the main process (env-updated)",
    "sphinx-mathjax-offline": "sets mathjax_path and copies MathJax once the build has finished",
    "sphinx_jupyterbook_latex": "its transforms change only the page being read; the rest is for LaTeX builders",
}
NOTEBOOK_MARK = "{code-cell}"  # a MyST notebook's code cells; MyST-NB executes a page that has them


def one_page_per_chunk(docnames: list[str], nproc: int, maxbatch: int = 10) -> list[list[str]]:
    """Sphinx's ``make_chunks`` with a chunk of one page each, in the order that makes ``ParallelTasks`` start
    them in the order of ``docnames``: the first ``nproc`` as they are, the rest reversed (it starts the waiting
    task it was given last)."""
    chunks = [[name] for name in docnames]
    return chunks[:nproc] + chunks[nproc:][::-1]


def page_weight(path: Path) -> tuple[bool, bool, int]:
    """The sort key of a page: (does it import the whole package?, is it executed?, size of its source in bytes).

    The API page comes first: its autodoc imports PyTorch, Keras and every module of the companion, about 20 s, the
    longest page of a translated edition, where no notebook runs."""
    text = path.read_text(encoding="utf-8")
    return API_LINE.search(text) is not None, NOTEBOOK_MARK in text, len(text.encode("utf-8"))


def heaviest_first(app: Sphinx, env: BuildEnvironment, docnames: list[str]) -> None:
    """Reorder the pages to read (in place, as the ``env-before-read-docs`` event allows), heaviest first."""
    if app.parallel > 1:
        docnames.sort(key=lambda name: page_weight(Path(env.doc2path(name))), reverse=True)


def schedule_pages(app: Sphinx) -> None:
    if app.parallel > 1:
        sphinx.builders.make_chunks = one_page_per_chunk  # the name the builders' read and write loops call
        for name in SAFE_BY_READING.keys() & app.extensions.keys():
            app.extensions[name].parallel_read_safe = app.extensions[name].parallel_write_safe = True


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", schedule_pages)
    app.connect("env-before-read-docs", heaviest_first)
    return {"version": "0.1", "parallel_read_safe": True, "parallel_write_safe": True}
