"""companion.errors: each kind of translation error, the order the kinds are tested in, bad input."""

from __future__ import annotations

import random

import pytest

from companion import data, errors


@pytest.mark.parametrize(
    ("reference", "hypothesis", "kind"),
    [
        ("le chien dort", "le chien dort", None),
        ("le chien noir ne dort pas", "le chien noir", "early end"),
        ("le chien dort", "le chien dort dort", "no end"),
        ("vingt trois chats dorment", "vingt quatre chats dorment", "number"),
        ("quatre vingt onze chats dorment", "quatre vingt et un chats dorment", "number"),
        ("vingt et une maisons dorment", "vingt et un maisons dorment", "number"),
        ("le chien voit la fille", "la fille voit le chien", "word order"),
        ("la voiture noire dort", "la voiture noir dort", "agreement"),
        ("les chiens dorment", "les chiens dort", "agreement"),
        ("des voitures", "de voitures", "agreement"),
        ("le chien dort", "le chat dort", "other"),
        ("le chien ne dort pas", "le chien dort pas", "other"),
    ],
)
def test_classify_error(reference, hypothesis, kind):
    assert errors.classify_error(reference, hypothesis) == kind
    assert errors.classify_error(reference.split(), hypothesis.split()) == kind


def test_max_len_marks_a_runaway_output():
    assert errors.classify_error("le chien dort", "le chat court vite", max_len=4) == "no end"
    assert errors.classify_error("le chien dort", "le chat court vite") == "other"
    with pytest.raises(ValueError, match="max_len"):
        errors.classify_error("a", "b", max_len=0)


def test_number_spans_skip_lone_articles():
    assert errors.number_spans("un chien voit vingt et un chats".split()) == [("vingt", "et", "un")]
    assert errors.number_spans("une fille dort".split()) == []
    assert errors.number_spans("quatre vingt dix neuf souris".split()) == [("quatre", "vingt", "dix", "neuf")]


def test_every_word_of_the_grammar_has_a_lemma_or_is_a_number():
    pairs = data.toy_translation_pairs(500, seed=3, numbers=data.NUMBERS)
    known = set(errors._lemmas()) | errors.french_number_words() | {"ne", "pas"}
    assert {w for _, target in pairs for w in target.split()} <= known


def test_error_table_and_counts():
    rng = random.Random(0)
    references = [target for _, target in data.toy_translation_pairs(50, seed=1)]
    hypotheses = list(references)
    hypotheses[3] = " ".join(references[3].split()[:-1])
    rng.shuffle(words := references[7].split())
    hypotheses[7] = " ".join(words) if words != references[7].split() else references[7] + " x"
    table = errors.error_table(references, hypotheses)
    assert set(table) == set(errors.KINDS)
    assert table["early end"] == [3]
    assert sum(map(len, table.values())) == 2
    counts = errors.error_counts(references, hypotheses)
    assert sum(counts.values()) == 2 and counts["early end"] == 1


def test_bad_input():
    with pytest.raises(ValueError, match="references and hypotheses"):
        errors.error_table(["a b"], ["a b", "c"])
    with pytest.raises(ValueError, match="references and hypotheses"):
        errors.error_table("a b", "a b")
    with pytest.raises(ValueError, match="hypothesis"):
        errors.classify_error("a b", ["a", 3])
