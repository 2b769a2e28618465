"""The built book as a reader gets it: every page of ``_build/html`` opened in headless Chromium, offline.

Every page means both editions: the Chinese one lives in ``_build/html/zh_CN`` (its own checks, the language switcher
and the Chinese font, are in ``test_chinese_edition.py``).

What is checked, page by page: the page loads with no console error and no uncaught exception; no request leaves
localhost (every other request is recorded and aborted, as on a machine with no network) and no local request
fails; formulas are typeset by the local MathJax with no TeX error; every image loads and has real alt text; every
internal link points to an existing page and, for ``#fragment`` links, to an existing id. Across pages: choosing
Keras in one tab set switches every synced tab set and stays chosen on the next page; the search page finds words.

Needs a built book (``make book``; ``.ci/run`` builds it before ``make test``) and Debian's Chromium
(``apt-get install chromium``; ``.ci/run`` installs it). Without either the tests skip and say why; in CI
(``CI=true``) they fail instead, so a green CI always means the browser ran.

All tests live in this one module: under ``pytest-xdist --dist loadscope`` they run in one worker, which starts one
HTTP server and one browser.
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
CHROMIUM = Path(os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
# Folders of the build that hold assets, not pages.
NOT_PAGES = {"_static", "_sources", "_images", "_downloads"}
# Generous: on a 2-core CI machine the browser shares the CPU with nbval's notebooks. Only a failure waits this long.
PAGE_TIMEOUT_MS = 90_000
MATHJAX_TIMEOUT_MS = 90_000
# A page counts as loaded when no request of its has been in flight for this long.
QUIET_MS = 500
_REDIRECT = re.compile(r'<meta http-equiv="Refresh" content="0; url=([^"]+)"', re.IGNORECASE)


def _redirect_target(path: Path) -> str | None:
    """Where a redirect stub (Jupyter Book's ``index.html``) sends the reader, or None for a real page."""
    text = path.read_text(encoding="utf-8", errors="replace")
    found = _REDIRECT.search(text)
    return found.group(1) if found and len(text) < 500 else None


def _pages() -> list[str]:
    """Every page of the build, without redirect stubs (they navigate away at once; see test_front_page_redirects)."""
    if not HTML.is_dir():
        return []
    pages = (p.relative_to(HTML).as_posix() for p in HTML.rglob("*.html"))
    # The Chinese edition (zh_CN/) is a book of its own inside this one, with its own asset folders.
    return sorted(p for p in pages if not NOT_PAGES & set(p.split("/")[:-1]) and not _redirect_target(HTML / p))


def _unavailable() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists():
        return f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; or set COURSE_CHROMIUM)"
    if not (HTML / "index.html").is_file():
        return f"no built book at {HTML} (run `make book` first)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    return None


PAGES = _pages()
NO_PAGES = "<no built pages>"


def _skip_or_fail(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"browser tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason)


# --------------------------------------------------------------------------------------------------------- server


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """Serve ``_build/html`` on a free localhost port for this module; yields the base URL."""
    reason = _unavailable()
    if reason:
        _skip_or_fail(reason)
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def browser(server: str):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class Visit:
    """One browser context with everything a page does recorded: console errors, requests, failures."""

    def __init__(self, browser, base_url: str):
        self.base = base_url
        self.context = browser.new_context(service_workers="block")
        self.console_errors: list[str] = []
        self.outside_requests: list[str] = []
        self.failed: list[str] = []
        self.in_flight: set = set()
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.set_default_timeout(PAGE_TIMEOUT_MS)
        self.page.on("console", lambda m: m.type == "error" and self.console_errors.append(f"{m.text} ({m.location})"))
        self.page.on("pageerror", lambda e: self.console_errors.append(f"uncaught: {e}"))
        self.page.on("requestfailed", self._request_failed)
        self.page.on("request", lambda r: self.in_flight.add(r))
        self.page.on("requestfinished", lambda r: self.in_flight.discard(r))
        self.page.on("response", lambda r: r.status >= 400 and self.failed.append(f"HTTP {r.status} {r.url}"))

    def _route(self, route) -> None:
        url = route.request.url
        parts = urlsplit(url)
        if parts.scheme in ("data", "blob", "about") or (parts.hostname or "") in LOCAL_HOSTS:
            route.continue_()
        else:
            self.outside_requests.append(url)
            route.abort("internetdisconnected")

    def _request_failed(self, request) -> None:
        self.in_flight.discard(request)
        if request.url not in self.outside_requests:
            self.failed.append(f"{request.failure} {request.url}")

    def open(self, page: str) -> None:
        self.page.goto(self.base + page, wait_until="load")
        self.settle()

    def settle(self) -> None:
        """Wait until no request has been in flight for QUIET_MS; fail naming the requests that never finish.

        Playwright's "networkidle" does the same but, on a timeout, does not say which request kept it waiting.
        """
        deadline = time.monotonic() + PAGE_TIMEOUT_MS / 1000
        quiet_since = None
        while True:
            now = time.monotonic()
            if self.in_flight:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= QUIET_MS / 1000:
                return
            if now > deadline:
                pending = sorted(r.url for r in self.in_flight)
                raise AssertionError(f"{self.page.url}: requests still loading after {PAGE_TIMEOUT_MS} ms: {pending}")
            self.page.wait_for_timeout(50)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def visit(browser, server: str) -> Iterator[Visit]:
    v = Visit(browser, server)
    try:
        yield v
    finally:
        v.close()


# -------------------------------------------------------------------------------------------------- static helpers


class _Ids(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs) -> None:
        for name, value in attrs:
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value or "")


@functools.cache
def _ids_in(path: Path) -> frozenset[str]:
    parser = _Ids()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return frozenset(parser.ids)


def _target_file(path: str) -> Path:
    local = HTML / unquote(path).lstrip("/")
    return local / "index.html" if path.endswith("/") or local.is_dir() else local


# ------------------------------------------------------------------------------------------------------ page tests

# What each page showed the browser (links and images), kept by the first test that opened it, so the link and alt
# text tests need not load the page again. Filled per worker; a test that finds nothing here opens the page.
_SEEN: dict[str, dict] = {}
_COLLECT = """() => ({
    hrefs: Array.from(document.querySelectorAll('a[href]'), a => a.href),
    images: Array.from(document.querySelectorAll('article img, main img'),
                       i => ({src: i.getAttribute('src'), alt: i.getAttribute('alt')})),
    code_blocks: document.querySelectorAll('div.highlight pre').length,
    copy_buttons: document.querySelectorAll('div.highlight button.copybtn').length,
})"""


def _seen(visit: Visit, page: str) -> dict:
    if page not in _SEEN:
        visit.open(page)
        _SEEN[page] = visit.page.evaluate(_COLLECT)
    return _SEEN[page]


@pytest.mark.parametrize("page", PAGES or [NO_PAGES])
def test_page_works_offline(visit: Visit, page: str) -> None:
    """Loads with no console error, no request off localhost, no failed request; math typeset; images load."""
    if page == NO_PAGES:
        _skip_or_fail(f"no pages in {HTML}")
    visit.open(page)
    p = visit.page

    math_nodes = p.locator(".math").count()
    if math_nodes:
        p.wait_for_function(
            "() => window.MathJax && MathJax.startup && MathJax.startup.promise"
            " && document.querySelectorAll('mjx-container').length > 0",
            timeout=MATHJAX_TIMEOUT_MS,
        )
        p.evaluate("() => MathJax.startup.promise")
        typeset = p.locator("mjx-container").count()
        tex_errors = p.locator("mjx-merror").all_inner_texts()
        assert typeset >= math_nodes, f"{page}: {math_nodes} formulas but only {typeset} typeset by MathJax"
        assert not tex_errors, f"{page}: MathJax could not typeset: {tex_errors}"

    images = p.evaluate(
        """async () => {
            const imgs = Array.from(document.images);
            await Promise.all(imgs.map(img => img.complete ? null : new Promise(r => {
                img.addEventListener('load', r); img.addEventListener('error', r); })));
            return imgs.map(img => ({src: img.getAttribute('src'), ok: img.complete && img.naturalWidth > 0}));
        }"""
    )
    broken = [img["src"] for img in images if not img["ok"]]
    visit.settle()
    _SEEN[page] = p.evaluate(_COLLECT)

    assert not visit.outside_requests, f"{page}: requests leaving localhost: {visit.outside_requests}"
    assert not visit.failed, f"{page}: failed requests: {visit.failed}"
    assert not broken, f"{page}: images that did not load: {broken}"
    assert not visit.console_errors, f"{page}: console errors: {visit.console_errors}"


@pytest.mark.parametrize("page", PAGES or [NO_PAGES])
def test_internal_links_resolve(visit: Visit, page: str) -> None:
    """Every link to another page of the book (or a #fragment) points to a file and an id that exist."""
    if page == NO_PAGES:
        _skip_or_fail(f"no pages in {HTML}")
    hrefs = _seen(visit, page)["hrefs"]
    base = urlsplit(visit.base)
    dead = []
    for href in sorted(set(hrefs)):
        parts = urlsplit(href)
        if parts.scheme not in ("http", "https") or parts.netloc != base.netloc:
            continue  # outside links are not followed: the book must not need them
        target = _target_file(parts.path)
        if not target.is_file():
            dead.append(f"{href} (no file {target.relative_to(HTML)})")
        elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in _ids_in(target):
            dead.append(f"{href} (no id {parts.fragment!r} in {target.relative_to(HTML)})")
    assert not dead, f"{page}: links that do not resolve: {dead}"


@pytest.mark.parametrize("page", PAGES or [NO_PAGES])
def test_images_have_alt_text(visit: Visit, page: str) -> None:
    """Every image in the page body tells a screen reader what it shows (not just its file name)."""
    if page == NO_PAGES:
        _skip_or_fail(f"no pages in {HTML}")
    images = _seen(visit, page)["images"]
    bad = [
        img["src"]
        for img in images
        if not (img["alt"] or "").strip() or Path(img["alt"]).name == Path(img["src"] or "").name
    ]
    assert not bad, (
        f"{page}: images without alt text (a figure cell needs `:mystnb:` metadata with `image: alt:` and "
        f"`figure: caption:`): {bad}"
    )


@pytest.mark.parametrize("page", [p for p in PAGES if p.startswith("notebooks/")] or [NO_PAGES])
def test_code_has_copy_buttons(visit: Visit, page: str) -> None:
    """Every code block of a chapter has a copy button (sphinx-copybutton)."""
    if page == NO_PAGES:
        _skip_or_fail(f"no chapter pages in {HTML}")
    seen = _seen(visit, page)
    assert seen["code_blocks"] > 0, f"{page}: no code blocks found"
    assert seen["copy_buttons"] == seen["code_blocks"], f"{page}: {seen['copy_buttons']} copy buttons for " \
        f"{seen['code_blocks']} code blocks"


# ------------------------------------------------------------------------------------------------ cross-page tests


def _tab_pages() -> list[str]:
    """Pages with synced framework tabs, in table-of-contents order when possible."""
    found = [p for p in PAGES if 'data-sync-group="framework"' in (HTML / p).read_text(encoding="utf-8")]
    chapters = [p for p in found if p.startswith("notebooks/")]
    return chapters + [p for p in found if p not in chapters]


def _checked_tabs(page) -> dict[str, list[bool]]:
    """For each sync id of the framework group: whether the tab is selected, one entry per tab set."""
    return page.evaluate(
        """() => {
            const out = {};
            document.querySelectorAll('label.sd-tab-label[data-sync-group="framework"]').forEach(label => {
                const input = document.getElementById(label.getAttribute('for')) || label.previousElementSibling;
                const id = label.getAttribute('data-sync-id');
                (out[id] = out[id] || []).push(Boolean(input && input.checked));
            });
            return out;
        }"""
    )


def test_framework_tabs_sync_and_persist(visit: Visit) -> None:
    """Choosing Keras in one tab set selects Keras in every tab set, on this page and on the next."""
    pages = _tab_pages()
    if len(pages) < 2:
        _skip_or_fail(f"fewer than two pages with synced framework tabs: {pages}")
    first, second = pages[0], pages[1]
    visit.open(first)
    p = visit.page
    before = _checked_tabs(p)
    assert set(before) >= {"pytorch", "keras"}, f"{first}: tab sync ids are {sorted(before)}"
    assert all(before["pytorch"]) and not any(before["keras"]), f"{first}: PyTorch is not the default: {before}"

    p.locator('label.sd-tab-label[data-sync-group="framework"][data-sync-id="keras"]').first.click()
    after = _checked_tabs(p)
    assert all(after["keras"]) and not any(after["pytorch"]), f"{first}: not every tab set switched: {after}"
    panels = p.locator("input:checked + label[data-sync-id='keras'] + .sd-tab-content")
    assert panels.count() == len(after["keras"]) and all(panels.nth(i).is_visible() for i in range(panels.count()))

    visit.open(second)
    on_next = _checked_tabs(visit.page)
    assert on_next.get("keras") and all(on_next["keras"]), f"{second}: Keras did not stay chosen: {on_next}"
    assert not visit.console_errors and not visit.outside_requests


def test_query_parameter_selects_framework(visit: Visit) -> None:
    """``?framework=keras`` in a link opens a page with the Keras tabs selected."""
    pages = _tab_pages()
    if not pages:
        _skip_or_fail("no page with synced framework tabs")
    visit.open(pages[0] + "?framework=keras")
    tabs = _checked_tabs(visit.page)
    assert tabs.get("keras") and all(tabs["keras"]), f"{pages[0]}?framework=keras: {tabs}"


def test_search_finds_words(visit: Visit) -> None:
    """The search page works offline: a query for a word used throughout the book returns pages."""
    if "search.html" not in PAGES:
        _skip_or_fail("no search.html in the build")
    visit.open("search.html?q=attention")
    results = visit.page.locator("#search-results li, ul.search li")
    results.first.wait_for(state="attached", timeout=PAGE_TIMEOUT_MS)
    assert results.count() > 0
    assert not visit.console_errors and not visit.outside_requests


def test_front_page_redirects(visit: Visit) -> None:
    """``index.html`` (the address a reader types) forwards to the book's first page, which exists."""
    target = _redirect_target(HTML / "index.html")
    assert target, "index.html is neither a redirect stub nor in PAGES"
    assert (HTML / target).is_file(), f"index.html forwards to {target}, which is not in the build"
    visit.page.goto(visit.base + "index.html", wait_until="commit")
    visit.page.wait_for_url(visit.base + target)
    visit.settle()
    assert visit.page.locator("article.bd-article h1").count() == 1, f"{target}: no title after the redirect"
    assert not visit.console_errors and not visit.outside_requests and not visit.failed


def test_chapter_pages_offer_ipynb_download() -> None:
    """Each chapter page links to its executed notebook, and the notebook is in the build."""
    chapters = [p for p in PAGES if p.startswith("notebooks/")]
    if not chapters:
        _skip_or_fail(f"no chapter pages in {HTML}")
    missing = []
    for page in chapters:
        notebook = HTML / "_sources" / Path(page).with_suffix(".ipynb")
        if not notebook.is_file() or f"{Path(page).stem}.ipynb" not in (HTML / page).read_text(encoding="utf-8"):
            missing.append(page)
    assert not missing, f"chapters without a working .ipynb download: {missing}"
