"""The book's CJK font: a subset of Noto Sans CJK SC holding only the characters the book's pages use.

The glossary gives each term in Chinese, and the Chinese edition is Chinese throughout: its catalogues
(``locales/zh_CN``), its exercise notebooks (``exercises/zh_CN``) and the theme's own words, which come from the
Sphinx and theme packages (so the built Chinese pages, ``_build/html/zh_CN``, are read too when they exist). A reader
on a minimal system with no CJK font would see empty boxes, so the book ships its own font
(``book/_static/fonts/course-cjk.woff2``, linked by ``book/_static/course.css``).

Why a committed subset rather than one made at build time: the subset is small (tens of kilobytes), the source font
package (Debian ``fonts-noto-cjk``) is about 300 MB, and a build that needs it would need that package on every
fresh machine and a few seconds of subsetting in every ``make book``. ``tests/test_book_font.py`` fails as soon as a
page uses a CJK character the subset lacks, and names this script as the fix.

Regenerate after new Chinese text lands, with the Chinese edition built (needs ``apt-get install fonts-noto-cjk``
and the ``fonttools``/``brotli`` packages of the book extra)::

    make book font        # or: python book/_ext/cjk_font.py

Licence: the SIL Open Font License 1.1 (``book/_static/fonts/OFL.txt``). The subset is a modified version, so it
carries its own family name ("Course CJK Subset"), not a reserved one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FONT_DIR = ROOT / "book" / "_static" / "fonts"
SUBSET = FONT_DIR / "course-cjk.woff2"
SOURCE_FONT = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
SOURCE_FACE = "Noto Sans CJK SC"  # one face of the collection; it holds the traditional characters too
FAMILY = "Course CJK Subset"
# Unicode blocks drawn by a CJK font: radicals, symbols and punctuation, kana, bopomofo, ideographs (with extension A),
# compatibility ideographs, vertical and small forms, full-width forms, and the supplementary ideograph planes.
CJK_RANGES = (
    (0x2E80, 0x2FDF), (0x3000, 0x303F), (0x3040, 0x30FF), (0x3100, 0x312F), (0x31C0, 0x31EF), (0x3200, 0x9FFF),
    (0xF900, 0xFAFF), (0xFE30, 0xFE4F), (0xFF00, 0xFFEF), (0x20000, 0x3134F),
)


def is_cjk(char: str) -> bool:
    """Whether ``char`` (one character) lies in a block that only a CJK font draws."""
    code = ord(char)
    return any(low <= code <= high for low, high in CJK_RANGES)


def book_sources(root: Path = ROOT) -> list[Path]:
    """The files whose text reaches the pages: prose pages, chapters, the bibliography, the table of contents, the
    Chinese catalogues and exercise notebooks, and the extensions and templates that write words of their own."""
    patterns = ["book/**/*.md", "book/*.bib", "notebooks/*.md", "_toc.yml", "_config.yml", "locales/**/*.po",
                "exercises/zh_CN/*.md", "book/_ext/*.py", "book/_ext/templates/*.html"]
    return sorted({path for pattern in patterns for path in root.glob(pattern)})


def built_chinese_pages(root: Path = ROOT) -> list[Path]:
    """The built pages of the Chinese edition (none before ``make book``): they hold the theme's Chinese words too."""
    return sorted((root / "_build" / "html" / "zh_CN").rglob("*.html"))


class _WithoutOutputs(HTMLParser):
    """A built page's text and attribute values, less what its cells printed (see :func:`page_text`)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.depth = 0  # how deep inside a cell's output; 0: outside

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.depth:
            self.depth += tag not in VOID_ELEMENTS
        elif tag == "div" and "cell_output" in (dict(attrs).get("class") or "").split():
            self.depth = 1
        else:
            self.parts += [value for _, value in attrs if value]

    def handle_endtag(self, tag: str) -> None:
        if self.depth and tag not in VOID_ELEMENTS:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if not self.depth:
            self.parts.append(data)


VOID_ELEMENTS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def page_text(path: Path) -> str:
    """A built page's text without its cells' outputs: they are the English build's, and chapter 8 prints text that
    its model sampled, in which a byte-level model can put together any character at all (the Chinese that the
    outputs print from the course's own pages is in :func:`book_sources`)."""
    parser = _WithoutOutputs()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return "".join(parser.parts)


def cjk_characters(paths: Iterable[Path]) -> set[str]:
    """Every CJK character used in ``paths``."""
    return {char for path in paths for char in path.read_text(encoding="utf-8") if is_cjk(char)}


def page_characters(pages: Iterable[Path]) -> set[str]:
    """Every CJK character of the built ``pages`` outside their cells' outputs (:func:`page_text`)."""
    return {char for page in pages for char in page_text(page) if is_cjk(char)}


def subset_characters(font_path: Path = SUBSET) -> set[str]:
    """The characters the font at ``font_path`` maps to a glyph."""
    from fontTools.ttLib import TTFont

    with TTFont(font_path) as font:
        return {chr(code) for code in font.getBestCmap()}


def build_subset(chars: set[str], target: Path = SUBSET, source: Path = SOURCE_FONT) -> Path:
    """Write a WOFF2 subset of ``source``'s SC face holding ``chars`` (and nothing else) to ``target``."""
    from fontTools import subset
    from fontTools.ttLib import TTCollection

    if not source.is_file():
        raise FileNotFoundError(f"no {source}: install the Debian package fonts-noto-cjk")
    collection = TTCollection(source)
    faces = [font for font in collection.fonts if font["name"].getDebugName(4) == SOURCE_FACE]
    if not faces:
        raise ValueError(f"{source} has no face named {SOURCE_FACE!r}")
    font = faces[0]
    options = subset.Options()
    options.flavor = "woff2"
    options.layout_features = ["*"]
    options.name_IDs = ["*"]
    options.notdef_outline = True
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=sorted(ord(char) for char in chars))
    subsetter.subset(font)
    for record in font["name"].names:  # a modified version: a family name of its own (OFL section 3)
        if record.nameID in (1, 4, 16):
            record.string = FAMILY
        elif record.nameID == 6:
            record.string = FAMILY.replace(" ", "")
    target.parent.mkdir(parents=True, exist_ok=True)
    font.flavor = "woff2"
    font.recalcTimestamp = False  # the same characters give the same bytes: `make font` leaves no spurious diff
    font.save(target)
    return target


def main() -> int:
    pages = built_chinese_pages()
    if not pages:
        print("no _build/html/zh_CN: the theme's Chinese words are left out (run `make book` first)", file=sys.stderr)
    chars = cjk_characters(book_sources()) | page_characters(pages)
    path = build_subset(chars)
    print(f"{path.relative_to(ROOT)}: {len(chars)} characters, {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
