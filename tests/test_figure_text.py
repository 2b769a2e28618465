"""The figures' captions and alt text reach the translated edition without touching the code they belong to."""

import sys
from pathlib import Path

import jupytext

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import figure_text  # noqa: E402

CHAPTER = """---
jupytext:
  text_representation:
    format_name: myst
kernelspec:
  name: python3
  display_name: Python 3
---

# A chapter

```{code-cell} ipython3
---
mystnb:
  figure:
    caption: The masks, dark = may
      attend.
    name: fig-masks
  image:
    alt: Three black and white matrices.
tags: [hide-input]
---
plot(1)
```

```{code-cell} ipython3
x = 2
```
"""


def _code(text):
    notebook = jupytext.reads(text, fmt="md:myst")
    return [(cell.source, cell.metadata.get("tags")) for cell in notebook.cells if cell.cell_type == "code"]


def test_captions_and_alt_text_are_messages_and_are_translated_without_touching_the_code():
    assert figure_text.figure_messages(CHAPTER) == ["The masks, dark = may attend.", "Three black and white matrices."]
    translated = figure_text.translate_figures(CHAPTER, {"The masks, dark = may attend.": "掩码，深色 = 可以关注。"})
    assert _code(translated) == _code(CHAPTER)
    metadata = jupytext.reads(translated, fmt="md:myst").cells[1].metadata["mystnb"]
    assert metadata["figure"] == {"caption": "掩码，深色 = 可以关注。", "name": "fig-masks"}
    assert metadata["image"]["alt"] == "Three black and white matrices."      # no translation: English stays
    assert figure_text.translate_figures(CHAPTER, {}) == CHAPTER


def test_every_chapter_figure_has_its_translation():
    for chapter in sorted((ROOT / "notebooks").glob("*.md")):
        messages = figure_text.figure_messages(chapter.read_text(encoding="utf-8"))
        translations = figure_text.catalogue_translations("zh_CN", f"notebooks/{chapter.stem}")
        missing = [m for m in messages if not translations.get(m)]
        assert not missing, f"{chapter.name}: figure text without a translation (`make locales`): {missing[:2]}"
