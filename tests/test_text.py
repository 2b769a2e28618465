"""Unit tests for companion.text (framework-free) and the chapter-1 layers."""

import numpy as np
import pytest

from companion import text


@pytest.fixture
def word_box():
    return text.Vocabulary.from_sentences(text.WORD_BOX_SENTENCES, specials=())


def test_word_box_ids_follow_first_appearance(word_box):
    assert word_box.tokens == ["<pad>", "I", "went", "to", "the", "beach", "It", "was", "cold", "came", "back", "house"]
    assert [word_box.encode(s) for s in text.WORD_BOX_SENTENCES] == [[1, 2, 3, 4, 5], [6, 7, 8], [1, 9, 10, 3, 4, 11]]


def test_word_box_batch_padded_and_truncated(word_box):
    batch = text.pad_batch([word_box.encode(s) for s in text.WORD_BOX_SENTENCES], length=5)
    assert batch.dtype == np.int64
    assert batch.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 0, 0], [1, 9, 10, 3, 4]]


def test_one_hot_depth_counts_pad(word_box):
    assert len(word_box) == 12
    vectors = text.one_hot([[11, 0]], len(word_box))
    assert vectors.shape == (1, 2, 12)
    assert vectors[0, 0, 11] == 1 and vectors[0, 0].sum() == 1
    assert vectors[0, 1, 0] == 1


def test_one_hot_rejects_out_of_range_and_floats():
    with pytest.raises(ValueError, match="depth=11"):
        text.one_hot([11], 11)
    with pytest.raises(ValueError, match="integers"):
        text.one_hot([1.0], 3)


def test_pad_batch_defaults_to_longest_and_empty_batch():
    assert text.pad_batch([[1], [2, 3, 4]]).tolist() == [[1, 0, 0], [2, 3, 4]]
    assert text.pad_batch([], length=3).shape == (0, 3)
    assert text.pad_or_truncate([1, 2], 4, pad_id=9) == [1, 2, 9, 9]
    with pytest.raises(ValueError, match="length"):
        text.pad_or_truncate([1], -1)


def test_specials_unknown_words_and_round_trip():
    vocab = text.Vocabulary.from_sentences(["the cat sat"])
    assert (vocab.pad_id, vocab.unk_id, vocab.bos_id, vocab.eos_id) == (0, 1, 2, 3)
    ids = vocab.encode("the dog sat", add_bos=True, add_eos=True)
    assert ids == [2, 4, 1, 6, 3]
    assert vocab.decode(ids) == ["the", "sat"]
    assert vocab.decode(ids + [5], strip_special=True) == ["the", "sat"]  # stops at the end token
    assert vocab.decode(ids, strip_special=False) == ["<s>", "the", "<unk>", "sat", "</s>"]


def test_vocabulary_errors_are_clear(word_box):
    with pytest.raises(KeyError, match="<unk>"):
        word_box.encode("a moon")
    with pytest.raises(KeyError, match="<s>"):
        _ = word_box.bos_id
    with pytest.raises(ValueError, match="token_id"):
        word_box.id_to_token(12)
    with pytest.raises(ValueError, match="specials"):
        text.Vocabulary(specials=("<mask>",))


def test_tokenize_splits_punctuation():
    assert text.tokenize("It was cold.") == ["It", "was", "cold", "."]
    assert text.tokenize("Don't GO", lowercase=True) == ["don't", "go"]
