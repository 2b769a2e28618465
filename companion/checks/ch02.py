"""Checks for chapter 2, "Attention".

Holds the variants of attention that chapters 3 and 4 reuse; the track helpers live in
:mod:`companion.checks.tracks`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from companion import reference
from companion.checks import CheckFailed, call, exercise, expect_close, expect_equal, rng

CHAPTER = "02_attention"
ROW_SUMS = "the text says: row i of P (query i) sums to 1; the softmax ran over the wrong axis"


from companion.checks.tracks import (  # noqa: E402, F401 - one home for the helpers; re-exported for old imports
    ATTENTION_SHORTCUTS,
    converter,
    expect_answer_dict,
    expect_answer_type,
    expect_differentiable,
    expect_number,
    expect_type,
    output_pair,
    to_keras,
    to_torch,
    tolerance,
)


def softmax_axis(scores: np.ndarray, axis: int) -> np.ndarray:
    return reference.softmax(scores, axis=axis)


def attention_variants(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None) -> dict:
    """Outputs and weights of scaled dot-product attention and of its typical wrong versions, by mistake message.

    Returns ``{message: (output, weights)}``; the right answer is under the key ``None``.
    """
    d_k, d_v = q.shape[-1], v.shape[-1]
    raw = q @ np.swapaxes(k, -1, -2)
    fill = np.finfo(raw.dtype).min

    def finish(scores: np.ndarray, axis: int = -1, values: np.ndarray = v) -> tuple[np.ndarray, np.ndarray]:
        if mask is not None:
            scores = np.where(mask, scores, fill)
        weights = softmax_axis(scores, axis)
        return weights @ values, weights

    variants = {
        None: finish(raw / np.sqrt(d_k)),
        "the text says: weights = softmax(q k^T / sqrt(d_k)); the scale is missing: divide the scores q k^T by "
        "sqrt(d_k) before the softmax": finish(raw),
        "the text says: divide by sqrt(d_k); the scores were divided by d_k, not by its square root": finish(raw / d_k),
        "the text says: weights of shape (..., query_len, key_len), softmax over the keys; softmax over the wrong "
        "axis: each row (one query) must sum to 1, so take the softmax over the keys (the last axis)":
            finish(raw / np.sqrt(d_k), axis=-2),
    }
    if d_v != d_k:
        variants["the text says: divide by sqrt(d_k); the scale uses d_v, but d_k is the width of the queries and "
                 "keys"] = finish(raw / np.sqrt(d_v))
        variants["the text says: output = weights v; the output blends the keys, not the values"] = finish(
            raw / np.sqrt(d_k), values=k
        )
    if mask is None:
        transposed = k @ np.swapaxes(q, -1, -2)  # (..., key_len, query_len)
        variants["the text says: the weights have shape (..., query_len, key_len); the scores are k q^T, compute "
                 "q k^T"] = (
            None,
            softmax_axis(transposed / np.sqrt(d_k), -1),
        )
    return variants


def check_attention_pair(answer: Any, variants: dict, name: str, atol: float = 1e-5, rtol: float = 1e-4,
                         track: str | None = None) -> None:
    """Compare a student's ``(output, weights)`` with the right pair; name the mistake whose pair it matches.

    With ``track``, both must also be float tensors of that track (checked after the values, so that a known
    mistake is named first).
    """
    out, weights = output_pair(answer, name)
    right_out, right_weights = variants[None]
    weight_mistakes = {m: w for m, (_, w) in variants.items() if m is not None}
    expect_close(weights, right_weights, f"the weights of {name}", mistakes=weight_mistakes, atol=atol, rtol=rtol)
    out_mistakes = {m: o for m, (o, _) in variants.items() if m is not None and o is not None}
    expect_close(out, right_out, f"the output of {name}", mistakes=out_mistakes, atol=atol, rtol=rtol)
    if track is not None:
        expect_type(answer[0], track, f"the output of {name}", "float")
        expect_type(answer[1], track, f"the weights of {name}", "float")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 1: one number per word
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "scalar_self_attention", "self-attention with d = 1: scalars x_i, w_q, w_k, w_v -> (h, P)")
def check_scalar_self_attention(scalar_self_attention) -> None:
    generator = rng(20)
    for n in (7, 4, 1):
        x = np.round(generator.normal(0, 1.2, size=n), 2)
        w_q, w_k, w_v = (float(np.round(w, 2)) for w in generator.normal(0, 1, size=3))
        q, k, v = x * w_q, x * w_k, x * w_v
        scores = np.outer(q, k)
        weights = reference.softmax(scores, axis=-1)
        name = f"scalar_self_attention(x of length {n}, w_q={w_q}, w_k={w_k}, w_v={w_v})"
        h, p = output_pair(call(scalar_self_attention, x.copy(), w_q, w_k, w_v), name, "h", "P")
        expect_close(
            p,
            weights,
            f"P of {name}",
            mistakes={
                ROW_SUMS: reference.softmax(scores, axis=0),
                "the scores multiply a query by a query; as in the chapter, score(i, j) = q_i * k_j":
                    reference.softmax(np.outer(q, q)),
                "the text says: P is the matrix of attention WEIGHTS, each row summing to 1; the scores were not "
                "turned into probabilities: apply a softmax to each row": scores,
                "the text says: q_i = x_i * w_q and k_j = x_j * w_k; the scores use x directly": reference.softmax(
                    np.outer(x, x)
                ),
            },
        )
        expect_close(
            h,
            weights @ v,
            f"h of {name}",
            mistakes={
                "the text says: h holds the outputs, one per query: h_i mixes the values with row i of P, "
                "h = P @ v, not P.T @ v": weights.T @ v,
                "the text says: the values are v_j = x_j * w_v; h blends the inputs x instead": weights @ x,
            },
        )
    for n, m in [(4, 4), (3, 5), (4, 1), (1, 3)]:  # a variant: cross-attention, keys and values from y
        x = np.round(generator.normal(0, 1.2, size=n), 2)
        y = np.round(generator.normal(0, 1.2, size=m), 2)
        w_q, w_k, w_v = (float(np.round(w, 2)) for w in generator.normal(0, 1, size=3))
        q, k, v = x * w_q, y * w_k, y * w_v
        scores = np.outer(q, k)
        weights = reference.softmax(scores, axis=-1)
        name = f"scalar_self_attention(x of length {n}, w_q={w_q}, w_k={w_k}, w_v={w_v}, y of length {m})"
        h, p = output_pair(call(scalar_self_attention, x.copy(), w_q, w_k, w_v, y=y.copy()), name, "h", "P")
        expect_close(p, weights, f"P of {name}", mistakes={
            "the text says: with y, the keys come from y (k_j = y_j * w_k), the queries from x":
                reference.softmax(np.outer(q, x * w_k)) if n == m else None,
            ROW_SUMS: reference.softmax(scores, axis=0),
        })
        expect_close(h, weights @ v, f"h of {name}", mistakes={
            "the text says: with y, the values come from y (v_j = y_j * w_v)":
                weights @ (x * w_v) if n == m else None,
            "the text says: v_j = y_j * w_v; the values are not the keys": weights @ (y * w_k),
        })


# ---------------------------------------------------------------------------------------------------------------
# Exercise 2: scaled dot-product attention
# ---------------------------------------------------------------------------------------------------------------

ATTENTION_SHAPES = [  # (leading axes, query_len, key_len, d_k, d_v)
    ((), 3, 5, 4, 6),
    ((2,), 4, 4, 8, 8),
    ((2, 3), 5, 7, 16, 2),
]


def _check_attention(attention, track: str, name: str) -> None:
    generator = rng(21)
    for lead, n, m, d_k, d_v in ATTENTION_SHAPES:
        q = generator.standard_normal((*lead, n, d_k)).astype(np.float32) * 1.5
        k = generator.standard_normal((*lead, m, d_k)).astype(np.float32) * 1.5
        v = generator.standard_normal((*lead, m, d_v)).astype(np.float32)
        variants = attention_variants(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
        answer = call(attention, *converter(track)(q, k, v))
        check_attention_pair(answer, variants, f"{name}(q {q.shape}, k {k.shape}, v {v.shape})", **tolerance(track),
                             track=track)
        if track in ("torch", "keras"):
            expect_differentiable(attention, converter(track)(q, k, v), f"{name}(q {q.shape}, k, v)", (0, 1, 2), 0,
                                  track=track)


@exercise(CHAPTER, "attention_torch", "softmax(q k^T / sqrt(d_k)) v with its weights, in PyTorch", track="torch",
          shortcuts=ATTENTION_SHORTCUTS)
def check_attention_torch(attention_torch) -> None:
    _check_attention(attention_torch, "torch", "attention_torch")
    _check_attention_scale(attention_torch, "torch", "attention_torch")


@exercise(CHAPTER, "attention_keras", "softmax(q k^T / sqrt(d_k)) v with its weights, in Keras", track="keras",
          shortcuts=ATTENTION_SHORTCUTS)
def check_attention_keras(attention_keras) -> None:
    _check_attention(attention_keras, "keras", "attention_keras")
    _check_attention_scale(attention_keras, "keras", "attention_keras")


def _check_attention_scale(attention, track: str, name: str) -> None:
    """A variant: an optional ``scale`` that multiplies the scores instead of 1 / sqrt(d_k)."""
    generator = rng(24)
    for (lead, n, m, d_k, d_v), scale in zip(ATTENTION_SHAPES, (0.3, 1.0, 0.05), strict=True):
        q = generator.standard_normal((*lead, n, d_k)).astype(np.float32) * 1.5
        k = generator.standard_normal((*lead, m, d_k)).astype(np.float32) * 1.5
        v = generator.standard_normal((*lead, m, d_v)).astype(np.float32)
        q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
        raw = q64 @ np.swapaxes(k64, -1, -2)
        right = reference.softmax(raw * scale)
        what = f"the weights of {name}(q {q.shape}, k {k.shape}, v {v.shape}, scale={scale})"
        out, weights = output_pair(call(attention, *converter(track)(q, k, v), scale=scale), what)
        expect_close(weights, right, what, mistakes={
            "the text says: scale MULTIPLIES the scores (scale = 1 / sqrt(d_k) gives the default)":
                reference.softmax(raw / scale),
            "the text says: a given scale replaces 1 / sqrt(d_k); do not apply both":
                reference.softmax(raw * scale / np.sqrt(d_k)),
            "the text says: use the given scale; it was ignored": reference.softmax(raw / np.sqrt(d_k)),
        }, **tolerance(track))
        expect_close(out, right @ v64, f"the output of {name}(..., scale={scale})", **tolerance(track))


# ---------------------------------------------------------------------------------------------------------------
# Exercise 3: a self-attention layer with its own projections (256-wide input, 512-wide output)
# ---------------------------------------------------------------------------------------------------------------

LAYER_SIZES = [(256, 512, 10), (6, 4, 5), (16, 8, 3)]  # (d_in, d_out, seq_len)


def _projection_weights(generator: np.random.Generator, d_in: int, d_out: int) -> list[np.ndarray]:
    """Three seeded (d_in, d_out) matrices, in the x @ w convention, large enough to give peaked weights."""
    return [(generator.standard_normal((d_in, d_out)) * 1.5 / np.sqrt(d_in)).astype(np.float32) for _ in range(3)]


def _layer_variants(x: np.ndarray, weights: list[np.ndarray]) -> dict:
    x64 = x.astype(np.float64)
    q, k, v = (x64 @ w.astype(np.float64) for w in weights)
    variants = attention_variants(q, k, v)
    d_in = x.shape[-1]
    if d_in != q.shape[-1]:
        scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_in)
        p = reference.softmax(scores)
        variants[
            "the text says: divide by sqrt(d_k), where d_k = d_out is the width of the projected queries and keys "
            "(not d_in); the scores were divided by sqrt(d_in), the input width"
        ] = (p @ v, p)
    return variants


def _projections(layer: Any, kind: type, kind_name: str) -> list:
    """The layer's wq, wk and wv: three distinct objects of the framework class ``kind``."""
    projections = []
    for attribute in ("wq", "wk", "wv"):
        projection = getattr(layer, attribute, None)
        if not isinstance(projection, kind):
            raise CheckFailed(f"the text says: three projections named wq, wk and wv, each a {kind_name}; "
                              f"{attribute} is missing or is not one")
        projections.append(projection)
    if len({id(projection) for projection in projections}) < 3:
        raise CheckFailed(f"the text says: three projections named wq, wk and wv; they are the same {kind_name}: "
                          "create three separate ones")
    return projections


@exercise(CHAPTER, "SelfAttention_torch", "self-attention layer with wq, wk, wv of d_in -> d_out, in PyTorch", "torch",
          ATTENTION_SHORTCUTS)
def check_self_attention_torch(SelfAttention_torch) -> None:  # noqa: N803 (the student's class name)
    import torch

    generator = rng(22)
    for d_in, d_out, seq_len in LAYER_SIZES:
        layer = call(SelfAttention_torch, d_in, d_out)
        projections = _projections(layer, torch.nn.Linear, "torch.nn.Linear")
        for attribute, linear in zip(("wq", "wk", "wv"), projections, strict=True):
            shape = tuple(linear.weight.shape)
            if shape == (d_in, d_out) and d_in != d_out:
                raise CheckFailed(
                    f"the text says: each projection maps d_in features to d_out; {attribute} maps {d_out} -> {d_in} "
                    f"features: nn.Linear takes (in_features, out_features), so write nn.Linear({d_in}, {d_out})"
                )
            if shape != (d_out, d_in):
                raise CheckFailed(f"the text says: each projection maps d_in to d_out features, so {attribute}.weight "
                                  f"should have shape ({d_out}, {d_in}); got {shape}")
            if linear.bias is not None:
                raise CheckFailed(f"the text says: projections WITHOUT bias; {attribute} has one (use bias=False)")
        weights = _projection_weights(generator, d_in, d_out)
        with torch.no_grad():
            for linear, w in zip(projections, weights, strict=True):
                linear.weight.copy_(torch.from_numpy(w.T.copy()))  # torch stores (out, in)
        x = generator.standard_normal((2, seq_len, d_in)).astype(np.float32)
        answer = call(layer, torch.from_numpy(x))
        check_attention_pair(answer, _layer_variants(x, weights), f"SelfAttention_torch({d_in}, {d_out})(x)",
                             track="torch")


@exercise(CHAPTER, "SelfAttention_keras", "self-attention layer with wq, wk, wv of d_in -> d_out, in Keras", "keras",
          ATTENTION_SHORTCUTS)
def check_self_attention_keras(SelfAttention_keras) -> None:  # noqa: N803 (the student's class name)
    import keras

    generator = rng(22)
    for d_in, d_out, seq_len in LAYER_SIZES:
        layer = call(SelfAttention_keras, d_in, d_out)
        x = generator.standard_normal((2, seq_len, d_in)).astype(np.float32)
        call(layer, x)  # builds the Dense layers on inputs of width d_in
        projections = _projections(layer, keras.layers.Dense, "keras.layers.Dense")
        for attribute, dense in zip(("wq", "wk", "wv"), projections, strict=True):
            shape = tuple(dense.kernel.shape)
            if shape == (d_in, d_in) and d_in != d_out:
                raise CheckFailed(f"the text says: each projection maps d_in features to d_out; {attribute} outputs "
                                  f"{d_in} features: Dense({d_out})")
            if shape != (d_in, d_out):
                raise CheckFailed(f"the text says: each projection maps d_in to d_out features, so {attribute}.kernel "
                                  f"should have shape ({d_in}, {d_out}); got {shape}")
            if dense.bias is not None:
                raise CheckFailed(f"the text says: projections WITHOUT bias; {attribute} has one (use use_bias=False)")
        weights = _projection_weights(generator, d_in, d_out)
        for dense, w in zip(projections, weights, strict=True):
            dense.kernel.assign(w)
        answer = call(layer, x)
        what = f"SelfAttention_keras({d_in}, {d_out})(x)"
        check_attention_pair(answer, _layer_variants(x, weights), what, **tolerance("keras"), track="keras")


# ---------------------------------------------------------------------------------------------------------------
# Graded questions, find-the-bug, stretch
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "self_attention_numbers", "shapes and parameter count of a 256 -> 512 self-attention layer")
def check_self_attention_numbers(self_attention_numbers) -> None:
    answer = expect_answer_dict(call(self_attention_numbers), ("w_shape", "parameters", "weights_shape",
                                                                "output_shape"), "self_attention_numbers()")
    expect_equal(answer["w_shape"], (256, 512), "w_shape (the text says: as a matrix W with q = x W)",
                 mistakes={"that is torch's nn.Linear storage, (out, in); the text asks for W with q = x W, "
                           "(d_in, d_out)": (512, 256)})
    expect_equal(answer["parameters"], 3 * 256 * 512, "parameters (the text says: the three matrices, no bias)",
                 mistakes={"the projections have no bias (the text says so)": 3 * (256 * 512 + 512),
                           "count all three matrices, W_Q, W_K and W_V": 256 * 512})
    expect_equal(answer["weights_shape"], (1, 10, 10), "weights_shape",
                 mistakes={"the text says: the shape of the weights for x (1, 10, 256); they have one column per "
                           "key, not per feature: (batch, seq_len, seq_len)":
                           (1, 10, 512)})
    expect_equal(answer["output_shape"], (1, 10, 512), "output_shape",
                 mistakes={"the text says: 512-wide outputs; the output has the projected width d_out = 512, not "
                           "the input width": (1, 10, 256)})
    for key, kind in [("w_shape", "tuple"), ("parameters", "int"), ("weights_shape", "tuple"),
                      ("output_shape", "tuple")]:
        expect_answer_type(answer[key], kind, key)


@exercise(CHAPTER, "scale_for_variance", "the divisor that brings the variance of q . k back to 1")
def check_scale_for_variance(scale_for_variance) -> None:
    for variance, d_k in [(2.0, 64), (1.0, 64), (0.5, 16), (4.0, 9), (3.0, 1)]:
        expected = variance * np.sqrt(d_k)
        answer = call(scale_for_variance, variance, d_k)
        expect_answer_type(answer, "float", f"scale_for_variance({variance}, {d_k}) (a Python float)")
        expect_number(answer, expected, f"scale_for_variance({variance}, {d_k})", {
            "the text asks for the divisor that brings the variance back to 1: that is the standard deviation "
            "of q . k, variance * sqrt(d_k), not sqrt(d_k) alone": np.sqrt(d_k),
            "each term q_i k_i has variance variance**2 (a product of two independent entries), so q . k has "
            "variance variance**2 * d_k and the divisor is its square root": np.sqrt(variance * d_k),
            "that is the variance of q . k; divide by its square root (the standard deviation)": variance**2 * d_k,
        })


@exercise(CHAPTER, "fixed_attention_torch", "find the bug: batched attention in PyTorch", track="torch",
          shortcuts=ATTENTION_SHORTCUTS)
def check_fixed_attention_torch(fixed_attention_torch) -> None:
    _check_attention(fixed_attention_torch, "torch", "fixed_attention_torch")


@exercise(CHAPTER, "fixed_attention_keras", "find the bug: batched attention in Keras", track="keras",
          shortcuts=ATTENTION_SHORTCUTS)
def check_fixed_attention_keras(fixed_attention_keras) -> None:
    _check_attention(fixed_attention_keras, "keras", "fixed_attention_keras")


ADDITIVE_SHAPES = [(3, 5, 4, 6, 7, 2), (1, 1, 2, 3, 4, 5), (4, 6, 8, 8, 5, 3)]  # n, m, d_q, d_k, d_att, d_v


@exercise(CHAPTER, "additive_attention", "stretch: additive (Bahdanau) attention a . tanh(q W1 + k W2), in NumPy")
def check_additive_attention(additive_attention) -> None:
    generator = rng(23)
    for n, m, d_q, d_k, d_att, d_v in ADDITIVE_SHAPES:
        q, k = generator.standard_normal((n, d_q)), generator.standard_normal((m, d_k))
        v = generator.standard_normal((m, d_v))
        w1, w2 = generator.standard_normal((d_q, d_att)), generator.standard_normal((d_k, d_att))
        a = generator.standard_normal(d_att) * 1.5
        hidden = q[:, None, :] @ w1 + (k @ w2)[None]               # (n, m, d_att)
        scores = np.tanh(hidden) @ a
        weights = reference.softmax(scores, axis=-1)
        name = f"additive_attention(q {q.shape}, k {k.shape}, v {v.shape}, w1 {w1.shape}, w2 {w2.shape}, a)"
        result = call(additive_attention, q.copy(), k.copy(), v.copy(), w1.copy(), w2.copy(), a.copy())
        out, p = output_pair(result, name)
        expect_close(p, weights, f"the weights of {name}", mistakes={
            "the text says: the softmax runs over the keys (each row, one query, sums to 1)":
                reference.softmax(scores, axis=0) if n > 1 else None,
            "the text says: the score passes the sum through tanh before the dot product with a":
                reference.softmax(hidden @ a, axis=-1),
            "the text says: no scaling; additive scores are not divided by sqrt(d_att)":
                reference.softmax(scores / np.sqrt(d_att), axis=-1),
        })
        expect_close(out, weights @ v, f"the output of {name}",
                     mistakes={"the text says: the output blends the values, weights @ v": weights @ k[:, :d_v]
                               if d_k >= d_v else None})
        expect_type(result[0], "numpy", f"the output of {name} (the text says: float NumPy arrays)", "float")
