"""Typical wrong answers to the exercises of chapter 8: each must be named in the check's message.

The generic tests in test_exercises.py already cover "the solution passes, the stub fails" for this chapter.
"""

from itertools import pairwise

import numpy as np
import pytest

from companion.checks import CheckFailed, exercises_for, run_check

# ---------------------------------------------------------------------------------------------------------------
# Exercise 1: bpe_merge
# ---------------------------------------------------------------------------------------------------------------


def _merge(step_after_merge=2, first_only=False, keep_last=True, reverse=False, as_tuple=False):
    def bpe_merge(tokens, pair, new_token):
        if as_tuple:
            return tuple(bpe_merge_forward(tokens, pair, new_token))
        if reverse:
            return bpe_merge_forward(tokens[::-1], pair[::-1], new_token)[::-1]
        return bpe_merge_forward(tokens, pair, new_token)

    def bpe_merge_forward(tokens, pair, new_token):
        merged, i, done = [], 0, False
        end = len(tokens) if keep_last else len(tokens) - 1
        while i < end:
            if not done and i + 1 < len(tokens) and (tokens[i], tokens[i + 1]) == tuple(pair):
                merged.append(new_token)
                i += step_after_merge
                done = first_only
            else:
                merged.append(tokens[i])
                i += 1
        return merged

    return bpe_merge


# ---------------------------------------------------------------------------------------------------------------
# Exercise 2: best_pair
# ---------------------------------------------------------------------------------------------------------------


def _merge_as_text(tokens, pair, new_token):
    """Writes the ids out with spaces and replaces the text of the pair: the digits of longer ids get merged."""
    text = " ".join(str(t) for t in tokens).replace(f"{pair[0]} {pair[1]}", str(new_token))
    return [int(t) for t in text.split()]


def _best_pair(weighted=True, once_per_word=False, largest_on_tie=False, first_on_tie=False, none="None",
               as_list=False):
    def best_pair(word_counts):
        counts = {}
        for word, frequency in word_counts.items():
            pairs = list(pairwise(word))
            if once_per_word:
                pairs = list(dict.fromkeys(pairs))
            for pair in pairs:
                counts[pair] = counts.get(pair, 0) + (frequency if weighted else 1)
        if not counts and none != "max of nothing":
            return {"None": None, "empty tuple": ()}[none]
        if first_on_tie:  # max() keeps the first pair seen among equals
            return max(counts, key=counts.get)
        top = max(counts.values())
        tied = [pair for pair, count in counts.items() if count == top]
        best = max(tied) if largest_on_tie else min(tied)
        return list(best) if as_list else best

    return best_pair


# ---------------------------------------------------------------------------------------------------------------
# Exercise 3: temperature_softmax
# ---------------------------------------------------------------------------------------------------------------


def _softmax(x, axis=-1, stable=True):
    x = x - x.max(axis=axis, keepdims=True) if stable else x
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def _overflowing_softmax(x):
    with np.errstate(over="ignore", invalid="ignore"):
        return _softmax(x, stable=False)


def _temperature(kind):
    def temperature_softmax(logits, t):
        if kind == "multiplied":
            return _softmax(logits * t)
        if kind == "columns":
            return _softmax(logits / t, axis=0)
        if kind == "power":
            return _softmax(logits) ** (1 / t)
        if kind == "divided after":
            return _softmax(logits) / t
        return _overflowing_softmax(logits / t)

    return temperature_softmax


TEMPERATURE_MISTAKES = [
    (_temperature("multiplied"), "multiplied by the temperature"),
    (_temperature("columns"), "wrong axis"),
    (_temperature("power"), "without normalising again"),
    (_temperature("divided after"), "divided by the temperature"),
    (_temperature("overflowing"), "subtract each row's maximum"),
]

# ---------------------------------------------------------------------------------------------------------------
# Exercise 4: nucleus_probs
# ---------------------------------------------------------------------------------------------------------------


def _nucleus(strict=False, renormalise=True, sort=True, per_token=False, inclusive=False):
    def nucleus_probs(probs, p):
        if per_token:
            keep = (probs >= p) | (probs == probs.max(-1, keepdims=True))
        else:
            order = np.argsort(-probs, axis=-1) if sort else np.tile(np.arange(probs.shape[-1]), (len(probs), 1))
            sorted_probs = np.take_along_axis(probs, order, axis=-1)
            running = np.cumsum(sorted_probs, axis=-1)
            if inclusive:
                keep_sorted = running - sorted_probs <= p
            else:
                keep_sorted = running < p if strict else running - sorted_probs < p
            keep_sorted[:, 0] = True
            keep = np.zeros_like(keep_sorted)
            np.put_along_axis(keep, order, keep_sorted, axis=-1)
        kept = np.where(keep, probs, 0.0)
        return kept / kept.sum(-1, keepdims=True) if renormalise else kept

    return nucleus_probs


# ---------------------------------------------------------------------------------------------------------------
# Exercise 5: cached attention
# ---------------------------------------------------------------------------------------------------------------


def _cached_torch(front=False, grow=True, only_cache=False, scale="sqrt", only_new=False, as_numpy=False):
    import torch

    def cached_attention_torch(q, k_new, v_new, k_cache, v_cache):
        old_k, old_v = k_cache, v_cache
        if front:
            k_cache, v_cache = torch.cat([k_new, k_cache], 2), torch.cat([v_new, v_cache], 2)
        else:
            k_cache, v_cache = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
        keys, values = (old_k, old_v) if only_cache else (k_cache, v_cache)
        d = q.shape[-1]
        divisor = {"sqrt": d**0.5, "d": d, "none": 1.0}[scale]
        out = torch.softmax(q @ keys.transpose(-1, -2) / divisor, -1) @ values
        if only_new:
            out = v_new
        if as_numpy:
            return tuple(t.detach().numpy() for t in (out, k_cache, v_cache))
        return (out, k_cache, v_cache) if grow else (out, old_k, old_v)

    return cached_attention_torch


def _cached_keras_as_numpy(q, k_new, v_new, k_cache, v_cache):
    from keras import ops

    k_cache, v_cache = ops.concatenate([k_cache, k_new], axis=2), ops.concatenate([v_cache, v_new], axis=2)
    weights = ops.softmax(ops.matmul(q, ops.swapaxes(k_cache, -1, -2)) / q.shape[-1] ** 0.5, axis=-1)
    return tuple(ops.convert_to_numpy(t) for t in (ops.matmul(weights, v_cache), k_cache, v_cache))


def _cached_keras(front=False, scale="sqrt", only_cache=False):
    from keras import ops

    def cached_attention_keras(q, k_new, v_new, k_cache, v_cache):
        old_k, old_v = k_cache, v_cache
        pieces = (lambda old, new: [new, old]) if front else (lambda old, new: [old, new])
        k_cache = ops.concatenate(pieces(k_cache, k_new), axis=2)
        v_cache = ops.concatenate(pieces(v_cache, v_new), axis=2)
        keys, values = (old_k, old_v) if only_cache else (k_cache, v_cache)
        d = q.shape[-1]
        divisor = {"sqrt": d**0.5, "d": d}[scale]
        scores = ops.matmul(q, ops.swapaxes(keys, -1, -2)) / divisor
        return ops.matmul(ops.softmax(scores, axis=-1), values), k_cache, v_cache

    return cached_attention_keras


# ---------------------------------------------------------------------------------------------------------------
# Exercise 6: perplexity
# ---------------------------------------------------------------------------------------------------------------


def _nll(logits, targets):
    log_probs = np.log(_softmax(logits))
    return -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]


def _perplexity(kind):
    def perplexity(logits, targets):
        if kind == "no exp":
            return float(_nll(logits, targets).mean())
        if kind == "exp first":
            return float(np.exp(_nll(logits, targets)).mean())
        if kind == "sum":
            return float(np.exp(_nll(logits, targets).sum()))
        if kind == "array":
            return np.exp(_nll(logits, targets).mean(keepdims=True))
        return float(np.exp(_nll(logits, logits.argmax(-1)).mean()))  # scores the model's own best guess

    return perplexity


PERPLEXITY_MISTAKES = [
    (_perplexity("no exp"), "its exponential"),
    (_perplexity("exp first"), "average the losses first"),
    (_perplexity("sum"), "average over the tokens"),
    (_perplexity("argmax"), "score the target token"),
]

CH08_MISTAKES = [
    ("bpe_merge", lambda: _merge(first_only=True), "only the first occurrence"),
    ("bpe_merge", lambda: _merge(step_after_merge=1), "skip both tokens"),
    ("bpe_merge", lambda: _merge(reverse=True), "right to left"),
    ("bpe_merge", lambda: _merge(keep_last=False), "last token went missing"),
    ("best_pair", lambda: _best_pair(weighted=False), "every word was counted once"),
    ("best_pair", lambda: _best_pair(once_per_word=True), "counted once per word"),
    ("best_pair", lambda: _best_pair(largest_on_tie=True), "on a tie"),
    ("best_pair", lambda: _best_pair(first_on_tie=True), "on a tie"),
    *[("temperature_softmax", (lambda m=m: m), message) for m, message in TEMPERATURE_MISTAKES],
    ("nucleus_probs", lambda: _nucleus(strict=True), "crosses p"),
    ("nucleus_probs", lambda: _nucleus(renormalise=False), "renormalised"),
    ("nucleus_probs", lambda: _nucleus(sort=False), "decreasing order"),
    ("nucleus_probs", lambda: _nucleus(per_token=True), "not on each token"),
    ("cached_attention_torch", lambda: _cached_torch(front=True), "in front of the cache"),
    ("cached_attention_torch", lambda: _cached_torch(grow=False), "cache was not grown"),
    ("cached_attention_torch", lambda: _cached_torch(only_cache=True), "only to the cache"),
    ("cached_attention_torch", lambda: _cached_torch(scale="d"), "divided by d_head"),
    ("cached_attention_torch", lambda: _cached_torch(scale="none"), "not scaled"),
    ("cached_attention_torch", lambda: _cached_torch(only_new=True), "new value itself"),
    ("cached_attention_keras", lambda: _cached_keras(front=True), "in front of the cache"),
    ("cached_attention_keras", lambda: _cached_keras(scale="d"), "divided by d_head"),
    ("cached_attention_keras", lambda: _cached_keras(only_cache=True), "only to the cache"),
    *[("perplexity", (lambda m=m: m), message) for m, message in PERPLEXITY_MISTAKES],
]


def _causal_torch(kind):
    def causal_softmax_torch(scores):
        import torch

        seq_len = scores.shape[-1]
        future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(diagonal=0 if kind == "diagonal" else 1)
        if kind == "past":
            future = future.T
        fill = -1e9 if kind == "1e9" else torch.finfo(scores.dtype).min
        if kind == "no_mask":
            return torch.softmax(scores, dim=-1)
        if kind == "float32":
            return torch.softmax(scores.float().masked_fill(future, -1e9), dim=-1)
        return torch.softmax(scores.masked_fill(future, fill), dim=-1)

    return causal_softmax_torch


def _causal_keras(kind):
    def causal_softmax_keras(scores):
        from keras import ops

        seq_len = scores.shape[-1]
        future = ops.triu(ops.ones((seq_len, seq_len), dtype="bool"), k=0 if kind == "diagonal" else 1)
        if kind == "no_mask":
            return ops.softmax(scores, axis=-1)
        out = ops.softmax(ops.where(future, float("-inf"), scores), axis=-1)
        return ops.convert_to_numpy(out) if kind == "numpy" else out

    return causal_softmax_keras


def _top_k(kind):
    def top_k_probs(logits, k, temperature):
        scaled = logits if kind == "no_temperature" else logits / temperature
        keep = k + 1 if kind == "k_plus_one" else k
        kth = np.sort(scaled, axis=-1)[:, -min(keep, scaled.shape[-1])][:, None]
        probs = _softmax(scaled)
        kept = np.where(scaled >= kth, probs, 0.0)
        if kind == "no_renormalise":
            return kept
        if kind == "list":
            return (kept / kept.sum(-1, keepdims=True)).tolist()
        return kept / kept.sum(-1, keepdims=True)

    return top_k_probs


def _cache(kind):
    def kv_cache_bytes(num_layers, d_model, seq_len, bytes_per_number, batch):
        if kind == "keys_only":
            return num_layers * d_model * seq_len * bytes_per_number * batch
        if kind == "numbers":
            return 2 * num_layers * d_model * seq_len * batch
        if kind == "no_batch":
            return 2 * num_layers * d_model * seq_len * bytes_per_number
        if kind == "gib":
            return 2 * num_layers * d_model * seq_len * bytes_per_number * batch / 2**30
        raise ValueError(kind)

    return kv_cache_bytes


CH08_MISTAKES += [
    ("causal_softmax_torch", lambda: _causal_torch("1e9"), "original bug"),
    ("causal_softmax_torch", lambda: _causal_torch("diagonal"), "hides the diagonal"),
    ("causal_softmax_torch", lambda: _causal_torch("no_mask"), "without the causal mask"),
    ("causal_softmax_torch", lambda: _causal_torch("past"), "hides the past"),
    ("causal_softmax_torch", lambda: _causal_torch("float32"), "dtype of scores"),
    ("causal_softmax_keras", lambda: _causal_keras("diagonal"), "hides the diagonal"),
    ("causal_softmax_keras", lambda: _causal_keras("no_mask"), "without the causal mask"),
    ("causal_softmax_keras", lambda: _causal_keras("numpy"), "Keras tensor"),
    ("top_k_probs", lambda: _top_k("no_renormalise"), "not renormalised"),
    ("top_k_probs", lambda: _top_k("no_temperature"), "temperature is missing"),
    ("top_k_probs", lambda: _top_k("k_plus_one"), "k \\+ 1 tokens"),
    ("kv_cache_bytes", lambda: _cache("keys_only"), "only the keys"),
    ("kv_cache_bytes", lambda: _cache("numbers"), "numbers, not bytes"),
    ("kv_cache_bytes", lambda: _cache("no_batch"), "batch is missing"),
    ("kv_cache_bytes", lambda: _cache("gib"), "is an int; got float"),
]

# The mistake classes of the catalogue (companion.instructor.synthetic.mistake_classes counts them).
NAMED_INPUTS = [
    ("bpe_merge", lambda: _merge_as_text, "merged their digits as text"),
    ("best_pair", lambda: _best_pair(none="max of nothing"), "return None when no word has two tokens"),
    ("best_pair", lambda: _best_pair(none="empty tuple"), "return None when no word has two tokens"),
    ("nucleus_probs", lambda: _nucleus(inclusive=True), "reaches p exactly"),
]
STATED_TYPES = [
    ("bpe_merge", lambda: _merge(as_tuple=True), r"\(a list\) is a list; got tuple"),
    ("best_pair", lambda: _best_pair(as_list=True), r"\(a tuple \(a, b\)\) is a tuple; got list"),
    ("perplexity", lambda: _perplexity("array"), r"\(as a float\) is a float; got ndarray"),
    ("cached_attention_torch", lambda: _cached_torch(as_numpy=True), "should be a torch.Tensor; got ndarray"),
    ("top_k_probs", lambda: _top_k("list"), "should be a NumPy array; got list"),
    ("cached_attention_keras", lambda: _cached_keras_as_numpy, "should be a Keras tensor"),
    CH08_MISTAKES[-1],
]
CH08_MISTAKES += NAMED_INPUTS + STATED_TYPES[:-1]
TAGGED_TYPES = [case for case in CH08_MISTAKES if (case[0], case[2]) in {
    ("causal_softmax_torch", "dtype of scores"), ("causal_softmax_keras", "Keras tensor")}]
MISTAKE_CLASSES = {"an input the text names": NAMED_INPUTS, "a type the text states": STATED_TYPES + TAGGED_TYPES}


@pytest.mark.parametrize("exercise_id, make, message", CH08_MISTAKES, ids=[f"{e}-{m}" for e, _, m in CH08_MISTAKES])
def test_typical_mistakes_are_named(exercise_id, make, message):
    with pytest.raises(CheckFailed, match=message):
        run_check(exercise_id, make())


def test_every_exercise_of_chapter_8_has_at_least_three_named_mistakes():
    ids = [e.id for e in exercises_for("08_gpt")]
    assert len(ids) >= 5
    for exercise_id in ids:
        assert sum(m[0] == exercise_id for m in CH08_MISTAKES) >= 3, exercise_id


def test_checks_leave_the_students_arrays_alone():
    """A correct answer that works in place on its input must still pass: every check passes copies."""

    def temperature_softmax(logits, temperature):
        logits /= temperature
        logits -= logits.max(-1, keepdims=True)
        np.exp(logits, out=logits)
        return logits / logits.sum(-1, keepdims=True)

    run_check("temperature_softmax", temperature_softmax)


def test_the_find_the_bug_stubs_of_chapter_8_run_and_their_bug_is_named():
    from pathlib import Path

    from companion.notebook_code import load_definitions

    stubs = load_definitions(Path(__file__).resolve().parents[1] / "exercises" / "08_gpt.md")
    for exercise_id in ("causal_softmax_torch", "causal_softmax_keras"):
        with pytest.raises(CheckFailed, match="original bug"):
            run_check(exercise_id, stubs[exercise_id])
