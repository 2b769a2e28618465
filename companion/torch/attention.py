"""Scaled dot-product attention in PyTorch, written out step by step (the version that returns the weights)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .masking import most_negative


def check_mask(mask: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    """Raise ValueError unless ``mask`` is None or a boolean tensor that broadcasts to ``shape`` (the scores')."""
    if mask is None:
        return
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be boolean (True = may attend); got dtype {mask.dtype}")
    try:
        fits = torch.broadcast_shapes(mask.shape, shape) == shape
    except RuntimeError:  # the shapes do not broadcast at all
        fits = False
    if not fits:
        raise ValueError(f"mask must be broadcastable to {tuple(shape)}; got shape {tuple(mask.shape)}")


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() < 2:
            raise ValueError(f"{name} must have shape (..., seq_len, depth); got shape {tuple(x.shape)}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must have shape (..., key_len, d_k={q.shape[-1]}) like q; got shape {tuple(k.shape)}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v must have shape (..., key_len={k.shape[-2]}, d_v) like k; got shape {tuple(v.shape)}")
    try:
        batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"q, k and v must share their leading (...) axes; got shapes {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        ) from None
    # The scores have shape (..., query_len, key_len): the mask must broadcast to exactly that.
    check_mask(mask, torch.Size((*batch_shape, q.shape[-2], k.shape[-2])))


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    return_weights: bool = False,
    dropout: float = 0.0,
    training: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(d_k)) v.

    Args:
        q: ``(..., query_len, d_k)``.
        k: ``(..., key_len, d_k)``.
        v: ``(..., key_len, d_v)``.
        mask: boolean, True = may attend, broadcastable to ``(..., query_len, key_len)``.
        return_weights: also return the attention weights.
        dropout: probability of dropping an attention weight, applied only when ``training``.
        training: whether dropout is active.

    Returns:
        ``out (..., query_len, d_v)``, or ``(out, weights (..., query_len, key_len))`` when ``return_weights``.
        The weights are those before dropout: each row sums to 1.
    """
    _check_inputs(q, k, v, mask)
    # Dividing by sqrt(d_k) keeps the scores' variance near 1 whatever d_k is, so the softmax does not saturate.
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., query_len, key_len)
    if mask is not None:
        # The most negative finite value *of the scores' dtype*: -1e9 would overflow to -inf in float16, and -inf
        # makes a fully masked row 0/0 = NaN. With a finite fill that row is uniform and its output finite.
        scores = scores.masked_fill(~mask, most_negative(scores.dtype))
    weights = scores.softmax(dim=-1)
    out = F.dropout(weights, p=dropout, training=training) @ v
    return (out, weights) if return_weights else out
