"""The words of a chapter's figures in another language: captions and alt text.

A chapter's figure is a code cell's output; its caption and its alt text are in the cell's metadata
(``mystnb: figure: caption:`` and ``mystnb: image: alt:``), not in the page's Markdown, so Sphinx's gettext builder,
which runs without executing anything, never sees them. :func:`figure_messages` lists them for the page's message
template (``edition.py extract`` adds them), and in a translated build :func:`translate_figures` puts each one's
translation into the cell's metadata as the page is read. The code of the cell is left exactly as it is, so the
English build's executed outputs are still found for it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
# A code cell with a metadata block: the fence line, then the YAML between two "---" lines.
CELL = re.compile(r"^(```\{code-cell\}[^\n]*\n---\n)(.*?\n)(---\n)", re.S | re.M)
FIELDS = (("figure", "caption"), ("image", "alt"))


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def figure_messages(text: str) -> list[str]:
    """The captions and alt texts of a MyST notebook's code cells, in order, each once, on one line each."""
    found = []
    for match in CELL.finditer(text):
        mystnb = (yaml.safe_load(match.group(2)) or {}).get("mystnb") or {}
        found += [_one_line(mystnb[group][key]) for group, key in FIELDS if mystnb.get(group, {}).get(key)]
    return list(dict.fromkeys(found))


def translate_metadata(metadata: dict, translations: dict[str, str]) -> bool:
    """Put a code cell's caption and alt text (in ``metadata``, changed in place) in translation; return whether
    anything changed."""
    mystnb = metadata.get("mystnb") or {}
    changed = False
    for group, key in FIELDS:
        english = mystnb.get(group, {}).get(key)
        if english and translations.get(_one_line(english)):
            mystnb[group][key] = translations[_one_line(english)]
            changed = True
    return changed


def translate_figures(text: str, translations: dict[str, str]) -> str:
    """``text`` with each caption and alt text that has a translation replaced by it (nothing else changes)."""

    def replace(match: re.Match) -> str:
        metadata = yaml.safe_load(match.group(2)) or {}
        if not translate_metadata(metadata, translations):
            return match.group(0)
        block = yaml.safe_dump(metadata, allow_unicode=True, sort_keys=False, width=10_000)
        return match.group(1) + block + match.group(3)

    return CELL.sub(replace, text)


def catalogue_translations(language: str, docname: str, locales: Path = ROOT / "locales") -> dict[str, str]:
    """msgid -> msgstr of the page ``docname``'s catalogue in ``language`` (translated, not fuzzy)."""
    from babel.messages.pofile import read_po

    path = locales / language / "LC_MESSAGES" / f"{docname}.po"
    if not path.is_file():
        return {}
    with path.open("rb") as handle:
        catalog = read_po(handle)
    return {m.id: m.string for m in catalog if m.id and m.string and not m.fuzzy}


def translate_source(app, docname: str, source: list[str]) -> None:
    """Sphinx ``source-read``: in a translated build, the figures' words of a chapter in the build's language."""
    language = app.config.language
    if language in (None, "", "en") or not docname.startswith("notebooks/"):
        return
    translations = catalogue_translations(language, docname)
    if translations:
        source[0] = translate_figures(source[0], translations)
