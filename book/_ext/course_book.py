"""Sphinx extension of the course book (loaded through ``sphinx: local_extensions`` in ``_config.yml``).

1. A working "download .ipynb" entry on every notebook page: sphinx-book-theme shows one when the page context has
   ``ipynb_source``, which myst-nb 1.x no longer sets. We copy the notebook myst-nb executed for the page (outputs
   included) from ``_build/jupyter_execute`` to ``_build/html/_sources`` and point the button at it.
2. No duplicate scripts: jupyter-book registers sphinx-thebe's configuration script twice, and the second copy
   throws "Identifier 'THEBE_JS_URL' has already been declared" in every page's console. With thebe off (the
   default, see ``launch_buttons`` in ``_config.yml``) the thebe scripts are dropped altogether, so no page even
   names the CDN that thebe would load from.
3. The API reference (``book/api.md``) lists the companion's modules by itself: a line
   ``% companion-api: companion.torch`` (a MyST comment) becomes one section with an ``automodule`` per module of
   that package, so a module added to the package appears in the book without editing the page.
4. ``book/_static`` is served with every page and ``course.css`` and ``course.js`` linked from it: the layout rules
   that keep code, outputs, tables and formulas readable at any width, the bundled CJK font of the glossary, and a
   working "On this page" button (the contents drawer).
5. A language switcher in every page's header, leading to the same page in the other edition: the English book is
   ``_build/html``, the Chinese one ``_build/html/zh_CN`` (``book/_ext/edition.py``), so the link is relative and
   works on GitHub Pages and from disk alike. A ``<link rel="alternate" hreflang>`` names the other page too. A
   course without ``locales/zh_CN`` (the student release) builds no Chinese edition and shows no switcher.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import shutil
from pathlib import Path
from typing import Any

from figure_text import translate_source
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

EXECUTED_FOLDER = "jupyter_execute"  # myst_nb.sphinx_ext.OUTPUT_FOLDER
API_LINE = re.compile(r"^% companion-api:(?P<names>.*)$", re.MULTILINE)
# Reading order inside a framework package (CONTRIBUTING.md); modules not listed follow alphabetically.
MODULE_ORDER = ["device", "text", "masking", "attention", "multihead", "positional", "addnorm", "model", "training"]


def add_ipynb_download(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree) -> None:
    """Copy the executed notebook of ``pagename`` next to the page sources and tell the theme about it."""
    executed = Path(app.outdir).parent / EXECUTED_FOLDER / f"{pagename}.ipynb"
    if doctree is None or not executed.is_file():
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(executed, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


def _script_key(script) -> tuple:
    attributes = getattr(script, "attributes", {}) or {}
    return (str(getattr(script, "filename", script) or ""), attributes.get("body", ""))


def tidy_scripts(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree) -> None:
    """Drop repeated scripts (and thebe's when thebe is off) from the page's script list."""
    scripts = context.get("script_files")
    if not scripts:
        return
    launch = app.config.html_theme_options.get("launch_buttons", {}) or {}
    thebe_on = bool(launch.get("thebe")) or bool(getattr(app.config, "use_thebe", False))
    seen, kept = set(), []
    for script in scripts:
        key = _script_key(script)
        if key in seen:
            continue
        seen.add(key)
        if not thebe_on and ("thebe" in key[0].lower() or "THEBE_JS_URL" in key[1]):
            continue
        kept.append(script)
    context["script_files"] = kept


def _modules(name: str) -> list[str]:
    """``name`` itself when it is a plain module; its public submodules, in reading order, when it is a package."""
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        logger.warning("companion-api: cannot import %s (%s)", name, error)
        return []
    if not hasattr(module, "__path__"):
        return [name]
    found = sorted(info.name for info in pkgutil.iter_modules(module.__path__) if not info.name.startswith("_"))
    found.sort(key=lambda short: (MODULE_ORDER.index(short) if short in MODULE_ORDER else len(MODULE_ORDER), short))
    # A package whose __init__ holds code of its own (companion.checks) is documented first.
    own = [name] if _has_own_code(module) else []
    return own + [f"{name}.{short}" for short in found if short != "__main__"]


def _has_own_code(module) -> bool:
    return any(getattr(obj, "__module__", None) == module.__name__ for obj in vars(module).values() if callable(obj))


def expand_api_lines(app: Sphinx, docname: str, source: list[str]) -> None:
    """Replace each ``% companion-api: a b`` line of a page with a section and ``automodule`` per module."""

    def expand(match: re.Match) -> str:
        blocks = []
        for name in match.group("names").split():
            for module in _modules(name):
                # eval-rst: autodoc writes reStructuredText, which MyST passes through only inside eval-rst.
                blocks.append(f"### `{module}`\n\n```{{eval-rst}}\n.. automodule:: {module}\n```\n")
        return "\n".join(blocks)

    source[0] = API_LINE.sub(expand, source[0])


STATIC = Path(__file__).resolve().parents[1] / "_static"  # book/_static: the course's CSS and its CJK font
TEMPLATES = Path(__file__).resolve().parent / "templates"  # the language switcher
# Each edition: the folder it lives in, relative to the English book's root, and how its switcher link reads.
EDITIONS = {
    "en": {"folder": "", "hreflang": "en", "label": "English", "title": "Read this page in English"},
    "zh_CN": {"folder": "zh_CN/", "hreflang": "zh-CN", "label": "中文", "title": "阅读本页的中文版"},
}


def add_static(app: Sphinx, config) -> None:
    """Serve ``book/_static`` (layout CSS, the bundled CJK font) with every page; add the switcher's template."""
    if str(STATIC) not in config.html_static_path:
        config.html_static_path.append(str(STATIC))
    if str(TEMPLATES) not in config.templates_path:
        config.templates_path.append(str(TEMPLATES))
    header_end = config.html_theme_options.setdefault("article_header_end", ["article-header-buttons.html"])
    if isinstance(header_end, list) and "course-language.html" not in header_end:
        header_end.insert(0, "course-language.html")


def other_edition_link(language: str | None, pagename: str) -> dict[str, str]:
    """The link from ``pagename`` in the ``language`` edition to the same page in the other edition."""
    here = "zh_CN" if (language or "en").startswith("zh") else "en"
    other = EDITIONS["en" if here == "zh_CN" else "zh_CN"]
    up = "../" * pagename.count("/") + ("../" if here == "zh_CN" else "")  # from the page to the English root
    link = {key: other[key] for key in ("hreflang", "label", "title")}
    return {**link, "href": f"{up}{other['folder']}{pagename}.html"}


def add_language_link(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree) -> None:
    """Give the page its switcher link (``course_language``) and a ``<link rel="alternate">``; none where the course
    has no Chinese catalogues (the student release), since no Chinese edition is built there."""
    if not (Path(app.srcdir) / "locales" / "zh_CN").is_dir():
        return
    link = other_edition_link(app.config.language, pagename)
    context["course_language"] = link
    context["metatags"] = context.get("metatags", "") + (
        f'\n<link rel="alternate" hreflang="{link["hreflang"]}" href="{link["href"]}" />')


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", add_static)
    app.add_css_file("course.css")
    app.add_js_file("course.js")
    # sphinx-book-theme builds its header buttons at priority 501: run before it.
    app.connect("html-page-context", add_ipynb_download, priority=400)
    app.connect("html-page-context", tidy_scripts, priority=900)
    app.connect("html-page-context", add_language_link)  # after sphinx.ext.mathjax adds its scripts
    app.connect("source-read", expand_api_lines)
    app.connect("source-read", translate_source)  # a translated build: the figures' captions and alt text
    return {"version": "0.2", "parallel_read_safe": True, "parallel_write_safe": True}
