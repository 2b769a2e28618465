"""Attention masks in PyTorch.

The whole course uses one convention: a **boolean mask, True = may attend**, broadcastable to
``(batch, num_heads, query_len, key_len)``. Libraries disagree, so convert at the boundary:

====================================================  ==============  ======================================
where                                                 True / 1 means  from our mask
====================================================  ==============  ======================================
``companion`` (torch, keras, reference)               may attend      ``mask``
``torch.nn.functional.scaled_dot_product_attention``  may attend      ``mask``
``torch.nn.MultiheadAttention``                       blocked         ``to_torch_mha_mask(mask)`` (``~mask``),
                                                                      then reshaped (see that function)
``keras.layers.MultiHeadAttention``                   may attend      ``mask[:, 0]`` (no head axis)
additive masks of source document 004                 blocked         ``1 - mask``, times -1e9, added
boolean masks of source document 003                  blocked         ``~mask``, filled with -inf
====================================================  ==============  ======================================

An additive ``-1e9`` overflows to ``-inf`` in float16, and ``-inf`` turns a row with every key masked into NaN
(0 / 0 in the softmax). We fill with the dtype's most negative *finite* value instead.
"""

from __future__ import annotations

import torch


def most_negative(dtype: torch.dtype) -> float:
    """The most negative finite number of a float dtype: -65504 for float16, about -3.4e38 for float32."""
    return torch.finfo(dtype).min


def padding_mask(ids: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
    """ids ``(batch, key_len)`` -> bool ``(batch, 1, 1, key_len)``, True where the token is not padding.

    The two singleton axes broadcast over the heads and over every query position.
    """
    if ids.dim() != 2:
        raise ValueError(f"ids must have shape (batch, key_len); got shape {tuple(ids.shape)}")
    return (ids != pad_id)[:, None, None, :]


def causal_mask(length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """bool ``(1, 1, length, length)``: query ``i`` may attend to keys ``0..i`` (lower triangle, diagonal included)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of the masks with broadcasting; ``None`` entries are skipped, all ``None`` gives ``None``.

    ``combine_masks(padding_mask(ids), causal_mask(seq_len))`` -> ``(batch, 1, seq_len, seq_len)``.
    """
    result = None
    for mask in masks:
        if mask is not None:
            result = mask.bool() if result is None else result & mask
    return result


def to_torch_mha_mask(mask: torch.Tensor) -> torch.Tensor:
    """Our mask (True = may attend) -> ``torch.nn.MultiheadAttention``'s (True = blocked): a logical NOT.

    Inverting is not enough: ``nn.MultiheadAttention`` (and the ``nn.Transformer`` modules, which hand their masks
    to it) takes ``key_padding_mask`` as ``(batch, key_len)`` and ``attn_mask`` as ``(query_len, key_len)`` or
    ``(batch * num_heads, query_len, key_len)``, so reshape after converting:

    - a padding mask: ``to_torch_mha_mask(padding_mask(ids))[:, 0, 0]`` as ``key_padding_mask``;
    - the causal mask: ``to_torch_mha_mask(causal_mask(n))[0, 0]`` as ``attn_mask``;
    - a per-example mask ``(batch, 1, query_len, key_len)``, such as ``combine_masks(padding, causal)``:
      ``to_torch_mha_mask(mask)[:, 0].repeat_interleave(num_heads, 0)`` as ``attn_mask`` (example-major, as the
      layer orders its heads). ``[:, 0]`` alone fails as soon as ``num_heads > 1``.
    """
    return ~mask


def to_additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Our mask -> a float mask to *add* to the scores: 0 where allowed, the dtype's most negative value where not.

    Adding is safe when this mask is the only one added and the scores are float32 or bfloat16: the sum overflows
    only for a score below about -1e31 (float32) or -1e36 (bfloat16), half the gap between the most negative finite
    number and its neighbour. In float16 the margin is tiny: -65504 plus a score of -16 or less is ``-inf``, so a
    fully masked row whose scores are all that low becomes NaN, the failure the finite fill is meant to prevent
    (``scaled_dot_product_attention`` *replaces* the blocked scores instead, which is safe in every dtype). Never
    add two of these masks (``min + min`` is ``-inf`` in every dtype): combine the boolean masks with
    ``combine_masks`` first and convert once.
    """
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, most_negative(dtype))
