"""Checks for chapter 8, "A small GPT"."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import numpy as np

from companion.bpe import merge_pair
from companion.checks import CheckFailed, call, exercise, expect_close, expect_equal, rng, to_numpy
from companion.checks.tracks import expect_answer_type, expect_differentiable, expect_type
from companion.sampling import softmax

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


def _merge_as_text(tokens, pair, new):  # merges the digits of the ids, written out with spaces
    text = " ".join(str(t) for t in tokens).replace(f"{pair[0]} {pair[1]}", str(new))
    return [int(t) for t in text.split()]


def _merge_cases():
    yield [5, 5, 5], (5, 5), 9  # overlapping occurrences
    yield [11, 2, 1, 2, 3], (1, 2), 7  # ids of several digits: "11 2" is not the pair (1, 2)
    yield [12, 21, 2, 1, 21], (1, 2), 30
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
        what = f"bpe_merge({tokens}, {pair}, {new})"
        expect_equal(
            answer,
            merge_pair(tokens, pair, new),
            what,
            mistakes={
                "the text says: every occurrence is replaced; in yours only the first occurrence was merged": (
                    _merge_first_only(tokens, pair, new)
                ),
                "the text says: occurrences do not overlap, so bpe_merge([5, 5, 5], (5, 5), 9) is [9, 5]; after a "
                "merge, skip both tokens of the pair (move on by two, not one)": _merge_step_one(tokens, pair, new),
                "the text says: scan from left to right; yours went from right to left (in [a, a, a] the leftmost "
                "(a, a) is merged first: [new, a])": _merge_right_to_left(tokens, pair, new),
                "the text says: return the list with every occurrence replaced; in yours the last token went "
                "missing (keep the token that had no partner)": _merge_drop_last(tokens, pair, new),
                "the text says: tokens is a list of token ids; yours merged their digits as text (in '11 2' the "
                "text '1 2' is not the pair (1, 2)): compare ids, not characters": _merge_as_text(tokens, pair, new),
            },
        )
        expect_answer_type(answer, "list", f"the result of {what} (a list)")


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
    yield {(5,): 3, (7,): 1}  # no word has two tokens
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
        what = f"best_pair({word_counts})"
        if not _pair_counts(word_counts):
            try:
                answer = call(best_pair, dict(word_counts))
            except CheckFailed as failure:
                raise CheckFailed(f"the text says: return None when no word has two tokens; {failure}") from None
            if answer is not None:
                raise CheckFailed(f"the text says: return None when no word has two tokens; {what} returned "
                                  f"{answer!r}")
            continue
        answer = call(best_pair, dict(word_counts))
        expect_equal(
            answer,
            _best(_pair_counts(word_counts)),
            what,
            mistakes={
                "the text says: a pair counts ... times the word's count; in yours every word was counted once": (
                    _best(_pair_counts(word_counts, weighted=False))
                ),
                "the text says: a pair counts every time it occurs in a word; yours counted once per word ((7, 7) "
                "occurs 3 times in (7, 7, 7, 7))": _best(_pair_counts(word_counts, once_per_word=True)),
                "the text says: when several pairs are equally frequent, return the smallest one (compare the "
                "tuples); yours picked another pair on a tie": _best(_pair_counts(word_counts), largest_on_tie=True),
            },
        )
        expect_answer_type(answer, "tuple", f"the pair returned by {what} (a tuple (a, b))")


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
                f"the text says: it must work for logits as large as 1000; {what} contains NaN or infinity: exp "
                "overflows, so subtract each row's maximum before exp (it does not change the softmax)"
            )
        expect_close(
            answer,
            softmax(logits / t),
            what,
            mistakes={
                "the text says: softmax of logits / temperature; in yours the logits were multiplied by the "
                "temperature": softmax(logits * t),
                "the text says: softmax along the last axis; yours ran over the wrong axis (one distribution per "
                "row)": (
                    np.exp(logits / t - (logits / t).max(0)) / np.exp(logits / t - (logits / t).max(0)).sum(0)
                ),
                "the text says: softmax of logits / temperature; yours applied the temperature after the softmax "
                "without normalising again": softmax(logits) ** (1 / t),
                "the text says: softmax of logits / temperature; in yours the probabilities were divided by the "
                "temperature": softmax(logits) / t,
            },
        )


# ---------------------------------------------------------------------------------------------------------------
# Exercise 4: top-p (nucleus)
# ---------------------------------------------------------------------------------------------------------------


def _renormalise(probs, keep):
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


def _nucleus_keep(probs, p):
    """The nucleus of each row, from the probabilities themselves (exact when they are sums of powers of 2)."""
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    keep = np.zeros_like(probs, dtype=bool)
    np.put_along_axis(keep, order, np.cumsum(sorted_probs, axis=-1) - sorted_probs < p, axis=-1)
    return keep


def _nucleus_mistakes(probs, p):
    order = np.argsort(-probs, axis=-1)
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    strict = np.zeros_like(probs, dtype=bool)
    np.put_along_axis(strict, order, np.cumsum(sorted_probs, axis=-1) < p, axis=-1)
    strict[np.arange(len(probs)), order[:, 0]] = True  # keeps at least the favourite, to stay a distribution
    unsorted = (np.cumsum(probs, axis=-1) - probs) < p
    right = _nucleus_keep(probs, p)
    inclusive = np.zeros_like(probs, dtype=bool)
    np.put_along_axis(inclusive, order, np.cumsum(sorted_probs, axis=-1) - sorted_probs <= p, axis=-1)
    return {
        "the text says: the smallest set whose probabilities add up to at least p; when the running sum reaches p "
        "exactly, the set is complete: yours kept one more token (compare with < p, not <= p)": _renormalise(
            probs, inclusive),
        "the text says: the smallest set whose probabilities add up to at least p, so the token that crosses p is "
        "kept; yours left it out": _renormalise(probs, strict),
        "the text says: renormalise the row to sum to 1; the kept probabilities were not renormalised": np.where(
            right, probs, 0.0
        ),
        "the text says: keep the most likely tokens; sort the probabilities in decreasing order before the "
        "running sum": _renormalise(probs, unsorted),
        "the text says: the kept probabilities add up to at least p; p is a bound on their total mass, not on "
        "each token's probability": _renormalise(probs, (probs >= p) | (probs == probs.max(-1, keepdims=True))),
    }


@exercise(CHAPTER, "nucleus_probs", "top-p: keep the most likely tokens until their mass reaches p, renormalise")
def check_nucleus_probs(nucleus_probs) -> None:
    generator = rng(83)
    cases = [(np.array([[0.5, 0.3, 0.15, 0.05]]), 0.9), (np.array([[0.1, 0.6, 0.3]]), 0.5),
             # the running sum hits p exactly (these sums are exact in floating point)
             (np.array([[0.125, 0.5, 0.0625, 0.25, 0.0625], [0.25, 0.125, 0.5, 0.0625, 0.0625]]), 0.75),
             (np.array([[0.5, 0.25, 0.125, 0.0625, 0.0625]]), 0.875)]
    for vocab, p in [(6, 0.9), (10, 0.5), (20, 0.8), (8, 0.95), (5, 0.3)]:
        logits = generator.standard_normal((3, vocab)) * 2
        cases.append((softmax(logits), p))
    for probs, p in cases:
        answer = call(nucleus_probs, probs.copy(), p)
        expect_close(
            answer,
            _renormalise(probs, _nucleus_keep(probs, p)),
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
            raise CheckFailed(f"the text says: return (out, k_cache, v_cache); {what} did not return three things")
        out, k_grown, v_grown = (to_numpy(r) for r in result)
        front = np.concatenate([k_new, k_cache], axis=2)
        expect_close(
            k_grown, k_all, f"the k_cache returned by {what}",
            mistakes={
                "the text says: append at the end, along the length axis; the new key went in front of the "
                "cache": front,
                "the text says: append the new key to the cache (shape (batch, num_heads, past_len + 1, d_head)); "
                "the cache was not grown": k_cache,
            },
        )
        expect_close(v_grown, v_all, f"the v_cache returned by {what}",
                     mistakes={"the text says: append at the end, along the length axis; the new value went in "
                               "front of the cache": np.concatenate([v_new, v_cache], axis=2)})
        expect_close(
            out,
            _attend(q, k_all, v_all, np.sqrt(d_head)),
            f"the output of {what}",
            mistakes={
                "the text says: attend over every position of the GROWN cache; the new token attended only to the "
                "cache, not to itself": _attend(q, k_cache, v_cache, np.sqrt(d_head)),
                "the text asks for scaled dot-product attention; the scores were divided by d_head, divide by "
                "sqrt(d_head)": _attend(q, k_all, v_all, d_head),
                "the text asks for scaled dot-product attention; the scores were not scaled: divide q k^T by "
                "sqrt(d_head)": _attend(q, k_all, v_all, 1.0),
                "the text says: the new token attends over every position of the grown cache; the output is the new "
                "value itself": v_new,
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
        result = call(perplexity, logits.copy(), targets.copy())
        answer = to_numpy(result)
        expect_close(
            answer.reshape(()) if answer.size == 1 else answer,
            np.exp(nll.mean()),
            f"perplexity(logits of shape {logits.shape}, targets of shape {targets.shape})",
            mistakes={
                "the text says: the exponential of the mean cross-entropy; yours is the mean cross-entropy, not its "
                "exponential": nll.mean(),
                "the text says: the exponential of the MEAN cross-entropy; yours is the mean of the per-token "
                "perplexities exp(loss_i): average the losses first, then take exp": np.exp(nll).mean(),
                "the text says: the mean cross-entropy over all positions; exp of the summed loss grows with the "
                "length of the text, average over the tokens": np.exp(nll.sum()),
                "the text says: targets holds the token that really came next; yours used the probability of the "
                "predicted (arg-max) token, score the target token": np.exp(
                    _token_nll(logits, logits.argmax(-1)).mean()
                ),
            },
            rtol=1e-4,
        )
        expect_answer_type(result, "float", f"perplexity(logits of shape {logits.shape}, ...) (as a float)")


# ---------------------------------------------------------------------------------------------------------------
# Find-the-bug (causal softmax in float16 / a mask that hides the diagonal), stretch, graded prediction
# ---------------------------------------------------------------------------------------------------------------


def _causal_weights(scores: np.ndarray, hidden: np.ndarray | None = None, fill: float = -np.inf) -> np.ndarray:
    """Softmax in float64 with the keys where ``hidden`` is True masked by ``fill``; by default the causal mask."""
    seq_len = scores.shape[-1]
    if hidden is None:
        hidden = np.triu(np.ones((seq_len, seq_len), dtype=bool), k=1)
    masked = np.where(hidden, fill, scores.astype(np.float64))
    with np.errstate(invalid="ignore"):
        weights = np.exp(masked - masked.max(-1, keepdims=True))
        return weights / weights.sum(-1, keepdims=True)


def _check_causal_softmax(causal_softmax, track: str) -> None:
    from companion.checks.tracks import converter, expect_type

    name = f"causal_softmax_{track}"
    generator = rng(81)
    for (batch, heads, seq_len), dtype in [((2, 2, 4), np.float32), ((1, 3, 6), np.float16),
                                           ((2, 1, 2), np.float16), ((3, 2, 5), np.float32)]:
        scores = (generator.standard_normal((batch, heads, seq_len, seq_len)) * 2).astype(dtype)
        what = f"{name}(scores {scores.shape} {np.dtype(dtype).name})"
        try:
            answer = call(causal_softmax, *converter(track)(scores))
        except CheckFailed as failure:
            if dtype == np.float16 and "overflow" in str(failure):
                raise CheckFailed(f"the text says: it must work for float16 scores; {what} fails: -1e9 does not fit "
                                  "in float16 (whose largest magnitude is 65504), which was the original bug: mask "
                                  "with the lowest value of the scores' dtype (torch.finfo(scores.dtype).min) or "
                                  "-inf") from None
            raise
        values = to_numpy(answer)
        if values.shape == scores.shape and np.isnan(values[..., 0, :]).any():
            raise CheckFailed(f"the text says: query i may attend to the keys 0 .. i, itself included; {what} gives "
                              "NaN in the first row: the mask hides the diagonal too (the original bug of the Keras "
                              "version), so the first query has no key left (mask above the diagonal only: k=1)")
        tol = {"atol": 2e-3, "rtol": 2e-3} if dtype == np.float16 or track == "keras" else {"atol": 1e-6,
                                                                                               "rtol": 1e-5}
        expect_close(
            values.astype(np.float64) if values.dtype.kind == "f" else values,
            _causal_weights(scores),
            what,
            mistakes={
                "the text says: query i may attend to the keys 0 .. i only; your softmax runs without the causal "
                "mask": _causal_weights(scores, np.zeros((seq_len, seq_len), dtype=bool)),
                "the text says: query i may attend to the keys 0 .. i, itself included; your mask hides the "
                "diagonal too, so the first query has no key left (its row comes out uniform)": _causal_weights(
                    scores, np.triu(np.ones((seq_len, seq_len), dtype=bool)), fill=-1e30
                ),
                "the text says: query i may attend to the keys 0 .. i; your mask hides the past instead of the "
                "future (below the diagonal)": _causal_weights(
                    scores, np.tril(np.ones((seq_len, seq_len), dtype=bool), k=-1)
                ),
            },
            **tol,
        )
        expect_type(answer, track, f"the result of {name}", "float")
        if values.dtype != np.dtype(dtype):
            raise CheckFailed(f"the text says: the result has the shape and the dtype of scores; {what} returned "
                              f"{values.dtype}, not the dtype of scores")


@exercise(CHAPTER, "causal_softmax_torch", "find the bug: causal attention weights that work in float16 (PyTorch)",
          "torch", ("torch.nn.functional.scaled_dot_product_attention",))
def check_causal_softmax_torch(causal_softmax_torch) -> None:
    _check_causal_softmax(causal_softmax_torch, "torch")


@exercise(CHAPTER, "causal_softmax_keras", "find the bug: causal attention weights, query included (Keras)", "keras",
          ("keras.ops.dot_product_attention",))
def check_causal_softmax_keras(causal_softmax_keras) -> None:
    _check_causal_softmax(causal_softmax_keras, "keras")


@exercise(CHAPTER, "top_k_probs", "softmax(logits / T) restricted to the k most likely tokens, renormalised")
def check_top_k_probs(top_k_probs) -> None:
    from companion.checks.tracks import expect_type

    generator = rng(82)
    for batch, vocab, k, temperature in [(2, 10, 3, 1.0), (3, 8, 1, 0.5), (1, 6, 6, 2.0), (4, 50, 7, 0.7)]:
        logits = generator.standard_normal((batch, vocab)) * 2
        answer = call(top_k_probs, logits.copy(), k, temperature)
        order = np.argsort(-logits, axis=-1)

        def restricted(values, keep, order=order):
            mask = np.zeros_like(values, dtype=bool)
            np.put_along_axis(mask, order[:, :keep], True, axis=-1)
            return mask, np.where(mask, values, 0.0)

        probs = softmax(logits / temperature)
        mask, kept = restricted(probs, k)
        expected = kept / kept.sum(-1, keepdims=True)
        expect_close(
            answer,
            expected,
            f"top_k_probs(logits {logits.shape}, k={k}, temperature={temperature})",
            mistakes={
                "the text says: renormalised so that each row sums to 1; the kept probabilities were not "
                "renormalised": kept,
                "the text says: softmax(logits / T); in yours the temperature is missing": (
                    lambda p: p / p.sum(-1, keepdims=True))(restricted(softmax(logits), k)[1]),
                "the text says: softmax(logits / T); in yours the logits were multiplied by T": (
                    lambda p: p / p.sum(-1, keepdims=True))(restricted(softmax(logits * temperature), k)[1]),
                "the text says: restricted to the k most likely tokens; yours kept the k least likely": (
                    lambda m: np.where(m, probs, 0) / np.where(m, probs, 0).sum(-1, keepdims=True))(
                    ~restricted(probs, vocab - k)[0]) if k < vocab else expected * 0,
                "the text says: the k most likely tokens, with exactly 0 for every other; in yours k + 1 tokens were "
                "kept (an off-by-one at the k-th value)": (
                    lambda p: p / p.sum(-1, keepdims=True))(restricted(probs, min(k + 1, vocab))[1]),
            },
            atol=1e-7,
        )
        expect_type(answer, "numpy", "the result of top_k_probs", "float")


@exercise(CHAPTER, "kv_cache_bytes", "predict: the bytes of a key/value cache (2 * layers * d_model * tokens * ...)")
def check_kv_cache_bytes(kv_cache_bytes) -> None:

    for layers, d_model, seq_len, size, batch in [(12, 768, 1024, 4, 8), (24, 2048, 4096, 2, 1), (2, 64, 10, 2, 3),
                                                  (1, 8, 1, 4, 1), (32, 4096, 8192, 2, 16)]:
        answer = call(kv_cache_bytes, layers, d_model, seq_len, size, batch)
        expect_answer_type(answer, "int",
                           f"kv_cache_bytes({layers}, {d_model}, {seq_len}, {size}, {batch}) (as an int)")
        numbers = layers * d_model * seq_len * batch
        expect_equal(
            int(answer),
            2 * numbers * size,
            f"kv_cache_bytes(num_layers={layers}, d_model={d_model}, seq_len={seq_len}, bytes_per_number={size}, "
            f"batch={batch})",
            mistakes={
                "the text says: a key and a value vector per token and per block; yours counted only the keys (or "
                "only the values)": numbers * size,
                "the text says: the number of bytes, with bytes_per_number bytes per number; yours counts numbers, "
                "not bytes": 2 * numbers,
                "the text says: bytes_per_number is 2 for 16-bit floats, already in bytes; yours counts bits, not "
                "bytes": 2 * numbers * size * 8,
                "the text says: the cache of `batch` sequences; in yours the batch is missing": 2 * layers * d_model
                * seq_len * size,
                "the text says: a key and a value per token and per block; in yours the layers are missing (every "
                "block keeps its own cache)": 2 * d_model * seq_len * size * batch,
            },
        )
