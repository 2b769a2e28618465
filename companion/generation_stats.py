"""Two measurements of generated text that chapter 8 and its multi-seed benchmark share (framework-free).

- ``repeats_itself``: does a sequence of tokens contain the same run of ``n`` tokens twice (a loop)?
- ``unknown_word_share``: which share of the words of a text never occur in a reference text (made-up words)?
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_WORD = re.compile(r"[A-Za-z]{2,}")


def words(text: str) -> list[str]:
    """The words of ``text``: runs of at least two ASCII letters, lower-cased (numbers and symbols are not words)."""
    return [word.lower() for word in _WORD.findall(text)]


def repeats_itself(tokens: Sequence[int], n: int = 4) -> bool:
    """True when some run of ``n`` consecutive tokens occurs at least twice in ``tokens`` (length ``(length,)``)."""
    if n < 1:
        raise ValueError(f"n must be a positive run length, got {n}")
    runs = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(runs)) < len(runs)


def unknown_word_share(texts: Iterable[str], known: set[str]) -> float:
    """The share of the words of ``texts`` that are not in ``known`` (0.0 when the texts hold no word)."""
    found = [word for text in texts for word in words(text)]
    if not found:
        return 0.0
    return sum(word not in known for word in found) / len(found)
