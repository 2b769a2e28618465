"""Attention masks in Keras 3 (``keras.ops`` only, so any backend).

The whole course uses one convention: a **boolean mask, True = may attend**, broadcastable to
``(batch, num_heads, query_len, key_len)``. Libraries disagree, so convert at the boundary:

====================================================  ==============  ======================================
where                                                 True / 1 means  from our mask
====================================================  ==============  ======================================
``companion`` (torch, keras, reference)               may attend      ``mask``
``keras.layers.MultiHeadAttention``                   may attend      ``to_keras_mha_mask(mask)``
``keras.ops.dot_product_attention``                   may attend      ``mask`` (heads on axis 2 there)
``torch.nn.MultiheadAttention``                       blocked         ``~mask``, then reshaped (``[:, 0, 0]`` for
                                                                      ``key_padding_mask``, ``[0, 0]`` for a causal
                                                                      ``attn_mask``, ``[:, 0]`` repeated
                                                                      ``num_heads`` times along axis 0 for a
                                                                      per-example one)
additive masks of source document 004                 blocked         ``1 - mask``, times -1e9, added
boolean masks of source document 003                  blocked         ``~mask``, filled with -inf
====================================================  ==============  ======================================

An additive ``-1e9`` overflows to ``-inf`` in float16, and ``-inf`` turns a row with every key masked into NaN
(0 / 0 in the softmax). We fill with the dtype's most negative *finite* value instead.
"""

from __future__ import annotations

import keras
import ml_dtypes  # installed with Keras; numpy's finfo does not know bfloat16
from keras import ops


def most_negative(dtype) -> float:
    """The most negative finite number of a float dtype: -65504 for float16, about -3.4e38 for float32."""
    return float(ml_dtypes.finfo(keras.backend.standardize_dtype(dtype)).min)


def padding_mask(ids, pad_id: int = 0):
    """ids ``(batch, key_len)`` -> bool ``(batch, 1, 1, key_len)``, True where the token is not padding.

    The two singleton axes broadcast over the heads and over every query position.
    """
    ids = ops.convert_to_tensor(ids)
    if len(ids.shape) != 2:
        raise ValueError(f"ids must have shape (batch, key_len); got shape {tuple(ids.shape)}")
    return ops.expand_dims(ops.not_equal(ids, pad_id), (1, 2))


def causal_mask(length: int, device: str | None = None):
    """bool ``(1, 1, length, length)``: query ``i`` may attend to keys ``0..i`` (lower triangle, diagonal included).

    ``device`` (a Keras device string such as ``"cpu:0"``) places the mask there; None keeps the current device.
    """
    if device is not None:
        with keras.device(device):
            return causal_mask(length)
    positions = ops.arange(length)
    allowed = ops.expand_dims(positions, 1) >= ops.expand_dims(positions, 0)  # row (query) >= column (key)
    return ops.expand_dims(allowed, (0, 1))


def combine_masks(*masks):
    """Logical AND of the masks with broadcasting; ``None`` entries are skipped, all ``None`` gives ``None``.

    ``combine_masks(padding_mask(ids), causal_mask(seq_len))`` -> ``(batch, 1, seq_len, seq_len)``.
    """
    result = None
    for mask in masks:
        if mask is not None:
            mask = ops.cast(mask, "bool")
            result = mask if result is None else ops.logical_and(result, mask)
    return result


def to_keras_mha_mask(mask):
    """Our ``(batch, 1, query_len or 1, key_len)`` mask -> ``keras.layers.MultiHeadAttention``'s ``attention_mask``.

    Same meaning (True = may attend); Keras adds the head axis itself, so drop ours.
    """
    return ops.squeeze(ops.convert_to_tensor(mask), axis=1)


def to_additive_mask(mask, dtype="float32"):
    """Our mask -> a float mask to *add* to the scores: 0 where allowed, the dtype's most negative value where not.

    Adding is safe when this mask is the only one added and the scores are float32 or bfloat16: the sum overflows
    only for a score below about -1e31 (float32) or -1e36 (bfloat16), half the gap between the most negative finite
    number and its neighbour. In float16 the margin is tiny: -65504 plus a score of -16 or less is ``-inf``, so a
    fully masked row whose scores are all that low becomes NaN, the failure the finite fill is meant to prevent
    (``scaled_dot_product_attention`` *replaces* the blocked scores instead, which is safe in every dtype). Never
    add two of these masks (``min + min`` is ``-inf`` in every dtype): combine the boolean masks with
    ``combine_masks`` first and convert once.
    """
    return ops.where(mask, ops.cast(0, dtype), ops.cast(most_negative(dtype), dtype))
