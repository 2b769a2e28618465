"""The exercise notebooks in Chinese: generated from the solutions and the catalogues, same code, same grades."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from companion.grade import PASSED, grade
from companion.instructor import exercise_translation as translation
from companion.instructor.exercises import expected_exercises, make_exercise

ROOT = Path(__file__).resolve().parents[1]
CODE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n.*?^```$", re.S | re.M)
SAMPLE = """---
jupytext:
  text_representation:
    format_name: myst
---

# Exercises: Demo

Write `f(x)` for a tensor `(batch, seq_len)`;
see [the chapter](../notebooks/01_text_as_numbers.md#one) and $QK^T$.

- first item,
  continued
- second item

| a | b |
| --- | --- |

```{code-cell} ipython3
def f(x):
    ### BEGIN SOLUTION
    return x
    ### END SOLUTION
```
"""


def _fake_translations(text: str) -> dict[str, str]:
    """A stand-in catalogue: every message prefixed with Chinese, its markup kept."""
    return {message: f"译文：{message}" for message in translation.messages(text)}


def test_committed_chinese_exercises_match_the_generator() -> None:
    expected = translation.translated_exercises(ROOT / "solutions", "zh_CN")
    folder = ROOT / "exercises" / "zh_CN"
    committed = {p.name: p.read_text(encoding="utf-8") for p in folder.glob("*.md")}
    assert sorted(committed) == sorted(expected), "exercises/zh_CN and solutions/ hold different notebooks"
    stale = [name for name in expected if committed[name] != expected[name]]
    assert not stale, f"exercises/zh_CN out of date, run `make exercises`: {stale}"


def test_every_exercise_has_a_catalogue() -> None:
    for name in expected_exercises(ROOT / "solutions"):
        assert translation.catalogue_path(name, "zh_CN").is_file(), f"no catalogue for {name}: run `make locales`"


def test_messages_are_paragraphs_headings_items_and_rows() -> None:
    exercise = make_exercise(SAMPLE, "demo.md")
    found = translation.messages(exercise)
    assert found == [
        "Exercises: Demo",
        "Write `f(x)` for a tensor `(batch, seq_len)`; see [the chapter](../notebooks/01_text_as_numbers.md#one) "
        "and $QK^T$.",
        "first item, continued", "second item", "| a | b |", "| --- | --- |",
    ]
    assert not any("NotImplementedError" in m or "jupytext" in m or "Generated" in m for m in found)


def test_translation_keeps_code_and_moves_links_one_folder_down() -> None:
    exercise = make_exercise(SAMPLE, "demo.md")
    translated = translation.translate(exercise, _fake_translations(exercise))
    assert CODE_CELL.findall(translated) == CODE_CELL.findall(exercise)
    assert translated.startswith("---\njupytext:")
    assert "# 译文：Exercises: Demo\n" in translated and "- 译文：first item, continued\n" in translated
    assert "](../../notebooks/01_text_as_numbers.md#one)" in translated
    # untranslated: the English lines as they were, links moved too
    untouched = translation.translate(exercise, {})
    assert untouched == exercise.replace("](../notebooks", "](../../notebooks")


def test_catalogue_update_keeps_translations_and_marks_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "demo.po"
    translation.update_catalogue(path, ["Exercise one", "Write the mask function."], "zh_CN")
    text = path.read_text(encoding="utf-8")
    text = text.replace('msgid "Exercise one"\nmsgstr ""', 'msgid "Exercise one"\nmsgstr "练习一"')
    path.write_text(text, encoding="utf-8")
    translation.update_catalogue(path, ["Exercise one", "Write the mask functions."], "zh_CN")
    assert translation.read_translations(path) == {"Exercise one": "练习一"}  # the fuzzy guess is not used
    updated = path.read_text(encoding="utf-8")
    assert "#, fuzzy" in updated or '#~ msgid "Write the mask function."' in updated
    with pytest.raises(ValueError, match="language"):
        translation.catalogue_path("demo.md", "fr")


def test_the_grader_grades_chinese_notebooks_as_the_english_ones(tmp_path: Path) -> None:
    """A translated solution passes every exercise and a translated stub fails each as the English stub does."""
    name = "01_text_as_numbers.md"
    solution = (ROOT / "solutions" / name).read_text(encoding="utf-8")
    chinese_solution = tmp_path / "zh_solution" / name
    chinese_solution.parent.mkdir()
    chinese_solution.write_text(translation.translate(solution, _fake_translations(solution)), encoding="utf-8")
    assert "译文" in chinese_solution.read_text(encoding="utf-8")
    paths = [ROOT / "solutions" / name, chinese_solution,
             ROOT / "exercises" / name, ROOT / "exercises" / "zh_CN" / name]
    report = grade(paths, tracks=["numpy"])
    verdicts = [[(r.id, r.track, r.status, r.reason) for r in notebook.exercises] for notebook in report.notebooks]
    english_solution, translated_solution, english_stub, translated_stub = verdicts
    assert translated_solution == english_solution and english_solution
    assert all(status == PASSED for _, track, status, _ in english_solution if track == "numpy")
    assert translated_stub == english_stub
    assert any(status != PASSED for _, _, status, _ in english_stub)
