"""The Chinese edition's search index: the same words and stems as Sphinx's own, in linear time
(book/_ext/chinese_search.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import chinese_search  # noqa: E402
from sphinx.search.zh import SearchChinese as SphinxSearchChinese  # noqa: E402

PAGES = [
    "多头注意力把 d_model 分成 num_heads 份。Multi-head attention was the 2017 design; GQA shares keys and values.",
    "RoPE 旋转查询和键，was it the relative offset? The scores depend on m - n only; the cos and sin tables.",
    "第九章：RMSNorm、SwiGLU、grouped-query attention、sliding windows and FlashAttention's online softmax.",
]


def _index(language, pages: list[str]) -> list[list[str]]:
    """What the index builder does with each page: split it into words, then stem each word."""
    return [[language.stem(word) for word in language.split(page)] for page in pages]


def test_the_index_is_the_one_sphinx_builds(monkeypatch) -> None:
    monkeypatch.setattr(SphinxSearchChinese, "latin_terms", [])   # a fresh build's empty list
    assert _index(chinese_search.SearchChinese({}), PAGES) == _index(SphinxSearchChinese({}), PAGES)


def _lookups(language) -> float:
    start = time.perf_counter()
    for _ in range(2000):
        language.stem("注意力")                                    # a word the Latin list never holds
    return time.perf_counter() - start


def test_a_lookup_costs_the_same_however_much_was_indexed_before(monkeypatch) -> None:
    """Sphinx's list makes every lookup of a word it lacks read every Latin word of the pages indexed so far (so the
    whole index takes time quadratic in the book's length); with a set it does not depend on them."""
    monkeypatch.setattr(SphinxSearchChinese, "latin_terms", [])
    fresh = _lookups(chinese_search.SearchChinese({}))
    language = chinese_search.SearchChinese({})
    _index(language, [" ".join(f"term{page}x{i}" for i in range(300)) for page in range(80)])
    assert _lookups(language) < 2 * fresh


def test_the_book_registers_it_for_chinese(tmp_path: Path) -> None:
    import sphinx.search
    from jupyter_book.config import get_final_config
    from sphinx.application import Sphinx
    from sphinx.util.docutils import docutils_namespace

    config, _ = get_final_config(user_yaml=ROOT / "_config.yml", sourcedir=ROOT,
                                 cli_config={"external_toc_path": str(ROOT / "_toc.yml"),
                                             "latex_individualpages": False})
    with docutils_namespace():
        # English (an application in Chinese would leave Sphinx's own words translated for every later build in
        # this process); lists of their own: extensions append to these, and Sphinx's defaults are shared likewise
        Sphinx(ROOT, None, tmp_path / "html", tmp_path / "doctrees", "html",
               confoverrides={**config, "templates_path": [], "html_static_path": []}, status=None, warning=None)
    assert sphinx.search.languages["zh"] is chinese_search.SearchChinese
