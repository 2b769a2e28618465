"""The two measurements of generated text that chapter 8 and benchmarks/bench_gpt.py share."""

import pytest

from companion.generation_stats import repeats_itself, unknown_word_share, words


def test_words_are_letter_runs_lower_cased():
    assert words("The decoder's 2 heads: x, QKV!") == ["the", "decoder", "heads", "qkv"]


def test_repeats_itself_finds_a_loop_and_only_a_loop():
    assert repeats_itself([5, 6, 7, 8, 1, 5, 6, 7, 8], 4)
    assert not repeats_itself([5, 6, 7, 8, 1, 5, 6, 7, 9], 4)
    assert repeats_itself([3, 3, 3, 3, 3], 4)            # overlapping runs count
    assert not repeats_itself([1, 2, 3], 4)               # shorter than one run
    with pytest.raises(ValueError, match="n must be"):
        repeats_itself([1, 2], 0)


def test_unknown_word_share_counts_every_occurrence():
    known = {"the", "model"}
    assert unknown_word_share(["the model", "the modle modle"], known) == pytest.approx(2 / 5)
    assert unknown_word_share(["the model"], known) == 0.0
    assert unknown_word_share(["42 !"], known) == 0.0      # no words at all
