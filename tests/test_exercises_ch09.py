"""Typical wrong answers to the exercises of chapter 9: each must be named in the check's message.

The generic tests in test_exercises.py already cover "the solution passes, the stub fails" for this chapter.
"""

import numpy as np
import pytest

from companion.checks import CheckFailed, exercises_for, run_check

# ---------------------------------------------------------------------------------------------------------------
# Exercise 1: rms_norm
# ---------------------------------------------------------------------------------------------------------------


def _rms_norm(kind):
    def rms_norm(x, weight, eps):
        dtype = x.dtype
        if kind != "float16" and dtype == np.float16:
            x = x.astype(np.float32)
        if kind == "centre":
            x = x - x.mean(axis=-1, keepdims=True)
        square = x.var(axis=-1, keepdims=True) if kind == "variance" else np.mean(x * x, axis=-1, keepdims=True)
        scale = np.sqrt(square) + eps if kind == "eps_outside" else np.sqrt(square + eps)
        out = x / scale * (1.0 if kind == "no_gain" else weight)
        return out if kind == "float32_result" else out.astype(dtype)

    return rms_norm


# ---------------------------------------------------------------------------------------------------------------
# Exercise 2: rotate_half
# ---------------------------------------------------------------------------------------------------------------


def _rotate_half(kind):
    def rotate_half(x):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        if kind == "sign":
            return np.concatenate([x2, -x1], axis=-1)
        if kind == "swap":
            return np.concatenate([x2, x1], axis=-1)
        if kind == "list":
            return np.concatenate([-x2, x1], axis=-1).tolist()
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = -x[..., 1::2], x[..., 0::2]
        return out

    return rotate_half


# ---------------------------------------------------------------------------------------------------------------
# Exercise 3: apply_rope
# ---------------------------------------------------------------------------------------------------------------


def _apply_rope(kind):
    def apply_rope(x, offset, base):
        seq_len, head_dim = x.shape[-2], x.shape[-1]
        start = 0 if kind == "no_offset" else offset
        positions = np.arange(start, start + seq_len)
        factor = 1 if kind == "exponent" else 2
        angles = positions[:, None] * base ** (-factor * np.arange(head_dim // 2) / head_dim)[None, :]
        if kind == "interleaved":
            out = np.empty_like(x)
            even, odd = x[..., 0::2], x[..., 1::2]
            out[..., 0::2] = even * np.cos(angles) - odd * np.sin(angles)
            out[..., 1::2] = even * np.sin(angles) + odd * np.cos(angles)
            return out
        angles = np.concatenate([angles, angles], axis=-1)
        half = head_dim // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        sign = -1 if kind == "sign" else 1
        out = x * np.cos(angles) + sign * rotated * np.sin(angles)
        return out.tolist() if kind == "list" else out

    return apply_rope


# ---------------------------------------------------------------------------------------------------------------
# Exercise 4: swiglu in PyTorch and Keras
# ---------------------------------------------------------------------------------------------------------------


def _swiglu_torch(kind):
    def swiglu_torch(x, w1, w2, w3):
        import torch

        a, b = (x @ w3, x @ w1) if kind == "swap" else (x @ w1, x @ w3)
        if kind == "relu":
            gate = torch.relu(a)
        elif kind == "sigmoid":
            gate = torch.sigmoid(a)
        else:
            gate = a * torch.sigmoid(a)
        if kind == "ungated":
            return gate @ w2
        if kind == "detach":
            return ((gate * b) @ w2).detach()
        if kind == "numpy":
            return ((gate * b) @ w2).detach().numpy()
        return (gate * b) @ w2

    return swiglu_torch


def _swiglu_keras(kind):
    def swiglu_keras(x, w1, w2, w3):
        from keras import ops

        a, b = ops.matmul(x, w1), ops.matmul(x, w3)
        if kind == "relu":
            gate = ops.relu(a)
        elif kind == "sigmoid":
            gate = ops.sigmoid(a)
        else:
            gate = a * ops.sigmoid(a)
        if kind == "ungated":
            return ops.matmul(gate, w2)
        out = ops.matmul(gate * b, w2)
        return ops.convert_to_numpy(out) if kind == "numpy" else out

    return swiglu_keras


# ---------------------------------------------------------------------------------------------------------------
# Exercise 5: expand_kv_heads
# ---------------------------------------------------------------------------------------------------------------


def _expand(kind):
    def expand_kv_heads(x, group):
        if kind == "tile":
            return np.tile(x, (1, group, 1, 1))
        if kind == "sequence":
            return np.repeat(x, group, axis=2)
        if kind == "features":
            return np.repeat(x, group, axis=3)
        if kind == "list":
            return np.repeat(x, group, axis=1).tolist()
        return np.repeat(x, x.shape[1], axis=1)  # the number of kv heads instead of the group

    return expand_kv_heads


# ---------------------------------------------------------------------------------------------------------------
# Exercise 6: window_mask
# ---------------------------------------------------------------------------------------------------------------


def _window(kind):
    def window_mask(length, window):
        query, key = np.arange(length)[:, None], np.arange(length)[None, :]
        if kind == "one_more":
            allowed = (key <= query) & (key >= query - window)
        elif kind == "blocked":
            allowed = ~((key <= query) & (key > query - window))
        elif kind == "no_self":
            allowed = (key < query) & (key >= query - window)
        elif kind == "two_sided":
            allowed = np.abs(query - key) < window
        elif kind == "square":
            return (key <= query) & (key > query - window)
        else:  # a 0/1 integer mask
            return ((key <= query) & (key > query - window)).astype(int)[None, None]
        return allowed[None, None]

    return window_mask


# ---------------------------------------------------------------------------------------------------------------
# Exercise 7: fixed_online_attention
# ---------------------------------------------------------------------------------------------------------------


def _online(kind):
    def fixed_online_attention(q, k, v, block_size):
        scale = 1 / np.sqrt(q.shape[-1])
        m = np.full((*q.shape[:-1], 1), -np.inf)
        total = np.zeros((*q.shape[:-1], 1))
        acc = np.zeros((*q.shape[:-1], v.shape[-1]))
        for start in range(0, k.shape[-2], block_size):
            scores = q @ np.swapaxes(k[..., start:start + block_size, :], -1, -2) * scale
            new_m = np.maximum(m, scores.max(axis=-1, keepdims=True))
            correction = np.exp(m - new_m)
            weights = np.exp(scores - new_m)
            total = (total if kind in ("sum", "both") else total * correction) + weights.sum(axis=-1, keepdims=True)
            acc = (acc if kind in ("original", "both") else acc * correction) + weights @ v[..., start:start +
                                                                                           block_size, :]
            m = new_m
        return (acc / total).tolist() if kind == "list" else acc / total

    return fixed_online_attention


# ---------------------------------------------------------------------------------------------------------------
# Exercise 8: permute_for_half_split
# ---------------------------------------------------------------------------------------------------------------


def _permute(kind):
    def permute_for_half_split(w, num_heads):
        head_dim = w.shape[1] // num_heads
        within = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
        if kind == "whole":
            width = w.shape[1]
            return w[:, np.concatenate([np.arange(0, width, 2), np.arange(1, width, 2)])]
        if kind == "inverse":
            within = np.argsort(within)
        order = np.concatenate([head * head_dim + within for head in range(num_heads)])
        if kind == "list":
            return w[:, order].tolist()
        return w[order] if kind == "rows" and w.shape[0] == w.shape[1] else w[:, order]

    return permute_for_half_split


# ---------------------------------------------------------------------------------------------------------------
# Exercise 9: gqa_cache_bytes
# ---------------------------------------------------------------------------------------------------------------


def _cache(kind):
    def gqa_cache_bytes(num_layers, num_heads, num_kv_heads, head_dim, seq_len, bytes_per_number):
        heads = num_heads if kind == "query_heads" else num_kv_heads
        pairs = 1 if kind == "keys_only" else 2
        size = 1 if kind == "numbers" else bytes_per_number
        total = pairs * num_layers * heads * head_dim * seq_len * size
        return total / 2**30 if kind == "gib" else total

    return gqa_cache_bytes


CH09_MISTAKES = [
    ("rms_norm", lambda: _rms_norm("centre"), "subtracted the mean"),
    ("rms_norm", lambda: _rms_norm("variance"), "used the variance"),
    ("rms_norm", lambda: _rms_norm("eps_outside"), "after the square root"),
    ("rms_norm", lambda: _rms_norm("no_gain"), "gain is missing"),
    ("rotate_half", lambda: _rotate_half("sign"), "sign is on the wrong half"),
    ("rotate_half", lambda: _rotate_half("swap"), "minus sign is missing"),
    ("rotate_half", lambda: _rotate_half("pairs"), "neighbouring pairs"),
    ("apply_rope", lambda: _apply_rope("exponent"), r"base\*\*\(-i / head_dim\)"),
    ("apply_rope", lambda: _apply_rope("sign"), "turns the wrong way"),
    ("apply_rope", lambda: _apply_rope("interleaved"), "interleaved layout"),
    ("swiglu_torch", lambda: _swiglu_torch("relu"), "ReLU instead of SiLU"),
    ("swiglu_torch", lambda: _swiglu_torch("sigmoid"), "sigmoid\\(z\\) alone"),
    ("swiglu_torch", lambda: _swiglu_torch("swap"), "put it on x W3"),
    ("swiglu_torch", lambda: _swiglu_torch("ungated"), "partner x W3 is missing"),
    ("swiglu_torch", lambda: _swiglu_torch("detach"), "no gradient reaches"),
    ("swiglu_keras", lambda: _swiglu_keras("relu"), "ReLU instead of SiLU"),
    ("swiglu_keras", lambda: _swiglu_keras("sigmoid"), "sigmoid\\(z\\) alone"),
    ("swiglu_keras", lambda: _swiglu_keras("ungated"), "partner x W3 is missing"),
    ("expand_kv_heads", lambda: _expand("tile"), "tiled the whole stack"),
    ("expand_kv_heads", lambda: _expand("sequence"), "along the sequence axis"),
    ("expand_kv_heads", lambda: _expand("features"), "along the feature axis"),
    ("expand_kv_heads", lambda: _expand("kv_heads"), "num_kv_heads times"),
    ("window_mask", lambda: _window("one_more"), "window \\+ 1"),
    ("window_mask", lambda: _window("blocked"), "marks the blocked positions"),
    ("window_mask", lambda: _window("no_self"), "hides the query's own position"),
    ("window_mask", lambda: _window("two_sided"), "must stay causal"),
    ("window_mask", lambda: _window("square"), r"of shape \(1, 1, length, length\).* has shape \(6, 6\)"),
    ("fixed_online_attention", lambda: _online("original"), "original bug"),
    ("fixed_online_attention", lambda: _online("sum"), "running sum of exponentials was not rescaled"),
    ("fixed_online_attention", lambda: _online("both"), "neither the running sum"),
    ("permute_for_half_split", lambda: _permute("whole"), "mixing the heads"),
    ("permute_for_half_split", lambda: _permute("inverse"), "inverse permutation"),
    ("permute_for_half_split", lambda: _permute("rows"), "reordered its rows"),
    ("gqa_cache_bytes", lambda: _cache("query_heads"), "counted every query head"),
    ("gqa_cache_bytes", lambda: _cache("keys_only"), "only the keys"),
    ("gqa_cache_bytes", lambda: _cache("numbers"), "numbers, not bytes"),
]
#: Mistakes that only an input the text names exposes: float16 values above 256, an offset > 0.
NAMED_INPUTS = [
    ("rms_norm", lambda: _rms_norm("float16"), "overflows to infinity"),
    ("apply_rope", lambda: _apply_rope("no_offset"), "ignored the offset"),
]
#: Results of another type than the one the text states; each message quotes the sentence it breaks.
STATED_TYPES = [
    ("rms_norm", lambda: _rms_norm("float32_result"), "the text says: x is a NumPy array; return .* with the shape "
     r"and the dtype of x; rms_norm\(x \(2, 3, 8\) float16.* returned float32, not float16"),
    ("rotate_half", lambda: _rotate_half("list"), r"the text says: return \(-x2, x1\) joined along the last axis, "
     "a NumPy array of the shape of x\\) should be a NumPy array; got list"),
    ("apply_rope", lambda: _apply_rope("list"), r"the text says: return x \* cos \+ rotate_half\(x\) \* sin, a "
     "NumPy array of the shape of x\\) should be a NumPy array; got list"),
    ("swiglu_torch", lambda: _swiglu_torch("numpy"), "the text says: return a tensor of your framework through "
     r"which gradients reach x and the three weights\) should be a torch.Tensor; got ndarray"),
    ("swiglu_keras", lambda: _swiglu_keras("numpy"), "the text says: return a tensor of your framework through "
     r"which gradients reach x and the three weights\) should be a Keras tensor"),
    ("expand_kv_heads", lambda: _expand("list"), r"the text says: return a NumPy array of shape \(batch, "
     r"num_kv_heads \* group, seq_len, head_dim\)\) should be a NumPy array; got list"),
    ("window_mask", lambda: _window("int"), r"the text says: returns a boolean NumPy array of shape \(1, 1, length, "
     r"length\) \(True = may attend\); window_mask\(6, 3\) has dtype int"),
    ("fixed_online_attention", lambda: _online("list"), r"the text says: return a NumPy array of shape \(batch, "
     r"query_len, d_v\)\) should be a NumPy array; got list"),
    ("permute_for_half_split", lambda: _permute("list"), "the text says: return a NumPy array, the matrix with the "
     r"columns of each head reordered\) should be a NumPy array; got list"),
    ("gqa_cache_bytes", lambda: _cache("gib"), r"the text says: gqa_cache_bytes\(num_layers=2, \.\.\.\) "
     r"\(returns, as an int, the bytes\) is an int; got float"),
]
CH09_MISTAKES += NAMED_INPUTS + STATED_TYPES
MISTAKE_CLASSES = {"an input the text names": NAMED_INPUTS, "a type the text states": STATED_TYPES}


@pytest.mark.parametrize("exercise_id, make, message", CH09_MISTAKES, ids=[f"{e}-{m}" for e, _, m in CH09_MISTAKES])
def test_typical_mistakes_are_named(exercise_id, make, message):
    with pytest.raises(CheckFailed, match=message):
        run_check(exercise_id, make())


def test_every_exercise_of_chapter_9_has_at_least_three_named_mistakes():
    ids = [e.id for e in exercises_for("09_modern_decoder")]
    assert len(ids) >= 10
    for exercise_id in ids:
        assert sum(m[0] == exercise_id for m in CH09_MISTAKES) >= 3, exercise_id


def test_the_find_the_bug_stub_of_chapter_9_runs_and_its_bug_is_named():
    from pathlib import Path

    from companion.notebook_code import load_definitions

    stubs = load_definitions(Path(__file__).resolve().parents[1] / "exercises" / "09_modern_decoder.md")
    with pytest.raises(CheckFailed, match="original bug"):
        run_check("fixed_online_attention", stubs["fixed_online_attention"])
