"""Error analysis for the toy translation task: sort a wrong translation into one kind of mistake.

Framework-free (plain Python on token strings): chapter 7 applies it to the outputs of both frameworks. Each kind
is a test on the reference and the model's output (the hypothesis), tried in the order of :data:`KINDS`; the
first that matches names the error:

* ``early end``: the hypothesis is shorter than the reference and, word for word, its beginning (a word may be
  another form of the right one, or another number word): it stops too soon (``</s>`` came early), whatever
  else it got wrong on the way;
* ``no end``: the hypothesis is longer than the reference and starts with it, word for word in the same sense,
  or fills the length limit (``</s>`` came late or never);
* ``number``: the French number words differ (a wrong or badly formed number, including "un"/"une" after "et");
* ``word order``: the same words as the reference, in another order;
* ``agreement``: the same length, and every wrong word is another form of the right one (gender, number, verb
  person: ``noir`` for ``noire``, ``dort`` for ``dorment``, ``le`` for ``la``);
* ``other``: anything else (a wrong or missing word).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence

from .data import (
    ADJECTIVES_AFTER,
    ADJECTIVES_BEFORE,
    DETERMINERS,
    INTRANSITIVE_VERBS,
    NOUNS,
    NUMBERS,
    TRANSITIVE_VERBS,
    number_words,
)

#: The kinds of error, in the order they are tested.
KINDS: tuple[str, ...] = ("early end", "no end", "number", "word order", "agreement", "other")


@functools.lru_cache(maxsize=1)
def _lemmas() -> dict[str, str]:
    """French word -> a name shared by all its forms (the first form of its row in the grammar's tables)."""
    groups: list[tuple[str, ...]] = [row[2:4] for row in NOUNS]
    groups += [row[1:] for row in ADJECTIVES_BEFORE + ADJECTIVES_AFTER]
    groups += [row[2:] + (("de",) if row[4] == "des" else ()) for row in DETERMINERS]
    groups += [row[2:] for row in INTRANSITIVE_VERBS + TRANSITIVE_VERBS]
    groups += [("est", "sont", "n'est")]
    lemmas: dict[str, str] = {}
    for group in groups:
        for word in group:
            lemmas.setdefault(word, group[0])
    return lemmas


@functools.lru_cache(maxsize=1)
def french_number_words() -> frozenset[str]:
    """Every word that occurs in a French number of :data:`companion.data.NUMBERS`, either gender."""
    return frozenset(w for n in NUMBERS for gender in ("m", "f") for w in number_words(n, "fr", gender))


def number_spans(tokens: Sequence[str]) -> list[tuple[str, ...]]:
    """The runs of French number words in a sentence, in order; a lone ``un``/``une`` is an article, not a number.

    >>> number_spans("vingt et une maisons voient le chien".split())
    [('vingt', 'et', 'une')]
    """
    words, spans, run = french_number_words(), [], []
    for token in [*tokens, ""]:
        if token in words:
            run.append(token)
            continue
        if run and run not in (["un"], ["une"]):
            spans.append(tuple(run))
        run = []
    return spans


def _tokens(sentence: str | Sequence[str], name: str) -> list[str]:
    if isinstance(sentence, str):
        return sentence.split()
    if not all(isinstance(token, str) for token in sentence):
        raise ValueError(f"{name} must be a sentence string or a list of token strings; got {sentence!r}")
    return list(sentence)


def _same_slot(reference_word: str, hypothesis_word: str, lemmas: dict[str, str], numbers: frozenset[str]) -> bool:
    """Whether the hypothesis has the reference's word in this place, possibly in another form or as another
    number word (``petit`` for ``petits``, ``un`` for ``onze``)."""
    if reference_word == hypothesis_word:
        return True
    if reference_word in lemmas and lemmas.get(hypothesis_word) == lemmas[reference_word]:
        return True
    return reference_word in numbers and hypothesis_word in numbers


def classify_error(
    reference: str | Sequence[str], hypothesis: str | Sequence[str], max_len: int | None = None
) -> str | None:
    """The kind of mistake (one of :data:`KINDS`) in ``hypothesis``, or None when it equals ``reference``.

    Args:
        reference, hypothesis: sentences as strings (split on spaces) or token lists, without ``<s>``/``</s>``.
        max_len: the decoder's limit on generated tokens (its ``</s>`` included), if known: a hypothesis of
            ``max_len`` tokens or more never produced ``</s>``.

    >>> classify_error("le chien noir dort", "le chien noir")
    'early end'
    >>> classify_error("quatre vingt onze petits chats dorment", "quatre vingt un petit")
    'early end'
    >>> classify_error("la voiture noire dort", "la voiture noir dort")
    'agreement'
    """
    ref, hyp = _tokens(reference, "reference"), _tokens(hypothesis, "hypothesis")
    if max_len is not None and max_len < 1:
        raise ValueError(f"max_len must be a positive integer or None; got {max_len}")
    if ref == hyp:
        return None
    lemmas, numbers = _lemmas(), french_number_words()
    same_start = all(_same_slot(r, h, lemmas, numbers) for r, h in zip(ref, hyp, strict=False))
    if len(hyp) < len(ref) and same_start:
        return "early end"
    if (len(hyp) > len(ref) and same_start) or (max_len is not None and len(hyp) >= max_len):
        return "no end"
    if number_spans(ref) != number_spans(hyp):
        return "number"
    if sorted(ref) == sorted(hyp):
        return "word order"
    if len(ref) == len(hyp) and all(
        r == h or (r in lemmas and lemmas.get(h) == lemmas[r]) for r, h in zip(ref, hyp, strict=True)
    ):
        return "agreement"
    return "other"


def error_table(
    references: Sequence[str], hypotheses: Sequence[str], max_len: int | None = None
) -> dict[str, list[int]]:
    """``{kind: [indices of the sentences with that error]}`` for every kind of :data:`KINDS` (correct ones left out).

    ``references`` and ``hypotheses`` are parallel lists of sentences; ``max_len`` as in :func:`classify_error`.
    """
    if isinstance(references, str) or isinstance(hypotheses, str) or len(references) != len(hypotheses):
        raise ValueError(
            "references and hypotheses must be lists of sentences of the same length; got "
            f"{type(references).__name__} of {len(references)} and {type(hypotheses).__name__} of {len(hypotheses)}"
        )
    table: dict[str, list[int]] = {kind: [] for kind in KINDS}
    for index, (reference, hypothesis) in enumerate(zip(references, hypotheses, strict=True)):
        kind = classify_error(reference, hypothesis, max_len)
        if kind is not None:
            table[kind].append(index)
    return table


def error_counts(references: Sequence[str], hypotheses: Sequence[str], max_len: int | None = None) -> Counter:
    """How many sentences have each kind of error (a ``Counter`` over :data:`KINDS`; correct ones not counted)."""
    return Counter({kind: len(rows) for kind, rows in error_table(references, hypotheses, max_len).items()})
