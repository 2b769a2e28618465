"""`make book` reads two pages at a time, the heaviest first (book/_ext/page_order.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import page_order  # noqa: E402


def _pages(tmp_path: Path) -> dict[str, Path]:
    pages = {
        "short_plain": "# A\n\nsome text\n",
        "long_plain": "# B\n\n" + "a long page with no code at all\n" * 200,
        "short_notebook": "# C\n\n```{code-cell} ipython3\n1 + 1\n```\n",
        "long_notebook": "# D\n\n" + "```{code-cell} ipython3\nprint('many cells')\n```\n" * 20,
    }
    for name, text in pages.items():
        (tmp_path / f"{name}.md").write_text(text, encoding="utf-8")
    return {name: tmp_path / f"{name}.md" for name in pages}


def test_notebooks_are_read_before_plain_pages_and_longer_before_shorter(tmp_path: Path) -> None:
    paths = _pages(tmp_path)
    env = SimpleNamespace(doc2path=lambda name: str(paths[name]))
    docnames = sorted(paths)
    page_order.heaviest_first(SimpleNamespace(parallel=2), env, docnames)
    assert docnames == ["long_notebook", "short_notebook", "long_plain", "short_plain"]


def test_one_process_keeps_sphinxs_order(tmp_path: Path) -> None:
    paths = _pages(tmp_path)
    env = SimpleNamespace(doc2path=lambda name: str(paths[name]))
    docnames = sorted(paths)
    page_order.heaviest_first(SimpleNamespace(parallel=1), env, docnames)
    assert docnames == sorted(paths)


def test_every_page_is_a_chunk_of_its_own() -> None:
    chunks = page_order.one_page_per_chunk(["a", "b", "c", "d", "e"], 2)
    assert sorted(chunks) == [["a"], ["b"], ["c"], ["d"], ["e"]]


@pytest.mark.parametrize("jobs", [2, 3])
def test_sphinx_starts_the_pages_in_the_order_given(tmp_path: Path, jobs: int) -> None:
    """Sphinx's own ParallelTasks, given the chunks, starts them heaviest first: the third-heaviest page must not
    wait for every short one (Sphinx starts the waiting task it was given last)."""
    from sphinx.util.parallel import ParallelTasks

    log = tmp_path / "started"
    pages = [f"page{i}" for i in range(8)]                  # heaviest first, as heaviest_first sorts them

    def read(chunk: list[str]) -> None:
        with log.open("a", encoding="utf-8") as out:
            out.write(chunk[0] + "\n")
        time.sleep(0.2)                                      # every page outlasts the handing over of the rest

    tasks = ParallelTasks(jobs)
    for chunk in page_order.one_page_per_chunk(pages, jobs):
        tasks.add_task(read, chunk)
    tasks.join()
    started = log.read_text(encoding="utf-8").split()
    # pages of equal length start in rounds of `jobs`; within a round the processes race to write
    rounds = [sorted(started[i:i + jobs]) for i in range(0, len(pages), jobs)]
    assert rounds == [pages[i:i + jobs] for i in range(0, len(pages), jobs)]


@pytest.mark.parametrize("jobs, parallel", [(2, True), (1, False)])
def test_the_book_is_read_in_parallel_only_when_asked(tmp_path: Path, monkeypatch, jobs: int, parallel: bool) -> None:
    """Every extension of the book is safe to run in several processes (one that is not makes Sphinx read the
    whole book in one process, silently): a Sphinx application of the real configuration says so."""
    import sphinx.builders
    from jupyter_book.config import get_final_config
    from sphinx.application import Sphinx
    from sphinx.util.docutils import docutils_namespace

    monkeypatch.setattr(sphinx.builders, "make_chunks", sphinx.builders.make_chunks)  # undone after the test
    config, _ = get_final_config(user_yaml=ROOT / "_config.yml", sourcedir=ROOT,
                                 cli_config={"external_toc_path": str(ROOT / "_toc.yml"),
                                             "latex_individualpages": False})
    with docutils_namespace():
        # lists of their own: extensions append to these, and Sphinx's defaults are shared by every later build
        # in this process (a gettext build would then extract the theme's templates)
        app = Sphinx(ROOT, None, tmp_path / "html", tmp_path / "doctrees", "html",
                     confoverrides={**config, "templates_path": [], "html_static_path": []},
                     status=None, warning=None, parallel=jobs)
        assert app.is_parallel_allowed("read") is parallel          # Sphinx's default for writing is "safe"
        assert app.is_parallel_allowed("write")
        assert (sphinx.builders.make_chunks is page_order.one_page_per_chunk) is parallel
