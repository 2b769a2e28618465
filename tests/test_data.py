"""The toy corpus, the sentence-pair loader and the batching helpers (companion.data)."""

import random
from pathlib import Path

import numpy as np
import pytest

from companion import data
from companion.text import BOS, EOS, PAD, UNK

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample_pairs.tsv"


# ---------------------------------------------------------------------------------------------------------------
# The toy grammar
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, english, french",
    [
        (("the", "dog"), "the dog", "le chien"),
        (("the", "car"), "the car", "la voiture"),
        (("the", "car", True), "the cars", "les voitures"),
        (("the", "dog", False, "big", "black"), "the big black dog", "le grand chien noir"),
        (("the", "car", True, None, "white"), "the white cars", "les voitures blanches"),
        (("a", "car", True, "big", "white"), "some big white cars", "de grandes voitures blanches"),
        (("a", "car", True, None, "white"), "some white cars", "des voitures blanches"),
        (("a", "dog", False, "old"), "an old dog", "un vieux chien"),
        (("a", "house", False, "old"), "an old house", "une vieille maison"),
        (("this", "mouse", True, "small", "sad"), "these small sad mice", "ces petites souris tristes"),
        (("my", "horse", True), "my horses", "mes chevaux"),
        (("my", "flower"), "my flower", "ma fleur"),
    ],
)
def test_noun_phrase_rules(args, english, french):
    phrase = data.noun_phrase(*args)
    assert " ".join(phrase.english) == english
    assert " ".join(phrase.french) == french


def test_noun_phrase_rejects_unknown_words():
    with pytest.raises(ValueError, match="noun must be one of"):
        data.noun_phrase("the", "unicorn")
    with pytest.raises(ValueError, match="after must be one of"):
        data.noun_phrase("the", "dog", after="big")  # "big" stays before the noun


def test_sentences_follow_the_agreement_and_negation_rules():
    rng = random.Random(5)
    singular_verbs = {v[2] for v in data.INTRANSITIVE_VERBS + data.TRANSITIVE_VERBS} | {"est", "n'est"}
    plural_verbs = {v[3] for v in data.INTRANSITIVE_VERBS + data.TRANSITIVE_VERBS} | {"sont"}
    for _ in range(300):
        english, french = (s.split() for s in data.toy_sentence_pair(rng))
        negative = "not" in english
        assert negative == ("pas" in french)
        if negative and "n'est" not in french:
            # ne VERB pas: the verb sits between the two parts of the negation
            assert french[french.index("ne") + 2] == "pas"
        verb = next(w for w in french if w in singular_verbs | plural_verbs)
        plural_subject = french[0] in ("les", "des", "de", "mes", "ces")
        assert (verb in plural_verbs) == plural_subject, (english, french)


def test_corpus_is_deterministic_and_splits_do_not_overlap():
    splits = data.toy_corpus(num_train=800, num_validation=100, num_test=100, seed=3)
    again = data.toy_corpus(num_train=800, num_validation=100, num_test=100, seed=3)
    other = data.toy_corpus(num_train=800, num_validation=100, num_test=100, seed=4)
    assert splits == again
    assert splits.train != other.train
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (800, 100, 100)
    sources = [{s for s, _ in part} for part in (splits.train, splits.validation, splits.test)]
    assert not (sources[0] & sources[1] or sources[0] & sources[2] or sources[1] & sources[2])
    assert sum(map(len, sources)) == 1000  # no duplicate inside a split either
    assert "Splits(train=800" in repr(splits)


def test_toy_pairs_need_reordering():
    """Some pairs cannot be translated word by word in order: an adjective moves after its noun."""
    pairs = data.toy_translation_pairs(200, seed=0)
    moved = [p for p in pairs if "black dog" in p[0] or "white cars" in p[0]]
    assert any("chien noir" in f or "voitures blanches" in f for _, f in moved)


def test_split_pairs_keeps_repeated_sources_together():
    pairs = [("a", "x"), ("a", "y"), ("b", "z"), ("c", "w"), ("d", "v")]
    splits = data.split_pairs(pairs, num_validation=1, num_test=1, seed=0)
    holding_a = [part for part in (splits.train, splits.validation, splits.test) if ("a", "x") in part]
    assert len(holding_a) == 1 and ("a", "y") in holding_a[0]
    assert sorted(splits.train + splits.validation + splits.test) == sorted(pairs)
    with pytest.raises(ValueError, match="leaves no training pair"):
        data.split_pairs(pairs, num_validation=2, num_test=2)
    with pytest.raises(ValueError, match="num_pairs"):
        data.toy_translation_pairs(0)


# ---------------------------------------------------------------------------------------------------------------
# The tab-separated loader
# ---------------------------------------------------------------------------------------------------------------


def test_sample_file_loads():
    pairs = data.load_sentence_pairs(SAMPLE)
    assert len(pairs) == 30
    assert pairs[0] == ("Hello!", "Bonjour !")  # narrow no-break space before "!" became a plain space
    assert ("She reads a book.", "Elle lit un livre.") in pairs  # a line without the attribution column
    assert all("\t" not in s and "\t" not in t for s, t in pairs)
    assert data.load_sentence_pairs(SAMPLE, max_pairs=5) == pairs[:5]
    short = data.load_sentence_pairs(SAMPLE, max_tokens=3)
    assert short and all(len(s.split()) <= 3 for s, _ in short) and len(short) < len(pairs)
    assert data.load_sentence_pairs(SAMPLE, lowercase=True)[2] == ("good night.", "bonne nuit.")


def test_loader_names_the_bad_line(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("Hi.\tSalut.\tsomeone\nno tab on this line\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: expected 'source<TAB>target"):
        data.load_sentence_pairs(path)
    path.write_text("Hi.\t\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1"):
        data.load_sentence_pairs(path)


def test_normalize_sentence():
    assert data.normalize_sentence("  Où\u00a0est  la gare\u202f? ") == "Où est la gare ?"
    assert data.normalize_sentence("Cafe\u0301", lowercase=True) == "café"  # NFC: one code point for é


# ---------------------------------------------------------------------------------------------------------------
# Vocabularies, padded arrays and batches
# ---------------------------------------------------------------------------------------------------------------


def test_vocabularies_and_encoding():
    pairs = data.load_sentence_pairs(SAMPLE)
    src_vocab, tgt_vocab = data.build_vocabularies(pairs)
    assert src_vocab.tokens[:4] == [PAD, UNK, BOS, EOS]
    src, tgt = data.encode_pairs(pairs, src_vocab, tgt_vocab)
    assert src.dtype == np.int64 and src.shape[0] == tgt.shape[0] == 30
    assert (src[:, 0] == src_vocab.bos_id).all() and (tgt[:, 0] == tgt_vocab.bos_id).all()
    lengths = (tgt != 0).sum(axis=1)
    assert (tgt[np.arange(30), lengths - 1] == tgt_vocab.eos_id).all()  # </s> right before the padding
    assert lengths.max() == tgt.shape[1]
    assert data.decode_ids(tgt[:2], tgt_vocab) == ["Bonjour !", "Merci ."]
    with pytest.raises(ValueError, match="too short"):
        data.encode_sentences(["a b c"], src_vocab, length=4)
    assert data.encode_sentences(["Hello !"], src_vocab, length=6).shape == (1, 6)


def test_min_count_sends_rare_words_to_unk():
    pairs = [("a a b", "x"), ("a c", "x y")]
    src_vocab, tgt_vocab = data.build_vocabularies(pairs, min_count=2)
    assert "a" in src_vocab and "b" not in src_vocab
    assert src_vocab.encode("b") == [src_vocab.unk_id]
    assert "y" not in tgt_vocab
    with pytest.raises(ValueError, match="at least one"):
        data.build_vocabularies([])


def test_iterate_batches():
    src = np.arange(20).reshape(10, 2) + 1
    tgt = np.arange(30).reshape(10, 3) + 1
    batches = list(data.iterate_batches(src, tgt, 4, seed=1))
    assert [len(b[0]) for b in batches] == [4, 4, 2]
    rows = np.concatenate([b[0] for b in batches])
    assert sorted(rows[:, 0].tolist()) == sorted(src[:, 0].tolist())  # every row exactly once
    assert not np.array_equal(rows, src)  # shuffled
    again = list(data.iterate_batches(src, tgt, 4, seed=1))
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(batches, again, strict=True))
    for s, t in batches:  # pairs stay together
        np.testing.assert_array_equal((s[:, 0] - 1) // 2 * 3 + 1, t[:, 0])
    assert [len(b[0]) for b in data.iterate_batches(src, tgt, 4, drop_last=True)] == [4, 4]
    ordered = next(data.iterate_batches(src, tgt, 3, shuffle=False))
    np.testing.assert_array_equal(ordered[0], src[:3])
    with pytest.raises(ValueError, match="same num_pairs"):
        next(data.iterate_batches(src, tgt[:5], 4))
    with pytest.raises(ValueError, match="batch_size"):
        next(data.iterate_batches(src, tgt, 0))


def test_trimmed_batches_drop_only_padding_columns():
    src = np.array([[2, 5, 3, 0, 0], [2, 6, 7, 3, 0]])
    tgt = np.array([[2, 9, 3, 0, 0, 0], [2, 3, 0, 0, 0, 0]])
    s, t = next(data.iterate_batches(src, tgt, 2, shuffle=False, trim=True))
    np.testing.assert_array_equal(s, src[:, :4])
    np.testing.assert_array_equal(t, tgt[:, :3])


# ---------------------------------------------------------------------------------------------------------------
# Numbers and the held-out test sets
# ---------------------------------------------------------------------------------------------------------------


def test_number_words_in_both_languages():
    assert data.number_words(78) == ["seventy", "eight"]
    assert data.number_words(78, "fr") == ["soixante", "dix", "huit"]
    assert data.number_words(71, "fr") == ["soixante", "et", "onze"]
    assert data.number_words(91, "fr") == ["quatre", "vingt", "onze"]
    assert data.number_words(21, "fr") == ["vingt", "et", "un"]
    assert data.number_words(21, "fr", gender="f") == ["vingt", "et", "une"]
    assert data.number_words(81, "fr", gender="f") == ["quatre", "vingt", "une"]
    assert data.number_words(11, "fr", gender="f") == ["onze"]
    with pytest.raises(ValueError, match="language"):
        data.number_words(3, "de")


def test_noun_phrase_with_a_number():
    phrase = data.noun_phrase(21, "house", plural=True, after="white")
    assert " ".join(phrase.english) == "twenty one white houses"
    assert " ".join(phrase.french) == "vingt et une maisons blanches"
    phrase = data.noun_phrase(80, "dog", plural=True, before="big", after="black")
    assert " ".join(phrase.french) == "quatre vingts grands chiens noirs"
    with pytest.raises(ValueError, match="plural=True"):
        data.noun_phrase(21, "house")
    with pytest.raises(ValueError, match="number determiner"):
        data.noun_phrase(100, "house", plural=True)


def test_corpus_without_numbers_is_unchanged_by_the_number_option():
    words = {w for n in data.NUMBERS for w in data.number_words(n)}
    pairs = data.toy_translation_pairs(300, seed=3)
    assert pairs == data.toy_translation_pairs(300, seed=3, numbers=())
    assert not any(words & set(source.split()) for source, _ in pairs)
    with_numbers = data.toy_translation_pairs(300, seed=3, numbers=data.NUMBERS)
    assert any(words & set(source.split()) for source, _ in with_numbers)


@pytest.fixture(scope="module")
def held_out():
    return data.held_out_corpus(num_train=1500, num_validation=100, num_test=200, num_longer=100, num_numbers=100)


def _has_number(sentence: str, numbers) -> bool:
    return any(f" {' '.join(data.number_words(n))} " in f" {sentence} " for n in numbers)


def test_held_out_corpus_parts(held_out):
    s = held_out
    assert (len(s.train), len(s.validation), len(s.test), len(s.longer), len(s.numbers)) == (1500, 100, 200, 100, 100)
    assert repr(s).startswith("HeldOutSplits(train=1500")
    parts = [s.train, s.validation, s.test, s.longer, s.numbers]
    sources = [{source for source, _ in part} for part in parts]
    assert sum(map(len, sources)) == len(set().union(*sources))  # no source in two parts
    in_distribution = s.train + s.validation + s.test
    assert max(len(source.split()) for source, _ in in_distribution) <= s.max_train_tokens
    assert min(len(source.split()) for source, _ in s.longer) > s.max_train_tokens
    assert max(len(source.split()) for source, _ in s.numbers) <= s.max_train_tokens
    assert not any(_has_number(source, s.held_out_numbers) for source, _ in in_distribution + s.longer)
    assert all(_has_number(source, s.held_out_numbers) for source, _ in s.numbers)
    # Every word of the held-out sets occurs in training: what is new is the combination or the length.
    src_vocab, tgt_vocab = data.build_vocabularies(s.train)
    for source, target in s.longer + s.numbers:
        assert src_vocab.unk_id not in src_vocab.encode(source) and tgt_vocab.unk_id not in tgt_vocab.encode(target)
    assert data.held_out_corpus(num_train=1500, num_validation=100, num_test=200, num_longer=100,
                                num_numbers=100).numbers == s.numbers  # deterministic


def test_held_out_corpus_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_longer"):
        data.held_out_corpus(num_longer=0)
    with pytest.raises(ValueError, match="held_out_numbers"):
        data.held_out_corpus(held_out_numbers=(100,))


def test_joint_vocabulary_covers_both_sides(held_out):
    vocab = data.build_joint_vocabulary(held_out.train)
    src_vocab, tgt_vocab = data.build_vocabularies(held_out.train)
    assert set(vocab.tokens) == set(src_vocab.tokens) | set(tgt_vocab.tokens)
    assert len(vocab) < len(src_vocab) + len(tgt_vocab) - 4  # "table", "tables", "souris" ... are spelled alike
    assert "table" in src_vocab.tokens and "table" in tgt_vocab.tokens  # one word, one id, one vector
    assert vocab.tokens.count("table") == 1 and vocab.encode("table")[0] != vocab.unk_id
    with pytest.raises(ValueError, match="pairs"):
        data.build_joint_vocabulary([])
