"""Scaled dot-product attention in Keras 3, written out step by step (``keras.ops`` only, so any backend)."""

from __future__ import annotations

import math

import keras
from keras import ops

from .masking import most_negative


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether ``shape`` broadcasts to ``target``; unknown (None) sizes are given the benefit of the doubt."""
    if len(shape) > len(target):
        return False
    aligned = zip(shape, target[len(target) - len(shape) :], strict=True)  # broadcasting aligns the trailing axes
    return all(s in (1, None) or t is None or s == t for s, t in aligned)


def check_mask(mask, shape: tuple) -> None:
    """Raise ValueError unless ``mask`` is None or a boolean tensor that broadcasts to ``shape`` (the scores')."""
    if mask is None:
        return
    dtype = keras.backend.standardize_dtype(mask.dtype)
    if dtype != "bool":
        raise ValueError(f"mask must be boolean (True = may attend); got dtype {dtype}")
    if not _broadcasts_to(tuple(mask.shape), tuple(shape)):
        raise ValueError(f"mask must be broadcastable to {tuple(shape)}; got shape {tuple(mask.shape)}")


def _check_inputs(q, k, v, mask) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if len(x.shape) < 2:
            raise ValueError(f"{name} must have shape (..., seq_len, depth); got shape {tuple(x.shape)}")
    if None not in (q.shape[-1], k.shape[-1]) and k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must have shape (..., key_len, d_k={q.shape[-1]}) like q; got shape {tuple(k.shape)}")
    if None not in (k.shape[-2], v.shape[-2]) and v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v must have shape (..., key_len={k.shape[-2]}, d_v) like k; got shape {tuple(v.shape)}")
    check_mask(mask, (*q.shape[:-2], q.shape[-2], k.shape[-2]))


def scaled_dot_product_attention(
    q, k, v, mask=None, return_weights: bool = False, dropout: float = 0.0, training: bool = False, seed=None
):
    """softmax(q k^T / sqrt(d_k)) v.

    Args:
        q: ``(..., query_len, d_k)``.
        k: ``(..., key_len, d_k)``.
        v: ``(..., key_len, d_v)``.
        mask: boolean, True = may attend, broadcastable to ``(..., query_len, key_len)``.
        return_weights: also return the attention weights.
        dropout: probability of dropping an attention weight, applied only when ``training``.
        training: whether dropout is active.
        seed: an int or a ``keras.random.SeedGenerator`` for the dropout (a layer passes its own generator).

    Returns:
        ``out (..., query_len, d_v)``, or ``(out, weights (..., query_len, key_len))`` when ``return_weights``.
        The weights are those before dropout: each row sums to 1.
    """
    _check_inputs(q, k, v, mask)
    # Dividing by sqrt(d_k) keeps the scores' variance near 1 whatever d_k is, so the softmax does not saturate.
    scores = ops.matmul(q, ops.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])  # (..., query_len, key_len)
    if mask is not None:
        # The most negative finite value *of the scores' dtype*: -1e9 would overflow to -inf in float16, and -inf
        # makes a fully masked row 0/0 = NaN. With a finite fill that row is uniform and its output finite.
        scores = ops.where(mask, scores, ops.cast(most_negative(scores.dtype), scores.dtype))
    if scores.shape[-1] == 1:
        # A single key gets weight 1 whatever its score (keras.ops.softmax would also warn about a size-1 axis).
        weights = ops.ones_like(scores)
    else:
        weights = ops.softmax(scores, axis=-1)
    dropped = keras.random.dropout(weights, dropout, seed=seed) if training and dropout > 0 else weights
    out = ops.matmul(dropped, v)
    return (out, weights) if return_weights else out
