"""The book's other editions: the Chinese one built from the same sources through gettext catalogues.

The English book (``make book``, :func:`build_english`) executes every notebook, two pages at a time
(``book/_ext/page_order.py``); ``jupyter-book build .`` builds the same book with one process. The Chinese
edition is the same Sphinx project with ``language = "zh_CN"`` and the catalogues of ``locales/`` applied to every
paragraph, heading, table cell and caption; the code cells and their outputs are the English build's, reused:

1. :func:`fill_cache` puts every notebook the English build executed (``_build/jupyter_execute``, outputs included)
   into a jupyter-cache of its own (``_build/zh_CN/.jupyter_cache``, emptied first);
2. :func:`build` runs Sphinx with MyST-NB in ``cache`` mode on that cache, so each chapter is matched by its code
   cells and merged with the stored outputs. Executing is refused outright (:func:`_refuse_execution`): a chapter
   whose code has no executed English counterpart fails the build with a message instead of running for minutes;
3. the HTML is copied to ``_build/html/zh_CN``, beside the English pages, so one folder holds both editions (what
   GitHub Pages serves, and what a reader opens from disk).

The jupyter-book command line cannot pass Sphinx settings (``-D``) or a number of processes, so the builds here
call jupyter-book's own ``build_sphinx`` with ``_config.yml`` and the overrides of :data:`EDITIONS`. ``extract``
writes the message templates (``.pot``) from today's English sources, one per page; ``make locales`` then updates
the catalogues with sphinx-intl.

Usage::

    python book/_ext/edition.py html en [--all] [--jobs 2] [--fresh-kernels]   # the English book, executing notebooks
    python book/_ext/edition.py html zh_CN [--all]   # after the English build
    python book/_ext/edition.py gettext [OUTDIR]      # the templates, default _build/gettext/pot
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:  # book/_ext, when this file is loaded by its path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from warm_kernels import warm_kernels  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "_build"
LOCALES = ROOT / "locales"
EXECUTED = BUILD / "jupyter_execute"  # where myst-nb writes the English build's executed notebooks

# Per edition: the Sphinx settings that differ from _config.yml's. Theme words ("Contents", prev/next, buttons) come
# from Sphinx's, pydata-sphinx-theme's and sphinx-book-theme's own zh_CN catalogues once ``language`` is set; the
# search box's placeholder and the title are settings (jupyter-book writes them in English), so they are here.
EDITIONS: dict[str, dict[str, Any]] = {
    "zh_CN": {
        "language": "zh_CN",
        "html_title": "Transformer：从把文本变成数字到训练出一个模型",
        "author": "课程作者",
        "html_theme_options": {"search_bar_text": "在本书中搜索……"},
    },
}
# How the catalogues are cut and named: one per page, no source locations or uuids (the diffs stay readable).
GETTEXT_SETTINGS = {"gettext_compact": False, "gettext_location": False, "gettext_uuid": False}


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def warnings_in(text: str) -> set[str]:
    """The Sphinx warnings and errors in a build's ``text`` output, colours removed, one per line."""
    lines = (ANSI.sub("", line).strip() for line in text.splitlines())
    return {line for line in lines if re.search(r"\b(WARNING|ERROR|CRITICAL):", line)}


class _Recorder(io.TextIOBase):
    """A text stream that passes everything on to ``stream`` and keeps a copy."""

    def __init__(self, stream) -> None:
        self.stream, self.parts = stream, []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


class ExecutionRefused(RuntimeError):
    """A translated edition was about to execute a notebook instead of reusing the English outputs."""


def _refuse_execution(notebook, cwd=None, **kwargs):
    name = notebook.metadata.get("jupytext", {}).get("text_representation", {}).get("format_name", "notebook")
    raise ExecutionRefused(
        f"no executed English notebook matches this {name} chapter's code (cwd {cwd}): build the English book first "
        "(`make book`); the translated editions never execute notebooks"
    )


def fill_cache(executed: Path, cache_path: Path, language: str | None = None) -> int:
    """Put every executed notebook under ``executed`` into a fresh jupyter-cache at ``cache_path``; return how many.

    With a ``language``, each chapter's figure captions and alt texts are first put in that language, as the
    translated build will read them (:mod:`figure_text`): the cache matches a notebook by its code cells and their
    metadata, and the figures' words are metadata.
    """
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.cache.main import CacheBundleIn, NbArtifacts

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    from figure_text import catalogue_translations, translate_metadata

    if cache_path.exists():
        shutil.rmtree(cache_path)
    cache = get_cache(str(cache_path))
    notebooks = sorted(executed.rglob("*.ipynb"))
    for path in notebooks:
        notebook = nbformat.read(str(path), nbformat.NO_CONVERT)
        uri = str(path.relative_to(executed))
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        if code and not any(cell.get("execution_count") or cell.get("outputs") for cell in code):
            raise ExecutionRefused(f"{path} was never executed: build the English book first "
                                   "(`make book`); the translated editions reuse its outputs")
        if language:
            translations = catalogue_translations(language, str(Path(uri).with_suffix("")))
            for cell in notebook.cells:
                translate_metadata(cell.metadata, translations)
        cache.cache_notebook_bundle(CacheBundleIn(notebook, uri, artifacts=NbArtifacts([], in_folder=path.parent)),
                                    check_validity=False, overwrite=True)
    return len(notebooks)


def executed_count(cache_path: Path) -> int:
    """How many notebooks a build asked the cache at ``cache_path`` to execute (cache hits leave no project record)."""
    from jupyter_cache import get_cache

    return len(get_cache(str(cache_path)).list_project_records())


def _sphinx(outdir: Path, builder: str, overrides: dict[str, Any], force_all: bool, jobs: int = 1) -> int:
    from jupyter_book.sphinx import build_sphinx

    sys.path.insert(0, str(ROOT / "book" / "_ext"))  # local_extensions, as jupyter-book adds them
    overrides = {"external_toc_path": str(ROOT / "_toc.yml"), "latex_individualpages": False, **overrides}
    return build_sphinx(ROOT, outdir, noconfig=True, path_config=str(ROOT / "_config.yml"), confoverrides=overrides,
                        builder=builder, freshenv=force_all, keep_going=True, jobs=jobs)


# The thread pools of PyTorch (OpenMP, MKL) and TensorFlow, as their environment variables name them.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def kernel_threads(jobs: int, cores: int | None = None) -> dict[str, str]:
    """The thread counts for notebooks that run ``jobs`` at a time: the cores shared out, at least one each.

    Each framework otherwise starts a thread per core in every kernel, and two kernels on two cores then wait on
    each other's spinning threads (chapter 8 took 117 s beside chapter 7 instead of 94 s with one thread each)."""
    if jobs == 1:
        return {}
    share = max(1, (cores or os.cpu_count() or 1) // jobs)
    return dict.fromkeys(THREAD_VARIABLES, str(share))


def build_english(force_all: bool = False, jobs: int = 1, fresh_kernels: bool = False) -> int:
    """Build the English book into ``_build/html``, executing its notebooks (what ``jupyter-book build .`` does,
    with ``jobs`` processes reading pages side by side, and kernels forked with PyTorch and Keras already imported
    unless ``fresh_kernels``: see warm_kernels.py)."""
    if jobs < 1:
        raise ValueError(f"jobs must be a positive number of processes; got {jobs}")
    for name, value in kernel_threads(jobs).items():
        os.environ.setdefault(name, value)  # the kernels inherit them; a reader's own setting wins
    start = time.perf_counter()
    with contextlib.nullcontext() if fresh_kernels else warm_kernels():
        status = _sphinx(BUILD / "html", "html", {}, force_all, jobs)
    print(f"English edition: {time.perf_counter() - start:.0f} s with {jobs} processes; _build/html/index.html")
    return status


def translated_toc(language: str, home: Path) -> Path:
    """``_toc.yml`` with its parts' captions in ``language``, written to ``home``; the captions' translations are in
    the catalogue of the theme's words (``sphinx.po``), and a caption without one is an error, not English."""
    import yaml
    from babel.messages.pofile import read_po

    words = LOCALES / language / "LC_MESSAGES" / "sphinx.po"
    with words.open("rb") as handle:
        catalog = read_po(handle)
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    missing = []
    for part in toc.get("parts", []):
        message = catalog.get(part["caption"]) if "caption" in part else None
        if "caption" in part and (message is None or not message.string or message.fuzzy):
            missing.append(part["caption"])
        elif message is not None:
            part["caption"] = message.string
    if missing:
        raise ValueError(f"_toc.yml: no {language} translation of the captions {missing} in {words}")
    path = home / "_toc.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(toc, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def build(language: str, force_all: bool = False, english_warnings: Path | None = None, jobs: int = 1) -> int:
    """Build the ``language`` edition into ``_build/<language>/html`` and copy it to ``_build/html/<language>``.

    Fails (status 1) when it had to execute a notebook, or when it warns where the English build (whose standard
    error ``english_warnings`` holds) did not: a translation that breaks a role, a reference or the markup.
    """
    import myst_nb.core.execute.cache as myst_cache

    if language not in EDITIONS:
        raise ValueError(f"language must be one of {sorted(EDITIONS)}; got {language!r}")
    if not EXECUTED.is_dir():
        raise FileNotFoundError(f"no {EXECUTED.relative_to(ROOT)}: build the English book first (`make book`)")
    start, cpu_start = time.perf_counter(), time.process_time()
    home = BUILD / language
    cache_path = home / ".jupyter_cache"
    reused = fill_cache(EXECUTED, cache_path, language)
    myst_cache.single_nb_execution = _refuse_execution
    overrides = {**EDITIONS[language], **GETTEXT_SETTINGS, "locale_dirs": [str(LOCALES)],
                 "nb_execution_mode": "cache", "nb_execution_cache_path": str(cache_path),
                 "external_toc_path": str(translated_toc(language, home))}
    recorder = _Recorder(sys.stderr)
    with contextlib.redirect_stderr(recorder):
        status = _sphinx(home / "html", "html", overrides, force_all, jobs)
    executed = executed_count(cache_path)
    english = warnings_in(english_warnings.read_text(encoding="utf-8")) if english_warnings else set()
    added = sorted(warnings_in("".join(recorder.parts)) - english)
    published = BUILD / "html" / language
    if status == 0:
        if published.exists():
            shutil.rmtree(published)
        shutil.copytree(home / "html", published)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(f"{language} edition: {seconds:.0f} s ({cpu:.0f} s of CPU), {executed} notebooks executed, "
          f"{reused} executed English notebooks available for reuse, "
          f"{len(added)} warnings the English build does not give; "
          f"{published.relative_to(ROOT)}/index.html")
    for line in added:
        print(f"  {line}")
    return status or (1 if executed or added else 0)


API_PAGES = {"api"}  # pages whose sections course_book generates from ``% companion-api:`` lines
ONLY_CODE = re.compile(r"(`[^`]+`[\s,;]*)+")  # a message with nothing to translate, e.g. a module name as a heading


def _message_id(entry: str) -> str:
    """The msgid of one entry of a ``.pot`` text (its quoted lines joined)."""
    lines, inside = [], False
    for line in entry.splitlines():
        if line.startswith("msgid "):
            inside, line = True, line[len("msgid "):]
        elif not line.startswith('"'):
            inside = False
        if inside:
            lines.append(line.strip()[1:-1])
    return "".join(lines)


def without_docstrings(template: str, generated_headings: bool = False) -> str:
    """A ``.pot`` text (written with source locations, one ``#:`` line each) without the messages whose every
    location is a docstring that autodoc put on a page, and without the location lines. With
    ``generated_headings`` (the API page), messages that are only inline code go too: the module headings that
    ``course_book`` writes read the same in every language."""
    kept = []
    for entry in template.split("\n\n"):
        places = [line for line in entry.splitlines() if line.startswith("#: ")]
        if places and all("docstring of " in line for line in places) or (
                generated_headings and ONLY_CODE.fullmatch(_message_id(entry))):
            continue
        kept.append("\n".join(line for line in entry.splitlines() if not line.startswith("#: ")))
    return "\n\n".join(kept)


def extract(outdir: Path = BUILD / "gettext" / "pot") -> int:
    """Write one message template (``.pot``) per page of today's English sources into ``outdir``.

    The companion's docstrings, which autodoc puts on the API page, are left out: the reference stays in English,
    like the code it documents (``tests/test_catalogues.py`` checks that no catalogue holds one). The templates
    carry no source locations (they are only needed here, to find the docstrings).
    """
    overrides = {**GETTEXT_SETTINGS, "gettext_location": True, "nb_execution_mode": "off"}
    if outdir.resolve().parent == BUILD.resolve():
        # myst-nb writes a build's notebooks to OUTDIR/../jupyter_execute: here that would replace the English
        # build's executed notebooks, which the translated editions reuse, by unexecuted ones
        raise ValueError(f"outdir: {outdir} would overwrite {EXECUTED}; use a folder one level deeper")
    status = _sphinx(outdir, "gettext", overrides, force_all=True)
    for path in sorted(outdir.rglob("*.pot")):
        text = without_docstrings(path.read_text(encoding="utf-8"), generated_headings=path.stem in API_PAGES)
        path.write_text(text, encoding="utf-8")
    add_figure_messages(outdir)
    return status


def add_figure_messages(outdir: Path) -> None:
    """Add each chapter's figure captions and alt texts (cell metadata, which gettext does not see) to its template."""
    from babel.messages.pofile import read_po, write_po

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    from figure_text import figure_messages

    for chapter in sorted((ROOT / "notebooks").glob("*.md")):
        path = outdir / "notebooks" / f"{chapter.stem}.pot"
        if not path.is_file():
            continue
        with path.open("rb") as handle:
            template = read_po(handle)
        for message in figure_messages(chapter.read_text(encoding="utf-8")):
            if message not in template:
                template.add(message)
        with path.open("wb") as handle:
            write_po(handle, template, width=76, omit_header=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    html = commands.add_parser("html", help="build a translated edition (after the English build)")
    html.add_argument("language", choices=["en", *sorted(EDITIONS)])
    html.add_argument("--all", action="store_true", help="re-read every page (after the English build re-read all)")
    html.add_argument("--english-warnings", type=Path, help="the English build's standard error, to compare with")
    html.add_argument("--jobs", type=int, default=1, help="processes that read pages side by side (default 1)")
    html.add_argument("--fresh-kernels", action="store_true",
                      help="start every notebook's kernel from scratch (English; default: forked, preloaded)")
    gettext = commands.add_parser("gettext", help="extract the message templates from the English sources")
    gettext.add_argument("outdir", type=Path, nargs="?", default=BUILD / "gettext" / "pot")
    args = parser.parse_args(argv)
    if args.command == "html" and args.language == "en":
        return build_english(force_all=args.all, jobs=args.jobs, fresh_kernels=args.fresh_kernels)
    if args.command == "html":
        return build(args.language, force_all=args.all, english_warnings=args.english_warnings, jobs=args.jobs)
    return extract(args.outdir)


if __name__ == "__main__":
    sys.exit(main())
