"""The Chinese edition (``_build/html/zh_CN``) as a reader gets it, beside the English one.

``test_browser_book.py`` and ``test_layout.py`` already open every page of both editions (no console error, no
request off the machine, formulas typeset, links resolve, nothing cut off at 1280 and 390 px). Here: each page has a
twin in the other language and a switcher that leads to it, over HTTP and from disk (``file://``); every Chinese
character in a chapter is drawn by the bundled font (no missing glyph, whatever fonts the system has); the framework
tabs work in Chinese; each Chinese chapter offers its executed notebook.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_browser_book import (  # noqa: F401 - server is a fixture used below
    CHROMIUM,
    CHROMIUM_ARGS,
    HTML,
    MATHJAX_TIMEOUT_MS,
    PAGE_TIMEOUT_MS,
    PAGES,
    ROOT,
    _checked_tabs,
    _skip_or_fail,
    _unavailable,
    server,
)

ZH = "zh_CN/"
ENGLISH = [p for p in PAGES if not p.startswith(ZH)]
CHINESE = [p for p in PAGES if p.startswith(ZH)]
CHINESE_CHAPTERS = [p for p in CHINESE if p.startswith(ZH + "notebooks/")]
WIDTHS = {"1280x800": {"width": 1280, "height": 800}, "390x844": {"width": 390, "height": 844}}
SWITCHER = re.compile(r'<a class="btn btn-sm course-language" href="([^"]+)" hreflang="([^"]+)"')
CJK_TEXT = "[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]"
# Wraps every run of CJK characters in a span of its own, marked with its length, and returns how many spans it made.
# CSS.getPlatformFontsForNode then reports the fonts of exactly those characters: asked about an element with more
# text, Chromium's answer may count the glyphs of its inline children too (it does from version 156.0.8078.108 on).
# In a cell's output only the characters the subset holds are wrapped: chapter 8 prints text that its model
# sampled, and a byte-level model can put together any character at all (the subset cannot foresee them; what it
# holds must still be drawn by it).
MARK_CJK = """([pattern, subset]) => {
    const cjk = new RegExp(pattern);
    const held = new Set(Array.from(subset));
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    const texts = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const parent = node.parentElement;
        if (parent && !['SCRIPT', 'STYLE', 'NOSCRIPT'].includes(parent.tagName) && cjk.test(node.textContent)) {
            texts.push(node);
        }
    }
    let spans = 0;
    for (const node of texts) {
        const output = node.parentElement.closest('.cell_output') !== null;
        const pieces = document.createDocumentFragment();
        let plain = '', run = [];
        const endRun = () => {
            if (!run.length) return;
            const span = document.createElement('span');
            span.textContent = run.join('');
            span.setAttribute('data-cjk', run.length);
            pieces.append(span);
            spans += 1;
            run = [];
        };
        for (const char of Array.from(node.textContent)) {
            if (cjk.test(char) && (!output || held.has(char))) {
                if (plain) { pieces.append(plain); plain = ''; }
                run.push(char);
            } else {
                endRun();
                plain += char;
            }
        }
        endRun();
        if (plain) pieces.append(plain);
        node.replaceWith(pieces);
    }
    return spans;
}"""


def _subset_characters() -> str:
    spec = importlib.util.spec_from_file_location("cjk_font", ROOT / "book" / "_ext" / "cjk_font.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return "".join(sorted(module.subset_characters()))


def _need_chinese() -> None:
    reason = _unavailable()
    if reason:
        _skip_or_fail(reason)
    if not CHINESE_CHAPTERS:
        _skip_or_fail(f"no Chinese edition in {HTML / ZH} (`make book` builds it)")


def test_every_page_has_a_twin_and_a_switcher_to_it() -> None:
    """Each page links to the same page in the other edition, and that page exists."""
    if not CHINESE:
        _skip_or_fail(f"no Chinese edition in {HTML / ZH}")
    assert sorted(ENGLISH) == sorted(p[len(ZH):] for p in CHINESE), "the two editions hold different pages"
    wrong = []
    for page in PAGES:
        found = SWITCHER.search((HTML / page).read_text(encoding="utf-8"))
        twin = page[len(ZH):] if page.startswith(ZH) else ZH + page
        target = (HTML / page).parent / found.group(1) if found else None
        if not target or target.resolve() != (HTML / twin).resolve():
            wrong.append(f"{page} -> {found.group(1) if found else 'no switcher'}")
        elif found.group(2) != ("en" if page.startswith(ZH) else "zh-CN"):
            wrong.append(f"{page}: hreflang {found.group(2)}")
    assert not wrong, f"switchers that do not lead to the twin page: {wrong[:10]}"
    chapter = (HTML / ZH / "notebooks" / "02_attention.html").read_text(encoding="utf-8")
    assert '<html lang="zh-CN"' in chapter
    assert '<html lang="en"' in (HTML / "notebooks" / "02_attention.html").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def chromium(server: str) -> Iterator:  # noqa: F811 - the imported fixture
    _need_chinese()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def _page(chromium, width: str):
    page = chromium.new_context(viewport=WIDTHS[width], service_workers="block").new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    return page


@pytest.mark.parametrize("width", list(WIDTHS))
def test_switcher_leads_back_and_forth(chromium, server: str, width: str) -> None:  # noqa: F811
    """At both widths the switcher is visible and goes to the same chapter in English and back, over HTTP."""
    page = _page(chromium, width)
    chapter = ZH + "notebooks/02_attention.html"
    page.goto(server + chapter, wait_until="load")
    switcher = page.locator("a.course-language")
    assert switcher.is_visible(), f"no visible language switcher at {width}"
    assert switcher.inner_text().strip() == "English"
    switcher.click()
    page.wait_for_url(server + "notebooks/02_attention.html")
    assert page.evaluate("() => document.documentElement.lang") == "en"
    page.locator("a.course-language").click()
    page.wait_for_url(server + chapter)
    assert page.evaluate("() => document.documentElement.lang") == "zh-CN"
    page.context.close()


def test_switcher_works_from_disk(chromium) -> None:
    """Opened as files (no server), the switcher still finds the other edition's page."""
    page = _page(chromium, "1280x800")
    page.goto((HTML / ZH / "notebooks" / "04_masking.html").as_uri(), wait_until="load")
    page.locator("a.course-language").click()
    page.wait_for_url((HTML / "notebooks" / "04_masking.html").as_uri())
    assert page.locator("article.bd-article h1").count() == 1
    page.context.close()


@pytest.mark.parametrize("chapter", CHINESE_CHAPTERS or ["<none>"])
def test_chinese_text_is_drawn_by_the_bundled_font(chromium, server: str, chapter: str) -> None:  # noqa: F811
    """Every Chinese character of the chapter is drawn by the bundled subset, none by a fallback (a missing glyph)."""
    page = _page(chromium, "1280x800")
    page.goto(server + chapter, wait_until="load")
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                           timeout=MATHJAX_TIMEOUT_MS)
    page.evaluate("() => MathJax.startup.promise")  # typeset first: MathJax rewrites the text the spans split
    page.evaluate("() => document.fonts.ready.then(() => true)")
    assert page.evaluate(MARK_CJK, [CJK_TEXT, _subset_characters()]) > 0, f"{chapter}: no Chinese text"
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1, "pierce": False})["root"]["nodeId"]
    nodes = cdp.send("DOM.querySelectorAll", {"nodeId": root, "selector": "[data-cjk]"})["nodeIds"]
    expected = drawn = 0
    for node in nodes:
        attributes = cdp.send("DOM.getAttributes", {"nodeId": node})["attributes"]
        count = int(dict(zip(attributes[0::2], attributes[1::2], strict=True))["data-cjk"])
        fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
        if not fonts:  # not rendered (a hidden tooltip or a closed drawer)
            continue
        expected += count
        drawn += sum(f["glyphCount"] for f in fonts if f["familyName"] == "Course CJK Subset" and f["isCustomFont"])
    page.context.close()
    assert expected > 0, f"{chapter}: no Chinese text rendered"
    assert drawn == expected, f"{chapter}: the bundled font drew {drawn} of {expected} Chinese characters (`make font`)"


def test_framework_tabs_work_in_chinese(chromium, server: str) -> None:  # noqa: F811
    """Choosing Keras in a Chinese chapter switches every synced tab set there."""
    tabbed = [p for p in CHINESE_CHAPTERS if 'data-sync-group="framework"' in (HTML / p).read_text(encoding="utf-8")]
    if not tabbed:
        _skip_or_fail("no Chinese chapter with framework tabs")
    page = _page(chromium, "390x844")
    page.goto(server + tabbed[0], wait_until="load")
    page.locator('label.sd-tab-label[data-sync-group="framework"][data-sync-id="keras"]').first.click()
    tabs = _checked_tabs(page)
    assert all(tabs["keras"]) and not any(tabs["pytorch"]), f"{tabbed[0]}: not every tab set switched: {tabs}"
    page.context.close()


def test_chinese_chapters_typeset_math_and_offer_the_notebook(chromium, server: str) -> None:  # noqa: F811
    """A Chinese chapter's formulas are typeset by the local MathJax; each chapter links to its executed notebook."""
    page = _page(chromium, "390x844")
    page.goto(server + ZH + "notebooks/02_attention.html", wait_until="load")
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise"
                           " && document.querySelectorAll('mjx-container').length > 0", timeout=MATHJAX_TIMEOUT_MS)
    page.evaluate("() => MathJax.startup.promise")
    assert page.locator("mjx-container").count() >= page.locator(".math").count() > 0
    assert page.locator("mjx-merror").count() == 0
    page.context.close()
    missing = [p for p in CHINESE_CHAPTERS if not (HTML / ZH / "_sources" / Path(p[len(ZH):]).with_suffix(".ipynb"))
               .is_file() or f"{Path(p).stem}.ipynb" not in (HTML / p).read_text(encoding="utf-8")]
    assert not missing, f"Chinese chapters without a working .ipynb download: {missing}"
