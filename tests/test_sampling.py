"""Choosing the next token (companion.sampling): top-k keeps exactly the k best, top-p keeps the smallest nucleus
with mass >= p, temperature 0 and temperature -> 0 are greedy, draws follow the filtered distribution and are
reproducible with a seed."""

import numpy as np
import pytest

from companion import sampling

RNG = np.random.default_rng(0)
LOGITS = RNG.normal(scale=2.0, size=(64, 50))  # fixed logits: 64 rows, a vocabulary of 50


def test_top_k_mask_keeps_exactly_the_k_largest():
    for k in (1, 3, 10, 50, 80):
        keep = sampling.top_k_mask(LOGITS, k)
        assert (keep.sum(axis=-1) == min(k, 50)).all()
        if k < 50:
            kept_min = np.where(keep, LOGITS, np.inf).min(axis=-1)
            dropped_max = np.where(keep, -np.inf, LOGITS).max(axis=-1)
            assert (kept_min > dropped_max).all()


def test_top_k_sampling_never_leaves_the_k_best():
    k = 5
    best = np.argsort(-LOGITS, axis=-1)[:, :k]
    for seed in range(30):
        tokens = sampling.sample_next(LOGITS, temperature=1.5, top_k=k, rng=seed)
        assert all(token in row for token, row in zip(tokens, best, strict=True))


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.99, 1.0])
def test_top_p_keeps_the_smallest_set_with_mass_at_least_p(p):
    probs = sampling.softmax(LOGITS)
    keep = sampling.top_p_mask(LOGITS, p)
    mass = np.where(keep, probs, 0.0).sum(axis=-1)
    smallest_kept = np.where(keep, probs, np.inf).min(axis=-1)
    largest_dropped = np.where(keep, -np.inf, probs).max(axis=-1)
    assert (mass >= p - 1e-12).all()  # enough mass
    assert (mass - smallest_kept < p).all()  # one token fewer would not be enough: the set is the smallest
    assert (smallest_kept >= largest_dropped).all()  # and it is made of the most likely tokens
    for seed in range(10):
        tokens = sampling.sample_next(LOGITS, top_p=p, rng=seed)
        assert keep[np.arange(len(tokens)), tokens].all()


def test_top_p_on_a_hand_made_distribution():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    assert sampling.top_p_mask(logits, 0.5).tolist() == [[True, False, False, False]]
    assert sampling.top_p_mask(logits, 0.6).tolist() == [[True, True, False, False]]
    assert sampling.top_p_mask(logits, 0.9).tolist() == [[True, True, True, False]]
    assert sampling.top_p_mask(logits, 1.0).tolist() == [[True, True, True, True]]


def test_temperature_zero_and_temperature_to_zero_are_greedy():
    greedy = LOGITS.argmax(axis=-1)
    np.testing.assert_array_equal(sampling.sample_next(LOGITS, temperature=0.0), greedy)
    np.testing.assert_array_equal(sampling.sample_next(LOGITS, temperature=0.0, top_k=3, top_p=0.5), greedy)
    for seed in range(10):
        np.testing.assert_array_equal(sampling.sample_next(LOGITS, temperature=1e-3, rng=seed), greedy)
    # A high temperature does draw other tokens from the same logits.
    assert (sampling.sample_next(LOGITS, temperature=5.0, rng=0) != greedy).sum() > 20


def test_temperature_sharpens_and_flattens():
    def entropy(temperature):
        probs = sampling.softmax(sampling.filter_logits(LOGITS, temperature))
        return -(probs * np.log(probs)).sum(axis=-1).mean()

    assert entropy(0.5) < entropy(1.0) < entropy(2.0) < np.log(50)


def test_draws_follow_the_filtered_distribution():
    logits = np.tile(np.log([[0.1, 0.2, 0.3, 0.4, 1e-9]]), (40_000, 1))
    tokens = sampling.sample_next(logits, rng=1)
    frequencies = np.bincount(tokens, minlength=5) / len(tokens)
    np.testing.assert_allclose(frequencies, [0.1, 0.2, 0.3, 0.4, 0.0], atol=0.01)
    tokens = sampling.sample_next(logits, top_k=2, rng=2)  # 0.3 and 0.4, renormalised to 3/7 and 4/7
    np.testing.assert_allclose(np.bincount(tokens, minlength=5) / len(tokens), [0, 0, 3 / 7, 4 / 7, 0], atol=0.01)


def test_removed_tokens_are_never_drawn_even_at_the_edges():
    logits = np.array([[0.0, -np.inf, 0.0, -np.inf]] * 1000)
    tokens = sampling.sample_next(logits, rng=0)
    assert set(tokens.tolist()) == {0, 2}


def test_the_same_seed_gives_the_same_tokens():
    first = sampling.sample_next(LOGITS, rng=7)
    np.testing.assert_array_equal(sampling.sample_next(LOGITS, rng=7), first)
    np.testing.assert_array_equal(sampling.sample_next(LOGITS, rng=np.random.default_rng(7)), first)
    assert (sampling.sample_next(LOGITS, rng=8) != first).any()
    assert first.dtype == np.int64 and first.shape == (64,)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="temperature"):
        sampling.sample_next(LOGITS, temperature=-0.5)
    with pytest.raises(ValueError, match="top_k"):
        sampling.sample_next(LOGITS, top_k=0)
    with pytest.raises(ValueError, match="top_k"):
        sampling.sample_next(LOGITS, top_k=2.5)
    with pytest.raises(ValueError, match="top_p"):
        sampling.sample_next(LOGITS, top_p=0.0)
    with pytest.raises(ValueError, match=r"\(batch, vocab_size\)"):
        sampling.sample_next(LOGITS[0])
    with pytest.raises(ValueError, match="greedy"):
        sampling.filter_logits(LOGITS, temperature=0.0)
