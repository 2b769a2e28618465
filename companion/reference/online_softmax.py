"""Attention computed block by block over the keys with a running maximum and sum (online softmax), the algorithm of
Milakov & Gimelshein (2018) and Rabe & Staats (2021) that FlashAttention fuses into one GPU kernel, in NumPy (the
oracle of ``companion.torch.online_softmax`` and ``companion.keras``'s twin).

Plain attention builds the ``(query_len, key_len)`` matrix of scores, then its softmax. The online version never
holds more than ``(query_len, block_size)`` scores: for each block of keys it updates, per query, the largest score
seen so far ``m``, the sum of ``exp(score - m)`` so far ``l`` and the weighted sum of values so far ``acc``. When
a block raises the maximum from ``m`` to ``m'``, what was summed under the old maximum is rescaled by
``exp(m - m')``. After the last block, ``acc / l`` is exactly ``softmax(scores) @ v``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["online_softmax_attention"]


def online_softmax_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None, block_size: int = 64
) -> np.ndarray:
    """softmax(q k^T / sqrt(d_k)) v, one block of ``block_size`` keys at a time.

    Args:
        q: ``(..., query_len, d_k)``.
        k: ``(..., key_len, d_k)``.
        v: ``(..., key_len, d_v)``.
        mask: boolean, True = may attend, broadcastable to ``(..., query_len, key_len)``. Masked scores get the
            dtype's most negative finite value, as in plain attention, so a fully masked row is uniform.
        block_size: keys per block.

    Returns:
        ``(..., query_len, d_v)``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be a positive integer; got {block_size}")
    scale = 1.0 / np.sqrt(q.shape[-1])
    dtype = np.result_type(q, k, v)
    lowest = np.finfo(dtype).min
    key_len = k.shape[-2]
    if mask is not None:
        mask = np.broadcast_to(mask, (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], key_len))
    running_max = np.full((*q.shape[:-1], 1), lowest, dtype=dtype)  # m: (..., query_len, 1)
    running_sum = np.zeros((*q.shape[:-1], 1), dtype=dtype)  # l
    acc = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=dtype)  # sum of exp(score - m) * v
    for start in range(0, key_len, block_size):
        stop = min(start + block_size, key_len)
        scores = q @ np.swapaxes(k[..., start:stop, :], -1, -2) * scale  # (..., query_len, block)
        if mask is not None:
            scores = np.where(mask[..., start:stop], scores, lowest)
        new_max = np.maximum(running_max, scores.max(axis=-1, keepdims=True))
        correction = np.exp(running_max - new_max)  # how much the old terms shrink under the new maximum
        weights = np.exp(scores - new_max)
        running_sum = running_sum * correction + weights.sum(axis=-1, keepdims=True)
        acc = acc * correction + weights @ v[..., start:stop, :]
        running_max = new_max
    return acc / running_sum
