"""The Chinese edition reuses the English build's executed notebooks and never executes one (book/_ext/edition.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _edition():
    spec = importlib.util.spec_from_file_location("edition", ROOT / "book" / "_ext" / "edition.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("edition", module)
    spec.loader.exec_module(module)
    return module


edition = _edition()


def _notebook(source: str, output: str | None = None) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    if output is not None:
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=output)]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Title"), cell])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return notebook


def test_the_cache_matches_a_chapter_by_its_code_and_gives_the_english_outputs(tmp_path: Path) -> None:
    from jupyter_cache import get_cache

    executed = tmp_path / "jupyter_execute" / "notebooks"
    executed.mkdir(parents=True)
    nbformat.write(_notebook("print(6 * 7)", output="42\n"), executed / "01_demo.ipynb")
    cache_path = tmp_path / "cache"
    assert edition.fill_cache(executed.parent, cache_path) == 1
    cache = get_cache(str(cache_path))
    translated = _notebook("print(6 * 7)")
    translated.cells[0].source = "# 标题"  # the prose differs between editions; the code does not
    _, merged = cache.merge_match_into_notebook(translated)
    assert merged.cells[1].outputs[0]["text"] == "42\n"
    with pytest.raises(KeyError):  # other code: no match, so the build would have to execute
        cache.match_cache_notebook(_notebook("print(6 * 8)"))
    assert edition.executed_count(cache_path) == 0
    assert edition.fill_cache(executed.parent, cache_path) == 1  # refilled from scratch, no stale records


def test_executing_is_refused() -> None:
    with pytest.raises(edition.ExecutionRefused, match="build the English book first"):
        edition._refuse_execution(_notebook("1"), cwd="notebooks")


def test_warnings_are_compared_without_colours() -> None:
    english = "\x1b[91m/x/notebooks/02.md:10: WARNING: undefined label: 'a'\x1b[39;49;00m\nchecking consistency... done"
    chinese = english + "\n/x/notebooks/02.md:12: WARNING: undefined label: 'b'\nI0000 oneDNN custom operations are on"
    assert edition.warnings_in(chinese) - edition.warnings_in(english) == {
        "/x/notebooks/02.md:12: WARNING: undefined label: 'b'"}


def test_the_last_chinese_build_executed_nothing() -> None:
    """The cache of the last `make book` (or `make book-zh`) holds no notebook that build had to execute."""
    cache_path = ROOT / "_build" / "zh_CN" / ".jupyter_cache"
    if not cache_path.is_dir():
        pytest.skip("no Chinese build yet (`make book`)")
    assert edition.executed_count(cache_path) == 0
    assert (ROOT / "_build" / "html" / "zh_CN" / "notebooks" / "02_attention.html").is_file()


def test_the_sidebar_captions_are_translated_or_the_build_fails(tmp_path, monkeypatch):
    import yaml

    toc = yaml.safe_load(edition.translated_toc("zh_CN", tmp_path).read_text(encoding="utf-8"))
    english = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    assert [part["caption"] for part in toc["parts"]] == ["入门", "章节", "参考"]
    assert [part["chapters"] for part in toc["parts"]] == [part["chapters"] for part in english["parts"]]
    (tmp_path / "locales" / "zh_CN" / "LC_MESSAGES").mkdir(parents=True)
    (tmp_path / "locales" / "zh_CN" / "LC_MESSAGES" / "sphinx.po").write_text('msgid "Chapters"\nmsgstr "章节"\n')
    monkeypatch.setattr(edition, "LOCALES", tmp_path / "locales")
    monkeypatch.setattr(edition, "ROOT", ROOT)
    with pytest.raises(ValueError, match="Getting started"):
        edition.translated_toc("zh_CN", tmp_path)


def test_extraction_cannot_overwrite_the_executed_notebooks_and_unexecuted_ones_are_refused(tmp_path):
    with pytest.raises(ValueError, match="jupyter_execute"):
        edition.extract(edition.BUILD / "gettext")
    executed = tmp_path / "jupyter_execute"
    executed.mkdir()
    nbformat.write(_notebook("x = 1"), executed / "page.ipynb")          # a code cell that never ran
    with pytest.raises(edition.ExecutionRefused, match="never executed"):
        edition.fill_cache(executed, tmp_path / "cache")


def test_notebooks_run_side_by_side_share_the_cores_out() -> None:
    assert edition.kernel_threads(1, cores=8) == {}                      # one at a time: the frameworks' defaults
    assert set(edition.kernel_threads(2, cores=2).values()) == {"1"}
    assert edition.kernel_threads(2, cores=8)["OMP_NUM_THREADS"] == "4"
    assert edition.kernel_threads(4, cores=2)["TF_NUM_INTRAOP_THREADS"] == "1"   # never zero threads
    with pytest.raises(ValueError, match="jobs"):
        edition.build_english(jobs=0)
