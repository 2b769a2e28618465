"""Multi-head attention in NumPy, with the projections passed in as a dict of arrays (the oracle)."""

from __future__ import annotations

import numpy as np

from companion.reference.attention import scaled_dot_product_attention


def multi_head_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    params: dict[str, np.ndarray],
    num_heads: int,
    mask: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Project, split into heads, attend per head, merge, project back.

    Args:
        query: ``(batch, query_len, d_model)``.
        key, value: ``(batch, key_len, d_model)``.
        params: ``wq, wk, wv, wo`` of shape ``(d_model, d_model)`` and ``bq, bk, bv, bo`` of shape ``(d_model,)``,
            used as ``x @ w + b``.
        num_heads: must divide ``d_model``.
        mask: boolean, True = may attend, broadcastable to ``(batch, num_heads, query_len, key_len)``.

    Returns:
        ``out (batch, query_len, d_model)`` and ``weights (batch, num_heads, query_len, key_len)``.
    """
    batch, query_len, d_model = query.shape
    d_head = d_model // num_heads

    def split_heads(x: np.ndarray) -> np.ndarray:
        # (batch, seq_len, d_model) -> (batch, seq_len, num_heads, d_head) -> (batch, num_heads, seq_len, d_head)
        return x.reshape(x.shape[0], x.shape[1], num_heads, d_head).transpose(0, 2, 1, 3)

    q = split_heads(query @ params["wq"] + params["bq"])
    k = split_heads(key @ params["wk"] + params["bk"])
    v = split_heads(value @ params["wv"] + params["bv"])
    heads, weights = scaled_dot_product_attention(q, k, v, mask)  # (batch, num_heads, query_len, d_head)
    merged = heads.transpose(0, 2, 1, 3).reshape(batch, query_len, d_model)
    return merged @ params["wo"] + params["bo"], weights
