"""Checks for chapter 9, "Today's decoder"."""

from __future__ import annotations

import numpy as np

from companion.checks import CheckFailed, call, exercise, expect_close, expect_equal, rng, to_numpy
from companion.checks.tracks import (
    ATTENTION_SHORTCUTS,
    converter,
    expect_answer_type,
    expect_differentiable,
    expect_type,
    tolerance,
)
from companion.reference.attention import scaled_dot_product_attention
from companion.reference.modern import interleave_permutation, rotary_embedding_interleaved

CHAPTER = "09_modern_decoder"
#: Keras Hub and Hugging Face transformers implement every block of this chapter: no answer may use them. The
#: source scan matches a name exactly (``keras_hub.layers`` also catches ``keras_hub.layers.Anything`` written
#: out, and ``from keras_hub import layers``); the classes and functions listed are also tripwires in the
#: student's process, whatever path reached them.
KERAS_HUB_SHORTCUTS = ("keras_hub.layers", "keras_hub.models", "keras_hub.src", "keras_hub.layers.RotaryEmbedding",
                       "keras_hub.layers.RMSNormalization")
_LLAMA = "transformers.models.llama.modeling_llama"
TRANSFORMERS_SHORTCUTS = ("transformers.models", "transformers.LlamaForCausalLM", "transformers.LlamaModel",
                          f"{_LLAMA}.LlamaRMSNorm", f"{_LLAMA}.LlamaRotaryEmbedding", f"{_LLAMA}.rotate_half",
                          f"{_LLAMA}.apply_rotary_pos_emb", f"{_LLAMA}.repeat_kv", f"{_LLAMA}.LlamaMLP")
LIBRARY_SHORTCUTS = KERAS_HUB_SHORTCUTS + TRANSFORMERS_SHORTCUTS
RMS_NORM_SHORTCUTS = ("torch.nn.functional.rms_norm", "torch.nn.RMSNorm", "keras.ops.rms_normalization",
                      "keras.layers.RMSNormalization", *LIBRARY_SHORTCUTS)

# ---------------------------------------------------------------------------------------------------------------
# Exercise 1: RMSNorm
# ---------------------------------------------------------------------------------------------------------------


def _rms(x, weight, eps, centre=False, eps_outside=False, gain=True, std=False):
    if centre:
        x = x - x.mean(-1, keepdims=True)
    square = x.var(-1, keepdims=True) if std else np.mean(x * x, axis=-1, keepdims=True)
    scale = np.sqrt(square) + eps if eps_outside else np.sqrt(square + eps)
    return x / scale * (weight if gain else 1.0)


@exercise(CHAPTER, "rms_norm", "x / sqrt(mean(x**2) + eps) * weight over the last axis, float16 included",
          shortcuts=RMS_NORM_SHORTCUTS)
def check_rms_norm(rms_norm) -> None:
    generator = rng(90)
    for shape, eps, offset, dtype in [((2, 5, 8), 1e-6, 0.0, np.float64), ((3, 4), 0.5, 2.0, np.float64),
                                      ((1, 1, 6), 1e-2, 3.0, np.float32), ((4, 16), 0.1, 1.0, np.float64)]:
        x = (generator.standard_normal(shape) * 0.5 + offset).astype(dtype)
        weight = (1 + 0.5 * generator.standard_normal(shape[-1])).astype(dtype)
        answer = call(rms_norm, x.copy(), weight.copy(), eps)
        expect_close(
            answer,
            _rms(x, weight, eps),
            f"rms_norm(x {shape}, weight ({shape[-1]},), eps={eps})",
            mistakes={
                "the text says: LayerNorm without the mean; yours subtracted the mean first (that is LayerNorm's "
                "centring, which RMSNorm drops)": _rms(x, weight, eps, centre=True),
                "the text says: sqrt(mean(x**2) + eps); yours used the variance (mean removed) instead of the mean "
                "square": _rms(x, weight, eps, std=True),
                "the text says: eps goes inside the square root; yours added it after the square root": _rms(
                    x, weight, eps, eps_outside=True),
                "the text says: times weight; the learned gain is missing": _rms(x, weight, eps, gain=False),
            },
            atol=1e-7 if dtype == np.float64 else 1e-5,
        )
        what = f"rms_norm(x {shape} {np.dtype(dtype).name}, weight ({shape[-1]},), eps={eps})"
        expect_type(answer, "numpy", f"{what} (the text says: {RMS_NORM_TYPE})", "float")
        _expect_dtype_of_x(answer, np.dtype(dtype), what)
    # Half precision: squares of numbers above 256 do not fit in float16 (largest 65504).
    x = (generator.standard_normal((2, 3, 8)) * 400).astype(np.float16)
    weight = (1 + 0.3 * generator.standard_normal(8)).astype(np.float16)
    answer = call(rms_norm, x.copy(), weight.copy(), 1e-6)
    what = "rms_norm(x (2, 3, 8) float16 with values in the hundreds, weight float16, eps=1e-6)"
    with np.errstate(over="ignore", invalid="ignore"):
        overflowed = (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float16(1e-6)) * weight)
    expect_close(
        to_numpy(answer).astype(np.float64),
        _rms(x.astype(np.float64), weight.astype(np.float64), 1e-6),
        what,
        mistakes={"the text says: compute the mean square in float32 for float16 inputs; in float16, x * x "
                  "overflows to infinity above 256 and every output becomes 0": overflowed.astype(np.float64)},
        atol=1e-2, rtol=1e-2,
    )
    _expect_dtype_of_x(answer, np.dtype(np.float16), what)


#: The sentence of exercise 1 that names the type of the result.
RMS_NORM_TYPE = "x is a NumPy array; return ... with the shape and the dtype of x"


def _expect_dtype_of_x(answer, dtype: np.dtype, what: str) -> None:
    got = to_numpy(answer).dtype
    if got != dtype:
        raise CheckFailed(f"the text says: {RMS_NORM_TYPE}; {what} returned {got}, not {dtype.name}. Likely: the "
                          "result kept the dtype it was computed in (cast the result back)")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 2: rotate_half
# ---------------------------------------------------------------------------------------------------------------


def _halves(x):
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


@exercise(CHAPTER, "rotate_half", "(x1, x2) -> (-x2, x1) on the two halves of the last axis",
          shortcuts=LIBRARY_SHORTCUTS)
def check_rotate_half(rotate_half) -> None:
    generator = rng(91)
    for shape in [(4,), (2, 3, 8), (1, 2, 5, 16), (3, 2)]:
        x = generator.standard_normal(shape)
        x1, x2 = _halves(x)
        answer = call(rotate_half, x.copy())
        swapped_pairs = np.empty_like(x)
        swapped_pairs[..., 0::2], swapped_pairs[..., 1::2] = -x[..., 1::2], x[..., 0::2]
        expect_close(
            answer,
            np.concatenate([-x2, x1], axis=-1),
            f"rotate_half(x {shape})",
            mistakes={
                "the text says: (x1, x2) -> (-x2, x1); your sign is on the wrong half ((x2, -x1) turns the other way)":
                    np.concatenate([x2, -x1], axis=-1),
                "the text says: (x1, x2) -> (-x2, x1); the minus sign is missing (a swap is a reflection, not a "
                "rotation)": np.concatenate([x2, x1], axis=-1),
                "the text says: the two halves of the last axis; yours rotated neighbouring pairs (x0, x1), (x2, "
                "x3), ... (the interleaved layout)": swapped_pairs,
            },
            atol=1e-12,
        )
        expect_type(answer, "numpy", f"rotate_half(x {shape}) (the text says: return (-x2, x1) joined along the last "
                    "axis, a NumPy array of the shape of x)", "float")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 3: rotary position embedding
# ---------------------------------------------------------------------------------------------------------------


def _rope(x, offset, base, exponent=2, sign=1, use_offset=True):
    head_dim = x.shape[-1]
    positions = np.arange(offset if use_offset else 0, (offset if use_offset else 0) + x.shape[-2])
    frequencies = base ** (-exponent * np.arange(head_dim // 2) / head_dim)
    angles = positions[:, None] * frequencies[None, :]
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))
    x1, x2 = _halves(x)
    return x * cos + sign * np.concatenate([-x2, x1], axis=-1) * sin


@exercise(CHAPTER, "apply_rope", "rotate the half-split pairs of x by position * base**(-2i / head_dim)",
          shortcuts=LIBRARY_SHORTCUTS)
def check_apply_rope(apply_rope) -> None:
    generator = rng(92)
    for shape, offset, base in [((1, 2, 5, 8), 0, 10000.0), ((2, 1, 3, 4), 7, 10000.0), ((6, 16), 2, 100.0),
                                ((1, 1, 1, 6), 30, 500.0)]:
        x = generator.standard_normal(shape)
        answer = call(apply_rope, x.copy(), offset, base)
        mistakes = {
            "the text says: pair i turns by base**(-2i / head_dim); yours used base**(-i / head_dim)": _rope(
                x, offset, base, exponent=1),
            "the text says: x * cos + rotate_half(x) * sin; your rotation turns the wrong way (sign of sin)": _rope(
                x, offset, base, sign=-1),
            "the text says: the pairs (x_i, x_{i + head_dim/2}); yours rotated neighbouring pairs (the interleaved "
            "layout)": rotary_embedding_interleaved(x, offset, base),
        }
        if offset:
            mistakes["the text says: row t sits at position offset + t; yours ignored the offset (a cached "
                     "generation would rotate every new token as if it were the first)"] = _rope(
                x, offset, base, use_offset=False)
        expect_close(answer, _rope(x, offset, base), f"apply_rope(x {shape}, offset={offset}, base={base})",
                     mistakes=mistakes, atol=1e-9)
        expect_type(answer, "numpy", f"apply_rope(x {shape}, offset={offset}, base={base}) (the text says: return "
                    "x * cos + rotate_half(x) * sin, a NumPy array of the shape of x)", "float")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 4: SwiGLU, in PyTorch and in Keras
# ---------------------------------------------------------------------------------------------------------------


def _silu(z):
    return z / (1 + np.exp(-z))


def _swiglu(x, w1, w2, w3, gate=_silu, swap=False, gated=True):
    a, b = (x @ w3, x @ w1) if swap else (x @ w1, x @ w3)
    return ((gate(a) * b) if gated else gate(a)) @ w2


def _check_swiglu(swiglu, track: str) -> None:
    name = f"swiglu_{track}"
    generator = rng(93)
    for batch, length, d_model, d_ff in [(2, 3, 4, 6), (1, 5, 8, 16), (3, 1, 6, 5)]:
        x = generator.standard_normal((batch, length, d_model)).astype(np.float32)
        w1, w3 = (generator.standard_normal((d_model, d_ff)).astype(np.float32) for _ in range(2))
        w2 = generator.standard_normal((d_ff, d_model)).astype(np.float32)
        args = converter(track)(x, w1, w2, w3)
        answer = call(swiglu, *args)
        x64, w164, w264, w364 = (a.astype(np.float64) for a in (x, w1, w2, w3))
        expect_close(
            answer,
            _swiglu(x64, w164, w264, w364),
            f"{name}(x {x.shape}, w1 {w1.shape}, w2 {w2.shape}, w3 {w3.shape})",
            mistakes={
                "the text says: silu(x W1) * (x W3); yours used ReLU instead of SiLU": _swiglu(
                    x64, w164, w264, w364, gate=lambda z: np.maximum(z, 0)),
                "the text says: silu(z) = z * sigmoid(z); yours used sigmoid(z) alone (that is GLU's gate)": _swiglu(
                    x64, w164, w264, w364, gate=lambda z: 1 / (1 + np.exp(-z))),
                "the text says: the SiLU goes on x W1 and multiplies x W3; yours put it on x W3": _swiglu(
                    x64, w164, w264, w364, swap=True),
                "the text says: silu(x W1) multiplied element by element by x W3; the gate's partner x W3 is "
                "missing": _swiglu(x64, w164, w264, w364, gated=False),
            },
            **tolerance(track),
        )
        expect_type(answer, track, f"{name}(x, w1, w2, w3) (the text says: return a tensor of your framework through "
                    "which gradients reach x and the three weights)", "float")
        expect_differentiable(swiglu, args, f"{name}(x, w1, w2, w3)", (0, 1, 2, 3), track=track)


@exercise(CHAPTER, "swiglu_torch", "(silu(x W1) * x W3) W2, in PyTorch", track="torch",
          shortcuts=LIBRARY_SHORTCUTS)
def check_swiglu_torch(swiglu_torch) -> None:
    _check_swiglu(swiglu_torch, "torch")


@exercise(CHAPTER, "swiglu_keras", "(silu(x W1) * x W3) W2, in Keras", track="keras",
          shortcuts=LIBRARY_SHORTCUTS)
def check_swiglu_keras(swiglu_keras) -> None:
    _check_swiglu(swiglu_keras, "keras")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 5: repeating the key/value heads
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "expand_kv_heads", "repeat each key/value head for the group of query heads that reads it",
          shortcuts=LIBRARY_SHORTCUTS)
def check_expand_kv_heads(expand_kv_heads) -> None:
    generator = rng(94)
    for shape, group in [((1, 2, 3, 4), 2), ((2, 3, 2, 2), 4), ((1, 1, 5, 3), 6), ((2, 4, 1, 2), 1),
                         ((1, 2, 2, 2), 3)]:
        x = generator.standard_normal(shape)
        answer = call(expand_kv_heads, x.copy(), group)
        mistakes = {
            "the text says: query head h reads key/value head h // group, so each head is repeated group times in "
            "place; yours tiled the whole stack (head h got h % num_kv_heads)": np.tile(x, (1, group, 1, 1)),
            "the text says: repeat along the head axis (axis 1); yours repeated along the sequence axis": np.repeat(
                x, group, axis=2),
            "the text says: repeat along the head axis (axis 1); yours repeated along the feature axis": np.repeat(
                x, group, axis=3),
        }
        if shape[1] != group:
            mistakes["the text says: repeat each head group times; yours repeated it num_kv_heads times"] = np.repeat(
                x, shape[1], axis=1)
        expect_close(answer, np.repeat(x, group, axis=1), f"expand_kv_heads(x {shape}, group={group})",
                     mistakes=mistakes if group > 1 else {}, atol=0)
        expect_type(answer, "numpy", f"expand_kv_heads(x {shape}, group={group}) (the text says: return a NumPy "
                    "array of shape (batch, num_kv_heads * group, seq_len, head_dim))", "float")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 6: the sliding-window mask
# ---------------------------------------------------------------------------------------------------------------


def _band(length, low, high):
    """bool (1, 1, length, length): key j allowed when low <= i - j <= high."""
    offset = np.arange(length)[:, None] - np.arange(length)[None, :]
    return ((offset >= low) & (offset <= high))[None, None]


@exercise(CHAPTER, "window_mask", "bool (1, 1, n, n): query i sees keys i - window + 1 .. i (True = may attend)",
          shortcuts=LIBRARY_SHORTCUTS)
def check_window_mask(window_mask) -> None:
    for length, window in [(6, 3), (5, 1), (4, 10), (8, 4), (7, 2)]:
        answer = call(window_mask, length, window)
        expected = _band(length, 0, window - 1)
        values = to_numpy(answer)
        what = f"window_mask({length}, {window})"
        if values.dtype != bool:
            raise CheckFailed(f"the text says: {WINDOW_MASK_TYPE}; {what} has dtype {values.dtype}")
        expect_type(answer, "numpy", f"{what} (the text says: {WINDOW_MASK_TYPE})", "bool")
        if values.shape != (1, 1, length, length):
            raise CheckFailed(f"the text says: {WINDOW_MASK_TYPE}; {what} has shape {values.shape}. Likely: the "
                              "two leading axes of size 1 (batch and heads, broadcast by attention) are missing")
        mistakes = {
            "the text says: the window latest positions, itself included; yours lets each query see window + 1 "
            "keys (an off-by-one)": _band(length, 0, window),
            "the text says: True = may attend; yours marks the blocked positions (the convention of "
            "torch.nn.MultiheadAttention)": ~expected,
            "the text says: the window latest positions, itself included; yours hides the query's own position":
                _band(length, 1, window),
            "the text says: query i may attend to keys i - window + 1 .. i; yours also lets it see the next "
            "positions (the window must stay causal)": _band(length, -(window - 1), window - 1),
        }
        if window == 1:
            mistakes.pop("the text says: the window latest positions, itself included; yours hides the query's own "
                         "position")
        expect_equal(values.tolist(), expected.tolist(), what,
                     mistakes={m: w.tolist() for m, w in mistakes.items() if not np.array_equal(w, expected)})


#: The sentence of exercise 6 that names the type of the result.
WINDOW_MASK_TYPE = "returns a boolean NumPy array of shape (1, 1, length, length) (True = may attend)"


# ---------------------------------------------------------------------------------------------------------------
# Exercise 7: find the bug in the online softmax
# ---------------------------------------------------------------------------------------------------------------


def _online(q, k, v, block_size, rescale_sum=True, rescale_acc=True):
    scale = 1 / np.sqrt(q.shape[-1])
    m = np.full((*q.shape[:-1], 1), -np.inf)
    total = np.zeros((*q.shape[:-1], 1))
    acc = np.zeros((*q.shape[:-1], v.shape[-1]))
    for start in range(0, k.shape[-2], block_size):
        s = q @ np.swapaxes(k[..., start:start + block_size, :], -1, -2) * scale
        new = np.maximum(m, s.max(-1, keepdims=True))
        correction = np.exp(m - new)
        p = np.exp(s - new)
        total = (total * correction if rescale_sum else total) + p.sum(-1, keepdims=True)
        acc = (acc * correction if rescale_acc else acc) + p @ v[..., start:start + block_size, :]
        m = new
    return acc / total


@exercise(CHAPTER, "fixed_online_attention", "find the bug: attention block by block with a running max and sum",
          shortcuts=ATTENTION_SHORTCUTS + LIBRARY_SHORTCUTS)
def check_fixed_online_attention(fixed_online_attention) -> None:
    generator = rng(95)
    for (batch, q_len, k_len, depth), block in [((1, 3, 8, 4), 3), ((2, 4, 9, 2), 4), ((1, 2, 5, 3), 1),
                                                ((2, 5, 6, 4), 6)]:
        q = generator.standard_normal((batch, q_len, depth)) * 3  # large scores: the maximum moves from block to block
        k = generator.standard_normal((batch, k_len, depth))
        q[:, 0] = 6 * k[:, -1]  # a query whose largest score sits in the last block
        v = generator.standard_normal((batch, k_len, depth + 1))
        answer = call(fixed_online_attention, q.copy(), k.copy(), v.copy(), block)
        expected, _ = scaled_dot_product_attention(q, k, v)
        mistakes = {
            "the old terms must shrink by exp(m - m') when the maximum grows; the weighted sum of values was not "
            "rescaled, which was the original bug": _online(q, k, v, block, rescale_acc=False),
            "the old terms must shrink by exp(m - m') when the maximum grows; your running sum of exponentials was "
            "not rescaled": _online(q, k, v, block, rescale_sum=False),
            "the old terms must shrink by exp(m - m') when the maximum grows; neither the running sum nor the "
            "weighted values were rescaled": _online(q, k, v, block, rescale_sum=False, rescale_acc=False),
        }
        expect_close(answer, expected, f"fixed_online_attention(q {q.shape}, k {k.shape}, v {v.shape}, "
                     f"block_size={block})", mistakes=mistakes, atol=1e-9)
        expect_type(answer, "numpy", f"fixed_online_attention(q {q.shape}, ...) (the text says: return a NumPy array "
                    "of shape (batch, query_len, d_v))", "float")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 8: converting a checkpoint from the interleaved layout
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "permute_for_half_split",
          "reorder each head's output columns of W (even ones, then odd ones) for the half-split layout",
          shortcuts=LIBRARY_SHORTCUTS)
def check_permute_for_half_split(permute_for_half_split) -> None:
    generator = rng(96)
    for d_model, num_heads, head_dim in [(4, 2, 4), (6, 3, 2), (8, 1, 8), (5, 2, 6)]:
        w = generator.standard_normal((d_model, num_heads * head_dim))
        answer = call(permute_for_half_split, w.copy(), num_heads)
        per_head = interleave_permutation(head_dim)
        order = np.concatenate([h * head_dim + per_head for h in range(num_heads)])
        whole = interleave_permutation(num_heads * head_dim)
        inverse = np.argsort(per_head)
        mistakes = {
            "the text says: within each head; yours took the even and odd columns of the whole matrix, mixing the "
            "heads": w[:, whole],
            "the text says: even columns first, then odd ones; yours applied the inverse permutation (the "
            "conversion from half-split back to interleaved)": w[:, np.concatenate(
                [h * head_dim + inverse for h in range(num_heads)])],
            "the text says: reorder the output columns of W (its last axis); yours reordered its rows (the input "
            "features)": w[order] if d_model == w.shape[1] else None,
        }
        expect_close(answer, w[:, order], f"permute_for_half_split(w {w.shape}, num_heads={num_heads})",
                     mistakes={m: x for m, x in mistakes.items() if x is not None and not np.array_equal(
                         x, w[:, order])}, atol=0)
        expect_type(answer, "numpy", f"permute_for_half_split(w {w.shape}, num_heads={num_heads}) (the text says: "
                    "return a NumPy array, the matrix with the columns of each head reordered)", "float")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 9: the cache with grouped-query attention
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "gqa_cache_bytes", "predict: key/value cache bytes with num_kv_heads key/value heads",
          shortcuts=LIBRARY_SHORTCUTS)
def check_gqa_cache_bytes(gqa_cache_bytes) -> None:
    # A 4-byte case first: with 2 bytes per number, "only the keys" and "numbers, not bytes" give the same count.
    for layers, heads, kv_heads, head_dim, tokens, size in [(2, 4, 1, 16, 10, 4), (80, 64, 8, 128, 4096, 2),
                                                           (32, 32, 32, 128, 2048, 2), (24, 16, 4, 64, 8192, 2),
                                                           (6, 8, 2, 64, 512, 4)]:
        answer = call(gqa_cache_bytes, layers, heads, kv_heads, head_dim, tokens, size)
        expect_answer_type(answer, "int", f"gqa_cache_bytes(num_layers={layers}, ...) (returns, as an int, the "
                           "bytes)")
        right = 2 * layers * kv_heads * head_dim * tokens * size
        mistakes = {
            "the text says: the cache stores the key/value heads only; yours counted every query head":
                2 * layers * heads * head_dim * tokens * size,
            "the text says: a key and a value per head, token and layer; yours counted only the keys": right // 2,
            "the text says: bytes, with bytes_per_number bytes per number; yours counts numbers, not bytes":
                right // size,
        }
        expect_equal(int(answer), right, f"gqa_cache_bytes(num_layers={layers}, num_heads={heads}, num_kv_heads="
                     f"{kv_heads}, head_dim={head_dim}, seq_len={tokens}, bytes_per_number={size})",
                     mistakes={m: w for m, w in mistakes.items() if w != right})
