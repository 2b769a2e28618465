"""The bundled CJK font covers every CJK character the book's pages use (see ``book/_ext/cjk_font.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cjk_font():
    spec = importlib.util.spec_from_file_location("cjk_font", ROOT / "book" / "_ext" / "cjk_font.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cjk_font = _cjk_font()


def test_sources_are_found_and_use_chinese() -> None:
    sources = cjk_font.book_sources()
    assert ROOT / "book" / "glossary.md" in sources
    assert ROOT / "locales" / "zh_CN" / "LC_MESSAGES" / "notebooks" / "02_attention.po" in sources
    assert ROOT / "exercises" / "zh_CN" / "02_attention.md" in sources
    assert len(cjk_font.cjk_characters([ROOT / "book" / "glossary.md"])) > 50, "the glossary lost its Chinese terms?"


def test_is_cjk() -> None:
    assert cjk_font.is_cjk("注") and cjk_font.is_cjk("，") and cjk_font.is_cjk("𠀀")
    assert not any(cjk_font.is_cjk(char) for char in "aZ9 é—…√")


def test_subset_has_every_cjk_character_of_the_book() -> None:
    pytest.importorskip("fontTools")
    pytest.importorskip("brotli")  # WOFF2 needs it to be read
    used = cjk_font.cjk_characters(cjk_font.book_sources())
    missing = sorted(used - cjk_font.subset_characters())
    assert not missing, (
        f"{len(missing)} CJK characters used in the book are not in {cjk_font.SUBSET.relative_to(ROOT)}: "
        f"{''.join(missing)}; regenerate it with `python book/_ext/cjk_font.py` (needs fonts-noto-cjk)"
    )


def test_subset_has_every_cjk_character_of_the_built_chinese_edition() -> None:
    """The theme's Chinese words come from the Sphinx and theme packages: the built pages show which are used."""
    pytest.importorskip("fontTools")
    pytest.importorskip("brotli")
    pages = cjk_font.built_chinese_pages()
    if not pages:
        pytest.skip("no _build/html/zh_CN (run `make book`)")
    missing = sorted(cjk_font.page_characters(pages) - cjk_font.subset_characters())
    assert not missing, (
        f"{len(missing)} CJK characters of the built Chinese edition are not in the font subset: {''.join(missing)}; "
        "regenerate it with `make font`"
    )


def test_subset_is_small_and_licensed() -> None:
    # The whole Chinese edition uses a few thousand distinct characters (about 300 bytes each in WOFF2); the full
    # face of the source font holds some 65,000 glyphs and is about 16 MB.
    assert cjk_font.SUBSET.stat().st_size < 1_500_000, "the subset should hold only the glyphs the book uses"
    licence = (cjk_font.FONT_DIR / "OFL.txt").read_text(encoding="utf-8")
    assert "SIL OPEN FONT LICENSE Version 1.1" in licence


def test_page_text_leaves_out_what_cells_printed(tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    page.write_text('<p title="标题">正文<br>文</p><div class="cell_output docutils container"><div><pre>帏儭</pre>'
                    '<img src="a.png" alt="图"></div></div><p>后</p>', encoding="utf-8")
    assert cjk_font.page_characters([page]) == set("标题正文后")
