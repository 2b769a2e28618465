"""The Chinese edition's search index, built in linear time.

Sphinx's Chinese search language (``sphinx.search.zh.SearchChinese``, Sphinx 7) keeps every Latin word of every
page in a list, duplicates included, and looks each word up in that list when it stems it: the index takes time
quadratic in the book's length (about 5 s of the Chinese build, in the main process, while the other core waits).
:class:`SearchChinese` keeps those words in a set; every lookup answers as before, so the index is the same
(tests/test_chinese_search.py builds both and compares them).
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx
from sphinx.search.zh import SearchChinese as SphinxSearchChinese


class _Words(set):
    """A set that takes Sphinx's ``latin_terms.extend(words)``."""

    extend = set.update


class SearchChinese(SphinxSearchChinese):
    """Sphinx's Chinese search language with its Latin words in a set of this index's own."""

    def init(self, options: dict[str, str]) -> None:
        super().init(options)
        self.latin_terms = _Words()  # Sphinx's is a list shared by every index (a class attribute)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_search_language(SearchChinese)
    return {"version": "0.1", "parallel_read_safe": True, "parallel_write_safe": True}
