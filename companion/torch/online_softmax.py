"""Attention block by block over the keys with a running maximum and sum (online softmax: Milakov & Gimelshein 2018; in
blocks for attention, Rabe & Staats 2021; fused on the GPU by FlashAttention), in PyTorch (same name and arguments in
``companion.keras.online_softmax``; the oracle and the derivation are in ``companion.reference.online_softmax``).

Written with ordinary tensor operations it shows the algorithm and its memory, not the speed: the real kernel
keeps each block in the fast on-chip memory of a GPU and fuses every step into one pass.
"""

from __future__ import annotations

import math

import torch

from .attention import _check_inputs

__all__ = ["online_softmax_attention"]


def online_softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, block_size: int = 64
) -> torch.Tensor:
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
    scale = 1.0 / math.sqrt(q.shape[-1])
    lowest = torch.finfo(q.dtype).min
    running_max = torch.full((*q.shape[:-1], 1), lowest, dtype=q.dtype, device=q.device)  # m
    running_sum = torch.zeros((*q.shape[:-1], 1), dtype=q.dtype, device=q.device)  # l
    acc = q.new_zeros((*q.shape[:-1], v.shape[-1]))  # sum of exp(score - m) * v
    if mask is not None:
        mask = mask.expand(*mask.shape[:-1], k.shape[-2])  # a key axis of 1 would not slice into blocks
    for start in range(0, k.shape[-2], block_size):
        block = slice(start, start + block_size)
        scores = q @ k[..., block, :].transpose(-2, -1) * scale  # (..., query_len, block)
        if mask is not None:
            scores = scores.masked_fill(~mask[..., block], lowest)
        new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
        correction = torch.exp(running_max - new_max)  # how much the old terms shrink under the new maximum
        weights = torch.exp(scores - new_max)
        running_sum = running_sum * correction + weights.sum(dim=-1, keepdim=True)
        acc = acc * correction + weights @ v[..., block, :]
        running_max = new_max
    return acc / running_sum
