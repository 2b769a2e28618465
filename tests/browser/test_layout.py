"""Nothing on a page is cut off, at a laptop width and at a phone width; the glossary's Chinese uses the bundled font.

Every page of ``_build/html`` is opened at 1280x800 and at 390x844. On each, every code block and output (``pre``),
every table and every formula (``mjx-container``) in the article must either fit the text column or sit in a box
that scrolls sideways *and shows a scroll bar*; and the page itself must not scroll sideways. The browser runs with
its scroll bars drawn (Playwright's headless default hides them), so "shows a scroll bar" is measured: the scroll
box's scroll bar takes height (``offsetHeight > clientHeight``).

The counts per width (elements checked, fitting, scrolling in a visible scroll box, cut off) are written to
``_build/browser-layout-counts.json`` and printed at the end of the run.

Needs the built book and Chromium, like ``test_browser_book.py`` (skips without them, fails in CI).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from test_browser_book import (  # noqa: F401 - server is a fixture used below
    CHROMIUM,
    CHROMIUM_ARGS,
    HTML,
    MATHJAX_TIMEOUT_MS,
    NO_PAGES,
    PAGE_TIMEOUT_MS,
    PAGES,
    _skip_or_fail,
    server,
)

WIDTHS = {"1280x800": {"width": 1280, "height": 800}, "390x844": {"width": 390, "height": 844}}
COUNTS_FILE = HTML.parent / "browser-layout-counts.json"
_COUNTS: dict[str, dict[str, int]] = {}

# Measures the article of the open page. An element "overflows" when its content is wider than its box or when its
# box reaches past the article's; it is then fine only inside a box (itself or an ancestor within the article) that
# scrolls sideways, has room to scroll, lies inside the article and draws a horizontal scroll bar.
MEASURE = """() => {
    const article = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
    const area = article.getBoundingClientRect();
    const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
    const bar = el => {
        const s = getComputedStyle(el);
        return el.offsetHeight - el.clientHeight - parseFloat(s.borderTopWidth) - parseFloat(s.borderBottomWidth) > 0;
    };
    const inside = el => {
        const r = el.getBoundingClientRect();
        return r.left >= area.left - 1 && r.right <= area.right + 1;
    };
    const name = el => {
        const text = (el.innerText || el.textContent || '').trim().replace(/\\s+/g, ' ').slice(0, 60);
        return `${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''} "${text}"`;
    };
    const out = {checked: 0, fit: 0, scroll: 0, cut: [], page_width: document.documentElement.scrollWidth,
                 viewport: document.documentElement.clientWidth};
    for (const el of article.querySelectorAll('pre, table, mjx-container')) {
        if (!el.getClientRects().length || el.closest('mjx-assistive-mml')) continue;  // not rendered (hidden tab)
        if (el.tagName === 'MJX-CONTAINER' && el.parentElement.closest('mjx-container')) continue;
        out.checked += 1;
        const r = el.getBoundingClientRect();
        const wider = el.scrollWidth > el.clientWidth + 1 && scrolls(el);
        const past = r.right > area.right + 1 || r.left < area.left - 1;
        const clipped = !scrolls(el) && el.scrollWidth > el.clientWidth + 1
            && getComputedStyle(el).overflowX !== 'visible';
        if (!wider && !past && !clipped) { out.fit += 1; continue; }
        let box = null;
        for (let n = el; n && n !== article.parentElement; n = n.parentElement) {
            if (scrolls(n) && n.scrollWidth > n.clientWidth + 1) { box = n; break; }
        }
        if (box && inside(box) && bar(box)) { out.scroll += 1; continue; }
        const why = !box ? 'no scroll box'
            : inside(box) ? 'scroll box draws no scroll bar' : 'scroll box wider than the column';
        out.cut.push(`${name(el)} (${why})`);
    }
    return out;
}"""


@pytest.fixture(scope="module")
def layout_browser(server: str) -> Iterator:  # noqa: F811 - the imported fixture
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
                                              ignore_default_args=["--hide-scrollbars"])
        pages = {}
        try:
            for label, viewport in WIDTHS.items():
                context = chromium.new_context(viewport=viewport, service_workers="block")
                pages[label] = context.new_page()
                pages[label].set_default_timeout(PAGE_TIMEOUT_MS)
            yield pages
        finally:
            chromium.close()
            _report()


def _report() -> None:
    if not _COUNTS:
        return
    COUNTS_FILE.write_text(json.dumps(_COUNTS, indent=2) + "\n", encoding="utf-8")
    lines = [f"layout at {w}: {c['pages']} pages, {c['checked']} pre/table/formula checked, {c['fit']} fit, "
             f"{c['scroll']} scroll in a visible scroll box, {c['cut']} cut off, {c['sideways']} pages scroll sideways"
             for w, c in _COUNTS.items()]
    print("\n" + "\n".join(lines))  # shown with -s, and recorded in the JSON file either way


def _open(page, base: str, path: str) -> None:
    page.goto(base + path, wait_until="load")
    if page.locator(".math").count():
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                               timeout=MATHJAX_TIMEOUT_MS)
        page.evaluate("() => MathJax.startup.promise")
    page.evaluate("() => document.fonts.ready.then(() => true)")


@pytest.mark.parametrize("width", list(WIDTHS))
@pytest.mark.parametrize("path", PAGES or [NO_PAGES])
def test_nothing_cut_off(layout_browser, server: str, path: str, width: str) -> None:  # noqa: F811
    """No code, output, table or formula is cut off, and the page does not scroll sideways."""
    if path == NO_PAGES:
        _skip_or_fail(f"no pages in {HTML}")
    page = layout_browser[width]
    _open(page, server, path)
    found = page.evaluate(MEASURE)
    counts = _COUNTS.setdefault(width, dict.fromkeys(("pages", "checked", "fit", "scroll", "cut", "sideways"), 0))
    counts["pages"] += 1
    for key in ("checked", "fit", "scroll"):
        counts[key] += found[key]
    counts["cut"] += len(found["cut"])
    sideways = found["page_width"] > found["viewport"]
    counts["sideways"] += sideways
    assert not found["cut"], f"{path} at {width}: content cut off with no scroll bar: {found['cut']}"
    assert not sideways, (
        f"{path} at {width}: the page is {found['page_width']} px wide in a {found['viewport']} px window"
    )


def test_glossary_chinese_renders_with_bundled_font(layout_browser, server: str) -> None:  # noqa: F811
    """Every Chinese character of the glossary's terms is drawn by the bundled subset, not by a system font."""
    if "book/glossary.html" not in PAGES:
        _skip_or_fail("no book/glossary.html in the build")
    page = layout_browser["1280x800"]
    _open(page, server, "book/glossary.html")
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    terms = cdp.send("DOM.querySelectorAll", {"nodeId": root, "selector": "dl.glossary dt"})["nodeIds"]
    expected = drawn = 0
    other_fonts = set()
    for node in terms:
        text = page.evaluate("(n) => n", cdp.send("DOM.resolveNode", {"nodeId": node})["object"]["description"])
        html = cdp.send("DOM.getOuterHTML", {"nodeId": node})["outerHTML"]
        cjk = sum(1 for char in html if "\u3000" <= char <= "\u9fff" or "\uff00" <= char <= "\uffef")
        if not cjk:
            continue
        expected += cjk
        for font in cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]:
            if font["familyName"] == "Course CJK Subset" and font["isCustomFont"]:
                drawn += font["glyphCount"]
            else:
                other_fonts.add(font["familyName"])
        del text
    assert expected > 50, f"found only {expected} Chinese characters in the glossary's terms"
    assert drawn == expected, (
        f"the bundled font drew {drawn} of the glossary's {expected} Chinese characters; other fonts used: "
        f"{sorted(other_fonts)}"
    )


def _figure_sources(page: str) -> list[str]:
    """The images a chapter's cells drew (myst-nb writes them to ``_images``)."""
    return re.findall(r'<img[^>]*src="([^"]*_images/[^"]+)"', (HTML / page).read_text(encoding="utf-8"))


def test_figures_are_svg_on_white() -> None:
    """Every figure a chapter draws is SVG (sharp at any pixel density) with an opaque white background."""
    chapters = [p for p in PAGES if p.startswith("notebooks/")]
    if not chapters:
        _skip_or_fail(f"no chapter pages in {HTML}")
    figures, not_svg, not_white = 0, [], []
    for page in chapters:
        for src in _figure_sources(page):
            figures += 1
            path = (HTML / page).parent / src
            if path.suffix != ".svg":
                not_svg.append(f"{page}: {src}")
            elif "fill: #ffffff" not in path.read_text(encoding="utf-8")[:4000]:
                not_white.append(f"{page}: {src}")
    assert figures >= 15, f"found only {figures} figures in the chapters"
    assert not not_svg, f"figures that are not SVG (companion.plots sets SVG for every chapter): {not_svg}"
    assert not not_white, f"SVG figures without a white background (unreadable in dark mode): {not_white}"


def test_figures_readable_in_dark_mode(layout_browser, server: str) -> None:  # noqa: F811
    """With the reader's system in dark mode the page turns dark and each figure sits on a light card."""
    chapters = [p for p in PAGES if p.startswith("notebooks/") and _figure_sources(p)]
    if not chapters:
        _skip_or_fail(f"no chapter page with figures in {HTML}")
    page = layout_browser["1280x800"]
    page.emulate_media(color_scheme="dark")
    try:
        _open(page, server, chapters[0])
        found = page.evaluate(
            """() => {
                const lum = c => { const [r, g, b] = c.match(/\\d+/g).map(Number); return (r + g + b) / 765; };
                const body = lum(getComputedStyle(document.body).backgroundColor);
                const figures = Array.from(document.querySelectorAll('div.cell_output img'),
                                           img => lum(getComputedStyle(img).backgroundColor));
                return {theme: document.documentElement.dataset.theme, body, figures};
            }"""
        )
    finally:
        page.emulate_media(color_scheme="light")
    assert found["theme"] == "dark" and found["body"] < 0.3, f"{chapters[0]}: the page did not turn dark: {found}"
    assert found["figures"] and min(found["figures"]) > 0.6, f"{chapters[0]}: figures not on a light card: {found}"
