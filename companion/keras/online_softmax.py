"""Attention block by block over the keys with a running maximum and sum (online softmax: Milakov & Gimelshein 2018; in
blocks for attention, Rabe & Staats 2021; fused on the GPU by FlashAttention), in Keras 3 (same name and arguments in
``companion.torch.online_softmax``; the oracle and the derivation are in ``companion.reference.online_softmax``).

Written with ordinary tensor operations it shows the algorithm and its memory, not the speed: the real kernel
keeps each block in the fast on-chip memory of a GPU and fuses every step into one pass.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from .attention import _check_inputs
from .masking import most_negative

__all__ = ["online_softmax_attention"]


def online_softmax_attention(q, k, v, mask=None, block_size: int = 64):
    """softmax(q k^T / sqrt(d_k)) v, one block of ``block_size`` keys at a time, never holding more than
    ``(..., query_len, block_size)`` scores.

    Args:
        q: ``(..., query_len, d_k)``.
        k: ``(..., key_len, d_k)``.
        v: ``(..., key_len, d_v)``.
        mask: boolean, True = may attend, broadcastable to ``(..., query_len, key_len)``.
        block_size: keys per block.

    Returns:
        ``(..., query_len, d_v)``, equal to plain attention up to round-off (a fully masked row is uniform too).
    """
    _check_inputs(q, k, v, mask)
    if block_size < 1:
        raise ValueError(f"block_size must be a positive integer; got {block_size}")
    dtype = keras.backend.standardize_dtype(q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1])
    lowest = ops.convert_to_tensor(np.asarray(most_negative(dtype), dtype))  # float64's would overflow a float32
    key_len = k.shape[-2]
    stats_shape = (*q.shape[:-1], 1)
    running_max = ops.zeros(stats_shape, dtype=dtype) + lowest  # m: (..., query_len, 1)
    running_sum = ops.zeros(stats_shape, dtype=dtype)  # l
    acc = ops.zeros((*q.shape[:-1], v.shape[-1]), dtype=dtype)  # sum of exp(score - m) * v
    if mask is not None:
        mask = ops.broadcast_to(mask, (*mask.shape[:-1], key_len))  # a key axis of 1 would not slice into blocks
    for start in range(0, key_len, block_size):
        stop = min(start + block_size, key_len)
        scores = ops.matmul(q, ops.swapaxes(k[..., start:stop, :], -1, -2)) * scale  # (..., query_len, block)
        if mask is not None:
            scores = ops.where(mask[..., start:stop], scores, lowest)
        new_max = ops.maximum(running_max, ops.max(scores, axis=-1, keepdims=True))
        correction = ops.exp(running_max - new_max)  # how much the old terms shrink under the new maximum
        weights = ops.exp(scores - new_max)
        running_sum = running_sum * correction + ops.sum(weights, axis=-1, keepdims=True)
        acc = acc * correction + ops.matmul(weights, v[..., start:stop, :])
        running_max = new_max
    return acc / running_sum
