"""Incremental decoding for the encoder-decoder Transformer in Keras 3: a key/value cache for the decoder.

Decoding token by token with ``model.decode`` runs the decoder over the whole target prefix at every step, and
every cross-attention projects the same encoder output into the same keys and values again. With a cache:

* :func:`cross_attention_cache` projects the encoder output into each decoder layer's cross-attention keys and
  values **once per sentence**;
* :func:`decode_cached` computes only the target positions the cache does not hold yet, reading the earlier
  positions' self-attention keys and values from the cache and returning it grown by the new ones.

``greedy_decode`` and ``beam_search`` (``companion.keras.training``) use them when ``use_cache=True``; the tokens are
the same as without the cache. Same names and arguments in ``companion.torch.kv_cache``. The decoder-only GPT
has its own cached forward pass, ``GPT.forward_cached`` (``companion.keras.gpt``). These are plain functions,
not Keras calls, so the caches (lists of tensor pairs) go in and out as they are; the model must be built.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from keras import ops

from .masking import causal_mask, combine_masks, padding_mask

__all__ = ["cached_beam_scorer", "cross_attention_cache", "decode_cached", "decoder_layer_cached"]


def cross_attention_cache(model, memory) -> list[tuple]:
    """The cross-attention keys and values of every decoder layer for the encoder output ``memory``
    ``(batch, src_len, d_model)``: one ``(k, v)`` per layer, each ``(batch, num_heads, src_len, d_head)``."""
    return [layer.cross_attn.project_key_value(memory, memory) for layer in model.decoder.layers]


def decoder_layer_cached(layer, x, cross_kv: tuple, past: tuple | None = None, self_mask=None, memory_mask=None):
    """What ``DecoderLayer.call`` computes for the new positions ``x`` ``(batch, new_len, d_model)`` only.

    Args:
        layer: a companion ``DecoderLayer``.
        cross_kv: the layer's cross-attention ``(k, v)`` from :func:`cross_attention_cache`.
        past: the self-attention ``(k, v)`` of the earlier target positions, ``(batch, num_heads, past_len,
            d_head)`` each, or None.
        self_mask: broadcastable to ``(batch, num_heads, new_len, past_len + new_len)``.
        memory_mask: broadcastable to ``(batch, num_heads, new_len, src_len)``.

    Returns:
        ``(batch, new_len, d_model)`` and the grown self-attention ``(k, v)``.
    """
    grown = {}

    def self_attention(h):
        out, grown["kv"] = layer.self_attn.self_attention_cached(h, past, self_mask)
        return out

    x = layer.addnorm1(x, sublayer=self_attention)
    x = layer.addnorm2(x, sublayer=lambda h: layer.cross_attn.attend_projected(h, *cross_kv, memory_mask))
    return layer.addnorm3(x, sublayer=layer.ffn), grown["kv"]


def decode_cached(model, tgt_ids, cross_kv: list[tuple], src_mask, self_kv: list[tuple] | None = None):
    """``model.decode(tgt_ids, memory, src_mask)`` for the target positions that ``self_kv`` does not hold yet.

    Args:
        model: a companion ``Transformer``.
        tgt_ids: ``(batch, tgt_len)``: the whole target prefix so far (its first ``past_len`` tokens are those the
            cache was built from).
        cross_kv: from :func:`cross_attention_cache` (computed once per sentence).
        src_mask: ``(batch, 1, 1, src_len)`` from ``model.encode``.
        self_kv: one ``(k, v)`` per decoder layer, each ``(batch, num_heads, past_len, d_head)``; None to start.

    Returns:
        logits ``(batch, tgt_len - past_len, tgt_vocab)``, equal to ``model.decode(...)[:, past_len:]``, and the
        self-attention cache of all ``tgt_len`` positions.
    """
    past = 0 if not self_kv else int(self_kv[0][0].shape[2])
    tgt_ids = tgt_ids if ops.is_tensor(tgt_ids) else ops.convert_to_tensor(np.asarray(tgt_ids))
    model._check(tgt_ids, model.tgt_vocab_size, "tgt_ids")
    total = tgt_ids.shape[1]
    if total <= past:
        raise ValueError(f"tgt_ids must be longer than the {past} positions in the cache; got {total}")
    if len(cross_kv) != len(model.decoder.layers) or (self_kv and len(self_kv) != len(cross_kv)):
        raise ValueError(f"the caches must hold one (k, v) per decoder layer ({len(model.decoder.layers)})")
    # New query i (position past + i) may see the target keys 0..past + i that are not PAD.
    mask = combine_masks(padding_mask(tgt_ids, model.pad_id), causal_mask(total)[:, :, past:])
    y = model.tgt_embed(tgt_ids[:, past:])  # (batch, new_len, d_model)
    pe = ops.slice(model.positional.pe, (past, 0), (total - past, model.d_model))  # the new tokens' positions
    y = model.positional.dropout(y + ops.cast(pe, y.dtype), training=False)
    grown = []
    for index, layer in enumerate(model.decoder.layers):
        y, kv = decoder_layer_cached(layer, y, cross_kv[index], self_kv[index] if self_kv else None, mask, src_mask)
        grown.append(kv)
    if model.decoder.norm is not None:
        y = model.decoder.norm(y)
    return model.generator(y), grown


def cached_beam_scorer(model, memory, src_mask) -> Callable[[np.ndarray], np.ndarray]:
    """The ``next_log_probs`` function that ``companion.decoding.beam_search_from_scores`` calls, with a cache.

    ``memory`` ``(1, src_len, d_model)`` and ``src_mask`` are one sentence's. Its cross-attention keys and values
    are computed here, once. Each call receives the surviving prefixes ``(beams, steps)``; each one extends a
    prefix of the previous call (its parent), so the cache rows are reordered to follow the parents and only the
    last token is computed. A prefix whose parent was not scored in the previous call (not the case in beam
    search) makes the call recompute every position.
    """
    cross = cross_attention_cache(model, memory)
    state: dict = {"rows": {}, "cache": None}

    def next_log_probs(prefixes: np.ndarray) -> np.ndarray:
        count = prefixes.shape[0]
        parents = [state["rows"].get(tuple(prefix[:-1])) for prefix in prefixes.tolist()]
        self_kv = None
        if state["cache"] is not None and None not in parents:
            index = np.asarray(parents, dtype="int32")
            self_kv = [(ops.take(k, index, axis=0), ops.take(v, index, axis=0)) for k, v in state["cache"]]
        cross_kv = [(ops.repeat(k, count, axis=0), ops.repeat(v, count, axis=0)) for k, v in cross]
        ys = ops.convert_to_tensor(prefixes.astype("int32"))
        logits, state["cache"] = decode_cached(model, ys, cross_kv, ops.repeat(src_mask, count, axis=0), self_kv)
        state["rows"] = {tuple(prefix): row for row, prefix in enumerate(prefixes.tolist())}
        return ops.convert_to_numpy(ops.log_softmax(ops.cast(logits[:, -1], "float32"), axis=-1))

    return next_log_probs
