"""The Chinese edition stays in step with the English sources (the rules are in ``book/_ext/catalogues.py``).

The first tests run the rules on small made-up catalogues, so each rule is shown to fail when it should. The tests
marked ``translation`` run them on the real catalogues of ``locales/zh_CN``: every page and exercise notebook fully
translated against a fresh extraction of today's English, the glossary's terms used, the markup intact.
"""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po

from companion.instructor import exercise_translation
from companion.instructor.exercises import expected_exercises

ROOT = Path(__file__).resolve().parents[1]
MESSAGES = ROOT / "locales" / "zh_CN" / "LC_MESSAGES"
THEME_WORDS = MESSAGES / "sphinx.po"  # the theme's words Sphinx and the themes ship no Chinese for; not a page


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "book" / "_ext" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


catalogues = _load("catalogues")
edition = _load("edition")
ENTRIES = catalogues.glossary_entries((ROOT / "book" / "glossary.md").read_text(encoding="utf-8"))


def _catalog(text: str) -> Catalog:
    return read_po(io.BytesIO(('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=utf-8\\n"\n\n' + text)
                              .encode("utf-8")))


# ---------------------------------------------------------------------------------------------------------------
# The rules, on made-up catalogues
# ---------------------------------------------------------------------------------------------------------------


def test_glossary_entries_are_read_from_the_glossary() -> None:
    by_term = {term: entry for entry in ENTRIES for term in entry.english}
    assert len(ENTRIES) > 50
    assert by_term["attention"].chinese == ("注意力",)
    assert by_term["causal mask"] == by_term["sequence mask"]
    assert by_term["causal mask"].chinese == ("因果掩码", "掩码自注意力")
    assert by_term["dropout"].chinese == ()
    assert by_term["top-p sampling"].chinese == ("top-p 采样", "核采样")
    with pytest.raises(ValueError, match="glossary"):
        catalogues.glossary_entries("# no directive here")


def test_completeness_counts_each_kind_of_gap() -> None:
    catalog = _catalog('msgid "Done"\nmsgstr "完成"\n\nmsgid "Empty"\nmsgstr ""\n\n#, fuzzy\nmsgid "Guess"\n'
                       'msgstr "猜测"\n\nmsgid "Removed from the page"\nmsgstr "已删"\n\n'
                       '#~ msgid "Old"\n#~ msgstr "旧"\n')
    state = catalogues.completeness(catalog, {"Done", "Empty", "Guess", "New on the page"})
    assert (state.untranslated, state.fuzzy, state.obsolete, state.missing) == (1, 1, 2, 1)
    assert not state.complete
    assert catalogues.completeness(_catalog('msgid "Done"\nmsgstr "完成"\n'), {"Done"}).complete


@pytest.mark.parametrize(("english", "chinese", "comment", "problems"), [
    ("Attention compares a query with every key.", "注意力把查询与每个键比较。", "", 0),
    ("Attention compares a query with every key.", "它把查询与每个键比较。", "", 1),  # 注意力 missing
    ("Masks are boolean.", "这些遮罩是布尔值。", "", 1),  # a plural; 掩码 missing
    ("Multi-head attention splits d_model.", "多头注意力切分 d_model。", "", 0),  # the longer term covers attention
    ("The key idea is simple.", "核心思想很简单。", "# glossary-exempt: key\n", 0),
    ("The key idea is simple.", "核心思想很简单。", "", 1),
    ("Call `mask` here.", "在这里调用 `mask`。", "", 0),  # inline code is not prose
    ("See {term}`mask`.", "见 {term}`mask`。", "", 1),  # a term reference is prose
    ("Dropout zeroes entries.", "dropout 把元素置零。", "", 0),  # no Chinese term in the glossary
])
def test_terminology(english: str, chinese: str, comment: str, problems: int) -> None:
    catalog = _catalog(f'{comment}msgid "{english}"\nmsgstr "{chinese}"\n')
    found = catalogues.terminology_problems(catalog, ENTRIES)
    assert len(found) == problems, found


@pytest.mark.parametrize(("english", "chinese", "problem"), [
    ("See {numref}`fig-heads` and `x` where $QK^T$ [here](a.md#b).",
     "见 {numref}`fig-heads`，其中 `x` 为 $QK^T$，[这里](a.md#b)。", None),
    ("See {term}`mask`.", "见 {term}`掩码 <mask>`。", None),
    ("See {term}`mask`.", "见 {term}`掩码`。", "lost its label"),
    ("See {numref}`fig-heads`.", "见图。", "roles"),
    ("See {ref}`masks`.", "见 {ref}`masking`。", "reference labels lost"),
    ("Call `f(x)`.", "调用 f(x)。", "inline code"),
    ("Compute $QK^T$.", "计算 $KQ^T$。", "maths"),
    ("Read [this](a.md#b).", "读[这个](a.md)。", "link targets"),
    ("A long sentence -- with a dash.", "一个长句子\n--- 带一个破折号。", "starts with ---"),
])
def test_markup(english: str, chinese: str, problem: str | None) -> None:
    found = catalogues.markup_problems(english, chinese)
    if problem is None:
        assert found == []
    else:
        assert any(problem in text for text in found), found


def test_glossary_term_lines_are_translated_as_themselves() -> None:
    ok = _catalog('msgid "attention"\nmsgstr "attention"\n\nmsgid "注意力"\nmsgstr "注意力"\n')
    assert catalogues.glossary_term_problems(ok, ENTRIES) == []
    bad = _catalog('msgid "attention"\nmsgstr "注意力"\n')
    assert len(catalogues.glossary_term_problems(bad, ENTRIES)) == 1


def test_docstrings_and_generated_headings_are_left_out_of_the_templates() -> None:
    template = ('msgid ""\nmsgstr ""\n\n#: ../../book/api.md:3\nmsgid "The page\'s own prose."\nmsgstr ""\n\n'
                '#: ../../companion/text.py:docstring of companion.text:1\nmsgid "A docstring."\nmsgstr ""\n\n'
                '#: ../../book/api.md:0\n#: ../../companion/model.py:docstring of companion.model.T:11\n'
                'msgid "attention"\nmsgstr ""\n\n#: ../../book/api.md:9\nmsgid "`companion.text`"\nmsgstr ""\n')
    kept = edition.without_docstrings(template, generated_headings=True)
    assert "The page's own prose." in kept and "attention" in kept  # a table cell of the page, also in a docstring
    assert "A docstring." not in kept and "`companion.text`" not in kept and "#: " not in kept
    assert "`companion.text`" in edition.without_docstrings(template)


# ---------------------------------------------------------------------------------------------------------------
# The real catalogues (green once every page is translated)
# ---------------------------------------------------------------------------------------------------------------


def _real_catalogues() -> list[Path]:
    return sorted(MESSAGES.rglob("*.po"))


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> dict[str, set[str]]:
    """Page -> message ids, from a fresh extraction of today's English sources (about a minute)."""
    outdir = tmp_path_factory.mktemp("gettext")
    assert edition.extract(outdir) == 0
    found = {}
    for path in sorted(outdir.rglob("*.pot")):
        with path.open("rb") as handle:
            found[path.relative_to(outdir).with_suffix("").as_posix()] = {m.id for m in read_po(handle) if m.id}
    for name, text in expected_exercises(ROOT / "solutions").items():
        found[f"exercises/{Path(name).stem}"] = set(exercise_translation.messages(text))
    return found


@pytest.mark.translation
def test_every_catalogue_is_complete(templates: dict[str, set[str]]) -> None:
    pages = {path.relative_to(MESSAGES).with_suffix("").as_posix(): path for path in _real_catalogues()
             if path != THEME_WORDS}
    assert sorted(pages) == sorted(templates), "catalogues and pages differ: run `make locales`"
    states = {page: catalogues.completeness(catalogues.load(pages[page]), ids) for page, ids in templates.items()}
    report = "\n".join(f"{page:40} {state}" for page, state in states.items())
    print("\n" + report)
    behind = [page for page, state in states.items() if not state.complete]
    assert not behind, f"{len(behind)} catalogues are behind the English (`make locales`, then translate):\n{report}"


def test_theme_words_are_translated() -> None:
    catalog = catalogues.load(THEME_WORDS)
    assert [m.id for m in catalog if m.id and (not m.string or m.fuzzy)] == []
    assert "Color mode" in catalog


@pytest.mark.translation
@pytest.mark.parametrize("path", _real_catalogues(), ids=lambda p: p.relative_to(MESSAGES).as_posix())
def test_catalogue_uses_the_glossary_and_keeps_the_markup(path: Path) -> None:
    catalog = catalogues.load(path)
    if path == MESSAGES / "book" / "glossary.po":  # its term lines are translated as themselves
        problems = (catalogues.terminology_problems(catalog, ENTRIES, skip=catalogues.term_lines(ENTRIES))
                    + catalogues.glossary_term_problems(catalog, ENTRIES))
    else:
        problems = catalogues.terminology_problems(catalog, ENTRIES)
    problems += catalogues.catalogue_markup_problems(catalog)
    assert not problems, f"{path.name}: {len(problems)} problems:\n" + "\n".join(problems[:40])
