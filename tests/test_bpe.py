"""The byte-level BPE of companion.bpe: exact round trips, and the same merges and ids as Hugging Face tokenizers."""

import json
import random

import numpy as np
import pytest

from companion.bpe import BPE, byte_to_char, merge_pair, split_words
from companion.corpus import course_documents, lm_windows, split_documents, unigram_perplexity
from companion.text import BPE as BPEFromText

tokenizers = pytest.importorskip("tokenizers")


def hf_bpe(texts, vocab_size):
    """Hugging Face's byte-level BPE with the settings companion.bpe follows."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def hf_merges(tokenizer):
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]


@pytest.fixture(scope="module")
def corpus():
    return split_documents(course_documents())


@pytest.mark.parametrize("vocab_size", [300, 1000, 2000])
def test_same_merges_vocabulary_and_ids_as_hugging_face_on_the_course(corpus, vocab_size):
    train, valid = corpus
    ours, theirs = BPE.train(train, vocab_size), hf_bpe(train, vocab_size)
    assert len(ours) == theirs.get_vocab_size() == vocab_size
    assert ours.merges == hf_merges(theirs)
    assert ours.vocab == theirs.get_vocab()
    held_out = "".join(valid)
    assert ours.encode(held_out) == theirs.encode(held_out).ids
    assert ours.decode(ours.encode(held_out)) == theirs.decode(theirs.encode(held_out).ids) == held_out


@pytest.mark.parametrize("seed", range(40))
def test_same_merges_as_hugging_face_on_random_corpora(seed):
    """Small alphabets force ties, runs of one letter (overlapping pairs) and merges that rebuild a token."""
    generator = random.Random(seed)
    alphabet = ["ab", "abc ", "aab  ", "你好世界 ab", "xyz\n\t 12"][seed % 5]
    texts = ["".join(generator.choice(alphabet) for _ in range(generator.randint(1, 60))) for _ in range(20)]
    vocab_size = generator.randint(260, 400)
    ours, theirs = BPE.train(texts, vocab_size), hf_bpe(texts, vocab_size)
    assert ours.merges == hf_merges(theirs)
    assert ours.vocab == theirs.get_vocab()
    for text in texts:
        assert ours.encode(text) == theirs.encode(text).ids


ROUND_TRIP = [
    "",
    "The Transformer reads a sentence.",
    "注意力就是你所需要的一切。编码器和解码器",
    "mixed 中文 and English, émigré, Ωμέγα, 🙂🚀, tabs\t\tand  double  spaces\n\n\r\n",
    "\x00\x01 control characters \x7f and a lone surrogate-free \uffff",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip_on_any_unicode(corpus, text):
    bpe = BPE.train(corpus[0], 600)
    assert bpe.decode(bpe.encode(text)) == text


def test_round_trip_on_random_code_points(corpus):
    bpe = BPE.train(corpus[0], 400)
    generator = np.random.default_rng(0)
    for _ in range(50):
        points = generator.integers(1, 0x2FFFF, size=int(generator.integers(1, 40)))
        text = "".join(chr(p) for p in points if not 0xD800 <= p < 0xE000)  # surrogates are not text
        assert bpe.decode(bpe.encode(text)) == text


def test_merges_shorten_text_and_tokens_read_as_text(corpus):
    bpe = BPE.train(corpus[0], 1000)
    sentence = "The attention weights of the decoder"
    assert len(bpe.encode(sentence)) < len(sentence.encode("utf-8"))
    assert "".join(bpe.tokens(sentence)).replace(byte_to_char(32), " ") == sentence
    assert BPE(bpe.merges).encode(sentence) == bpe.encode(sentence)  # the merges alone rebuild the tokenizer


def test_building_blocks():
    assert merge_pair([1, 1, 1, 2, 1, 1], (1, 1), 9) == [9, 1, 2, 9]
    assert merge_pair([1, 2], (2, 1), 9) == [1, 2]
    assert split_words("I saw it.  Twice!") == ["I", " saw", " it", ".", " ", " Twice", "!"]
    assert byte_to_char(32) == "Ġ" and byte_to_char(ord("a")) == "a"
    assert BPEFromText is BPE


def test_bad_input():
    with pytest.raises(ValueError, match="vocab_size must be at least 256"):
        BPE.train(["abc"], 100)
    bpe = BPE.train(["abc abc"], 258)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 258\)"):
        bpe.decode([258])
    with pytest.raises(ValueError, match="text must be a str"):
        bpe.encode(["abc"])
    with pytest.raises(ValueError, match="not in the vocabulary"):
        BPE([("ab", "c")])


def test_stops_when_nothing_is_left_to_merge():
    bpe = BPE.train(["ab"], 1000)
    assert len(bpe) == 257 and bpe.merges == [("a", "b")]


def test_corpus_helpers():
    documents = course_documents(exclude=("08_",))
    assert "notebooks/01_text_as_numbers.md" in documents and not any("08_" in name for name in documents)
    assert not documents["notebooks/01_text_as_numbers.md"].startswith("---")
    train, valid = split_documents(documents, valid_fraction=0.1)
    assert [t + v for t, v in zip(train, valid, strict=True)] == list(documents.values())
    assert 0.05 < sum(map(len, valid)) / sum(map(len, documents.values())) < 0.15
    inputs, targets = lm_windows(np.arange(11), context=4)
    assert inputs.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and targets.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    with pytest.raises(ValueError, match="context"):
        lm_windows(np.arange(3), context=4)
    # A uniform unigram model over 4 tokens has perplexity 4 (here after add-one smoothing of equal counts).
    assert unigram_perplexity([0, 1, 2, 3], [3, 2, 1, 0], vocab_size=4) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="valid_fraction"):
        split_documents(documents, valid_fraction=1.5)


def test_train_in_place_or_new():
    texts = ["low lower lowest", "new newer newest"] * 3
    new = BPE.train(texts, 270)
    in_place = BPE()
    assert in_place.train(texts, 270) is in_place          # trains the tokenizer it is called on
    assert in_place.merges == new.merges and len(in_place) == len(new) == 270
    assert in_place.encode("lowest newer") == new.encode("lowest newer")
    with pytest.raises(ValueError, match="already has 14 merges"):
        in_place.train(texts, 280)                          # no silent retraining on top of old merges
