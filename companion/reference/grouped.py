"""Grouped-query attention with rotary positions in NumPy (the oracle), and the size of a key/value cache.

``num_heads`` query heads share ``num_kv_heads`` key/value heads: query head ``h`` reads key/value head
``h // (num_heads // num_kv_heads)``. ``num_kv_heads == num_heads`` is ordinary multi-head attention (MHA),
``num_kv_heads == 1`` is multi-query attention (MQA).
"""

from __future__ import annotations

import numpy as np

from companion.reference.attention import scaled_dot_product_attention
from companion.reference.modern import rotary_embedding

__all__ = ["grouped_query_attention", "grouped_query_projections", "kv_cache_bytes"]


def grouped_query_projections(
    x: np.ndarray,
    params: dict[str, np.ndarray],
    num_heads: int,
    num_kv_heads: int,
    rope_base: float | None = 10000.0,
    offset: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``x`` ``(batch, seq_len, d_model)`` -> ``q`` ``(batch, num_heads, seq_len, head_dim)`` and ``k``, ``v``
    ``(batch, num_kv_heads, seq_len, head_dim)`` (what a cache stores), queries and keys rotated unless
    ``rope_base`` is None. ``params`` as for :func:`grouped_query_attention`."""
    batch, seq_len, _ = x.shape
    head_dim = params["wq"].shape[1] // num_heads

    def split(y: np.ndarray, heads: int) -> np.ndarray:
        return y.reshape(batch, seq_len, heads, head_dim).transpose(0, 2, 1, 3)  # (batch, heads, seq_len, head_dim)

    q = split(x @ params["wq"], num_heads)
    k, v = split(x @ params["wk"], num_kv_heads), split(x @ params["wv"], num_kv_heads)
    if rope_base is not None:
        q, k = rotary_embedding(q, offset, rope_base), rotary_embedding(k, offset, rope_base)
    return q, k, v


def grouped_query_attention(
    x: np.ndarray,
    params: dict[str, np.ndarray],
    num_heads: int,
    num_kv_heads: int,
    mask: np.ndarray | None = None,
    rope_base: float | None = 10000.0,
    offset: int = 0,
) -> np.ndarray:
    """Self-attention of ``x`` ``(batch, seq_len, d_model)`` -> ``(batch, seq_len, d_model)``.

    Args:
        params: ``wq`` ``(d_model, num_heads * head_dim)``, ``wk`` and ``wv`` ``(d_model, num_kv_heads * head_dim)``,
            ``wo`` ``(num_heads * head_dim, d_model)``; no biases.
        mask: boolean, True = may attend, broadcastable to ``(batch, num_heads, seq_len, seq_len)``.
        rope_base: rotate queries and keys by their positions (RoPE) with this base; None for no rotation.
        offset: position of the first row of ``x``.
    """
    batch, seq_len, _ = x.shape
    q, k, v = grouped_query_projections(x, params, num_heads, num_kv_heads, rope_base, offset)
    group = num_heads // num_kv_heads
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # kv head h // group serves query head h
    heads, _ = scaled_dot_product_attention(q, k, v, mask)
    return heads.transpose(0, 2, 1, 3).reshape(batch, seq_len, -1) @ params["wo"]


def kv_cache_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, length: int, batch: int = 1, bytes_per_number: int = 2
) -> int:
    """Bytes of a key/value cache: a key and a value vector per layer, key/value head and position.

    ``2 * num_layers * num_kv_heads * head_dim * length * batch * bytes_per_number`` (2 bytes for float16 or
    bfloat16). Grouped-query attention divides it by ``num_heads / num_kv_heads``.
    """
    for name, value in {"num_layers": num_layers, "num_kv_heads": num_kv_heads, "head_dim": head_dim,
                        "length": length, "batch": batch, "bytes_per_number": bytes_per_number}.items():
        if value < 0 or (value == 0 and name not in ("length", "batch")):
            raise ValueError(f"{name} must be a positive integer; got {value}")
    return 2 * num_layers * num_kv_heads * head_dim * length * batch * bytes_per_number
