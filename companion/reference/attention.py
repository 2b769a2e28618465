"""Scaled dot-product attention in NumPy: the readable oracle the torch and keras versions are tested against."""

from __future__ import annotations

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis``; subtracting the maximum first keeps ``exp`` from overflowing."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def scaled_dot_product_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """softmax(q k^T / sqrt(d_k)) v.

    Args:
        q: ``(..., query_len, d_k)``.
        k: ``(..., key_len, d_k)``.
        v: ``(..., key_len, d_v)``.
        mask: boolean, True = may attend, broadcastable to ``(..., query_len, key_len)``.

    Returns:
        ``out (..., query_len, d_v)`` and ``weights (..., query_len, key_len)``.
    """
    d_k = q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_k)  # (..., query_len, key_len)
    if mask is not None:
        # The most negative finite number, not -inf: a row with every key masked then has equal scores, so it gets
        # uniform weights instead of 0/0 = NaN.
        scores = np.where(mask, scores, np.finfo(scores.dtype).min)
    weights = softmax(scores, axis=-1)
    return weights @ v, weights
