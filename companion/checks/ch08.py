"""Checks for chapter 8, "A small GPT"."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import numpy as np

from companion.bpe import merge_pair
from companion.checks import CheckFailed, call, exercise, expect_close, expect_equal, rng, to_numpy
from companion.checks.tracks import expect_differentiable, expect_type
from companion.sampling import softmax, top_p_mask

CHAPTER = "08_gpt"

# ---------------------------------------------------------------------------------------------------------------
# Exercise 1: one BPE merge
# ---------------------------------------------------------------------------------------------------------------


def _merge_first_only(tokens, pair, new):
    for i in range(len(tokens) - 1):
        if (tokens[i], tokens[i + 1]) == tuple(pair):
            return [*tokens[:i], new, *tokens[i + 2 :]]
    return list(tokens)


def _merge_step_one(tokens, pair, new):  # after a merge, moves on by one token instead of two
    out, i = [], 0
    while i < len(tokens):
        if i + 1 < len(tokens) and (tokens[i], tokens[i + 1]) == tuple(pair):
            out.append(new)
        else:
            out.append(tokens[i])
        i += 1
    return out


def _merge_right_to_left(tokens, pair, new):
    return merge_pair(list(tokens)[::-1], tuple(pair)[::-1], new)[::-1]


def _merge_drop_last(tokens, pair, new):  # the loop stops one token early and forgets the last one
    out, i = [], 0
    while i < len(tokens) - 1:
        if (tokens[i], tokens[i + 1]) == tuple(pair):
            out.append(new)
            i += 2
        else:
            out.append(tokens[i])
            i += 1
    return out


def _merge_cases():
    yield [5, 5, 5], (5, 5), 9  # overlapping occurrences
    yield [1, 2, 3, 1, 2], (1, 2), 7
    yield [1, 2, 1, 1, 1, 1, 2], (1, 1), 8
    yield [4], (4, 4), 6
    yield [], (1, 2), 3
    yield [3, 1, 2], (2, 3), 5  # not present
    generator = rng(80)
    for _ in range(20):
        tokens = generator.integers(0, 3, size=int(generator.integers(2, 15))).tolist()
        pair = tuple(int(t) for t in generator.integers(0, 3, size=2))
        yield tokens, pair, 10


@exercise(CHAPTER, "bpe_merge", "replace every occurrence of a pair of tokens, left to right, without overlaps")
def check_bpe_merge(bpe_merge) -> None:
    for tokens, pair, new in _merge_cases():
        answer = call(bpe_merge, list(tokens), tuple(pair), new)
        expect_equal(
            answer,
            merge_pair(tokens, pair, new),
            f"bpe_merge({tokens}, {pair}, {new})",
            mistakes={
                "only the first occurrence was merged; replace every occurrence": _merge_first_only(tokens, pair, new),
                "after a merge, skip both tokens of the pair (move on by two, not one)": _merge_step_one(
                    tokens, pair, new
                ),
                "the scan went from right to left; with overlapping occurrences such as (a, a) in [a, a, a] the "
                "leftmost pair is merged first: [new, a]": _merge_right_to_left(tokens, pair, new),
                "the last token went missing: when the scan stops, keep the token that had no partner": (
                    _merge_drop_last(tokens, pair, new)
                ),
            },
        )


# ---------------------------------------------------------------------------------------------------------------
# Exercise 2: the most frequent pair
# ---------------------------------------------------------------------------------------------------------------


def _pair_counts(word_counts, weighted=True, once_per_word=False) -> Counter:
    counts: Counter = Counter()
    for word, frequency in word_counts.items():
        pairs = set(pairwise(word)) if once_per_word else list(pairwise(word))
        for pair in pairs:
            counts[pair] += frequency if weighted else 1
    return counts


def _best(counts: Counter, largest_on_tie=False):
    if not counts:
        return None
    top = max(counts.values())
    tied = [p for p, c in counts.items() if c == top]
    return list(max(tied) if largest_on_tie else min(tied))


def _best_pair_cases():
    yield {(1, 2): 1, (3, 4): 5, (1, 2, 9): 1}  # the word counts matter
    yield {(7, 7, 7, 7): 1, (5, 6): 2}  # a pair counts every time it occurs in a word, overlaps included
    yield {(2, 3): 2, (1, 5): 2}  # a tie: the smallest pair wins
    yield {(4, 1, 4, 1): 3, (0, 9): 3, (1, 4): 3}
    generator = rng(81)
    for _ in range(15):
        words = {}
        for _ in range(int(generator.integers(1, 8))):
            word = tuple(int(t) for t in generator.integers(0, 4, size=int(generator.integers(2, 7))))
            words[word] = int(generator.integers(1, 6))
        yield words


@exercise(CHAPTER, "best_pair", "the most frequent adjacent pair, word counts included, ties to the smallest pair")
def check_best_pair(best_pair) -> None:
    for word_counts in _best_pair_cases():
        answer = call(best_pair, dict(word_counts))
        expect_equal(
            answer,
            _best(_pair_counts(word_counts)),
            f"best_pair({word_counts})",
            mistakes={
                "every word was counted once; a word that occurs n times in the corpus adds n to each of its pairs": (
                    _best(_pair_counts(word_counts, weighted=False))
                ),
                "a pair was counted once per word; count every position where it occurs ((7, 7) occurs 3 times in "
                "(7, 7, 7, 7))": _best(_pair_counts(word_counts, once_per_word=True)),
                "on a tie, return the smallest pair (compare the tuples), as tokenizers does": _best(
                    _pair_counts(word_counts), largest_on_tie=True
                ),
            },
        )


# ---------------------------------------------------------------------------------------------------------------
# Exercise 3: temperature
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "temperature_softmax", "next-token probabilities softmax(logits / T) of (batch, vocab) logits")
def check_temperature_softmax(temperature_softmax) -> None:
    generator = rng(82)
    cases = [(generator.standard_normal((2, 6)) * 3, t) for t in (1.0, 0.5, 2.0)]
    cases.append((generator.standard_normal((3, 10)) * 4, 0.7))
    cases.append((np.array([[1000.0, 999.0, 990.0], [-500.0, -501.0, -480.0]]), 0.5))  # large logits
    for logits, t in cases:
        answer = to_numpy(call(temperature_softmax, logits.copy(), t))
        what = f"temperature_softmax(logits of shape {logits.shape}, temperature={t})"
        if answer.shape == logits.shape and answer.dtype.kind == "f" and not np.isfinite(answer).all():
            raise CheckFailed(
                f"{what} contains NaN or infinity: exp overflows for logits like 1000; subtract each row's maximum "
                "before exp (it does not change the softmax)"
            )
        expect_close(
            answer,
            softmax(logits / t),
            what,
            mistakes={
                "the logits were multiplied by the temperature; divide them by it": softmax(logits * t),
                "the softmax ran over the wrong axis: normalise each row (axis -1), one distribution per sequence": (
                    np.exp(logits / t - (logits / t).max(0)) / np.exp(logits / t - (logits / t).max(0)).sum(0)
                ),
                "the temperature was applied after the softmax without normalising again": softmax(logits) ** (1 / t),
                "the probabilities were divided by the temperature; divide the logits before the softmax": (
                    softmax(logits) / t
                ),
            },
        )


# ---------------------------------------------------------------------------------------------------------------
# Exercise 4: top-p (nucleus)
# ---------------------------------------------------------------------------------------------------------------


def _renormalise(probs, keep):
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


def _nucleus_mistakes(probs, p):
    order = np.argsort(-probs, axis=-1)
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    strict = np.zeros_like(probs, dtype=bool)
    np.put_along_axis(strict, order, np.cumsum(sorted_probs, axis=-1) < p, axis=-1)
    strict[np.arange(len(probs)), order[:, 0]] = True  # keeps at least the favourite, to stay a distribution
    unsorted = (np.cumsum(probs, axis=-1) - probs) < p
    right = top_p_mask(np.log(probs), p)
    return {
        "the nucleus is the smallest set whose mass reaches p: keep the token that crosses p too": _renormalise(
            probs, strict
        ),
        "the kept probabilities must be renormalised to sum to 1": np.where(right, probs, 0.0),
        "sort the probabilities in decreasing order before the running sum; the nucleus is the most likely "
        "tokens": _renormalise(probs, unsorted),
        "p is a bound on the total mass of the kept tokens, not on each token's probability": _renormalise(
            probs, (probs >= p) | (probs == probs.max(-1, keepdims=True))
        ),
    }


@exercise(CHAPTER, "nucleus_probs", "top-p: keep the most likely tokens until their mass reaches p, renormalise")
def check_nucleus_probs(nucleus_probs) -> None:
    generator = rng(83)
    cases = [(np.array([[0.5, 0.3, 0.15, 0.05]]), 0.9), (np.array([[0.1, 0.6, 0.3]]), 0.5)]
    for vocab, p in [(6, 0.9), (10, 0.5), (20, 0.8), (8, 0.95), (5, 0.3)]:
        logits = generator.standard_normal((3, vocab)) * 2
        cases.append((softmax(logits), p))
    for probs, p in cases:
        answer = call(nucleus_probs, probs.copy(), p)
        expect_close(
            answer,
            _renormalise(probs, top_p_mask(np.log(probs), p)),
            f"nucleus_probs({np.round(probs, 3).tolist()}, p={p})",
            mistakes=_nucleus_mistakes(probs, p),
            atol=1e-6,
        )


# ---------------------------------------------------------------------------------------------------------------
# Exercise 5: attention over a key/value cache (PyTorch and Keras)
# ---------------------------------------------------------------------------------------------------------------


def _attend(q, k, v, scale):
    scores = q @ np.swapaxes(k, -1, -2) / scale  # (batch, heads, 1, keys)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


def _cache_cases():
    generator = rng(84)
    for batch, heads, past, d_head in [(1, 1, 3, 4), (2, 4, 5, 8), (3, 2, 1, 16), (1, 2, 9, 8)]:
        q, k_new, v_new = (generator.standard_normal((batch, heads, 1, d_head)).astype(np.float32) for _ in range(3))
        k_cache, v_cache = (generator.standard_normal((batch, heads, past, d_head)).astype(np.float32)
                            for _ in range(2))
        yield q, k_new, v_new, k_cache, v_cache


def _check_cached_attention(cached_attention, to_framework, name: str, track: str) -> None:
    for q, k_new, v_new, k_cache, v_cache in _cache_cases():
        d_head = q.shape[-1]
        k_all, v_all = np.concatenate([k_cache, k_new], axis=2), np.concatenate([v_cache, v_new], axis=2)
        what = f"{name}(q of shape {q.shape}, cache of shape {k_cache.shape})"
        result = call(cached_attention, *to_framework(q, k_new, v_new, k_cache, v_cache))
        if not isinstance(result, tuple | list) or len(result) != 3:
            raise CheckFailed(f"{what} should return three things: (out, k_cache, v_cache)")
        out, k_grown, v_grown = (to_numpy(r) for r in result)
        front = np.concatenate([k_new, k_cache], axis=2)
        expect_close(
            k_grown, k_all, f"the k_cache returned by {what}",
            mistakes={
                "the new key went in front of the cache; append it at the end (position order)": front,
                "the cache was not grown: return the old keys with the new one appended along the length axis "
                "(axis 2)": k_cache,
            },
        )
        expect_close(v_grown, v_all, f"the v_cache returned by {what}",
                     mistakes={"the new value went in front of the cache; append it at the end": np.concatenate(
                         [v_new, v_cache], axis=2)})
        expect_close(
            out,
            _attend(q, k_all, v_all, np.sqrt(d_head)),
            f"the output of {what}",
            mistakes={
                "the new token attended only to the cache; it must also see itself (attend over the grown cache)": (
                    _attend(q, k_cache, v_cache, np.sqrt(d_head))
                ),
                "the scores were divided by d_head; divide by sqrt(d_head)": _attend(q, k_all, v_all, d_head),
                "the scores were not scaled: divide q k^T by sqrt(d_head)": _attend(q, k_all, v_all, 1.0),
                "the output is the new value itself: the new token must attend over every cached position": v_new,
            },
            atol=1e-4,
        )
        for position, part in enumerate(("output", "k_cache", "v_cache")):
            expect_type(result[position], track, f"the {part} returned by {what}", "float")
        # Training a model with a cache (or fine-tuning through it) back-propagates through q and the new k, v.
        expect_differentiable(cached_attention, to_framework(q, k_new, v_new, k_cache, v_cache), what, (0, 1, 2, 3, 4),
                              0, track=track)


@exercise(CHAPTER, "cached_attention_torch", "one generation step of attention with a key/value cache, in PyTorch",
          track="torch")
def check_cached_attention_torch(cached_attention_torch) -> None:
    import torch

    _check_cached_attention(
        cached_attention_torch, lambda *arrays: tuple(torch.as_tensor(a) for a in arrays), "cached_attention_torch",
        "torch",
    )


@exercise(CHAPTER, "cached_attention_keras", "one generation step of attention with a key/value cache, in Keras",
          track="keras")
def check_cached_attention_keras(cached_attention_keras) -> None:
    from keras import ops

    _check_cached_attention(
        cached_attention_keras, lambda *arrays: tuple(ops.convert_to_tensor(a) for a in arrays),
        "cached_attention_keras", "keras",
    )


# ---------------------------------------------------------------------------------------------------------------
# Exercise 6: perplexity
# ---------------------------------------------------------------------------------------------------------------


def _token_nll(logits, targets):
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # (batch, seq_len)


@exercise(CHAPTER, "perplexity", "exp of the mean next-token cross-entropy of (batch, seq_len, vocab) logits")
def check_perplexity(perplexity) -> None:
    generator = rng(85)
    for batch, seq_len, vocab in [(1, 4, 5), (2, 7, 11), (3, 5, 30), (2, 40, 8)]:
        logits = generator.standard_normal((batch, seq_len, vocab)) * 2
        targets = generator.integers(0, vocab, size=(batch, seq_len))
        nll = _token_nll(logits, targets)
        answer = to_numpy(call(perplexity, logits.copy(), targets.copy()))
        expect_close(
            answer.reshape(()) if answer.size == 1 else answer,
            np.exp(nll.mean()),
            f"perplexity(logits of shape {logits.shape}, targets of shape {targets.shape})",
            mistakes={
                "that is the mean cross-entropy; the perplexity is its exponential": nll.mean(),
                "the mean of the per-token perplexities exp(loss_i) is not the perplexity: average the losses "
                "first, then take exp": np.exp(nll).mean(),
                "exp of the summed loss grows with the length of the text; average over the tokens": np.exp(
                    nll.sum()
                ),
                "the probability of the predicted (arg-max) token was used; score the target token": np.exp(
                    _token_nll(logits, logits.argmax(-1)).mean()
                ),
            },
            rtol=1e-4,
        )
