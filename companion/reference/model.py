"""The whole Transformer in NumPy: encoder and decoder layers, the stacks and the full forward pass (the oracle).

Parameters are nested dictionaries that mirror the attribute names of the torch and keras modules, in the
``x @ W + b`` convention::

    {"src_embed": (src_vocab, d_model), "tgt_embed": (tgt_vocab, d_model),
     "encoder": {"layers": [{"self_attn": {"wq", "bq", ...}, "ffn": {"w1", "b1", "w2", "b2"},
                             "addnorm1": {"gamma", "beta"}, "addnorm2": {...}}, ...],
                 "norm": {"gamma", "beta"}},                  # "norm" only for pre-LN
     "decoder": {"layers": [{"self_attn", "cross_attn", "ffn", "addnorm1", "addnorm2", "addnorm3"}, ...], ...},
     "generator": {"w": (d_model, tgt_vocab), "b": (tgt_vocab,)}}

A model with ``shared_embeddings`` (section 3.4 of the paper) has one table for both embeddings and the output
layer: its dictionary holds ``"src_embed"`` only, and ``"generator"`` holds only the bias ``"b"``.

:func:`transformer_params` reads such a dictionary out of a ``companion.torch`` or ``companion.keras`` model (in
float64, so the oracle adds no rounding of its own).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from companion.convert import as_numpy, dense_numpy, params_numpy
from companion.reference.addnorm import add_norm, feed_forward, layer_norm
from companion.reference.masking import causal_mask, combine_masks, padding_mask
from companion.reference.multihead import multi_head_attention
from companion.reference.positional import sinusoidal_positional_encoding

Params = dict[str, Any]


def encoder_layer(
    x: np.ndarray, params: Params, num_heads: int, mask: np.ndarray | None = None, norm_first: bool = False
) -> np.ndarray:
    """Self-attention, then the feed-forward network, each wrapped in Add & Norm.

    Args:
        x: ``(batch, seq_len, d_model)``.
        mask: boolean, True = may attend, broadcastable to ``(batch, num_heads, seq_len, seq_len)``.

    Returns:
        ``(batch, seq_len, d_model)``.
    """

    def self_attention(h: np.ndarray) -> np.ndarray:
        return multi_head_attention(h, h, h, params["self_attn"], num_heads, mask)[0]

    def ffn(h: np.ndarray) -> np.ndarray:
        return feed_forward(h, params["ffn"])

    x = add_norm(x, self_attention, **params["addnorm1"], norm_first=norm_first)
    return add_norm(x, ffn, **params["addnorm2"], norm_first=norm_first)


def decoder_layer(
    x: np.ndarray,
    memory: np.ndarray,
    params: Params,
    num_heads: int,
    self_mask: np.ndarray | None = None,
    memory_mask: np.ndarray | None = None,
    norm_first: bool = False,
    return_weights: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Masked self-attention, cross-attention over the encoder output, then the feed-forward network.

    In the cross-attention the *queries* come from the decoder (``x``) and the *keys and values* from the encoder
    output (``memory``), so the weights have shape ``(batch, num_heads, tgt_len, src_len)``.

    Args:
        x: ``(batch, tgt_len, d_model)``.
        memory: ``(batch, src_len, d_model)``.
        self_mask: broadcastable to ``(batch, num_heads, tgt_len, tgt_len)`` (causal AND target padding).
        memory_mask: broadcastable to ``(batch, num_heads, tgt_len, src_len)`` (source padding).

    Returns:
        ``(batch, tgt_len, d_model)``, plus the self- and cross-attention weights when ``return_weights``.
    """
    weights = {}

    def self_attention(h: np.ndarray) -> np.ndarray:
        out, weights["self"] = multi_head_attention(h, h, h, params["self_attn"], num_heads, self_mask)
        return out

    def cross_attention(h: np.ndarray) -> np.ndarray:
        out, weights["cross"] = multi_head_attention(h, memory, memory, params["cross_attn"], num_heads, memory_mask)
        return out

    def ffn(h: np.ndarray) -> np.ndarray:
        return feed_forward(h, params["ffn"])

    x = add_norm(x, self_attention, **params["addnorm1"], norm_first=norm_first)
    x = add_norm(x, cross_attention, **params["addnorm2"], norm_first=norm_first)
    x = add_norm(x, ffn, **params["addnorm3"], norm_first=norm_first)
    return (x, weights["self"], weights["cross"]) if return_weights else x


def encoder(
    x: np.ndarray, params: Params, num_heads: int, mask: np.ndarray | None = None, norm_first: bool = False
) -> np.ndarray:
    """The stack of encoder layers; pre-LN stacks end with one more LayerNorm (``params["norm"]``)."""
    for layer_params in params["layers"]:
        x = encoder_layer(x, layer_params, num_heads, mask, norm_first)
    return layer_norm(x, **params["norm"]) if norm_first else x


def decoder(
    x: np.ndarray,
    memory: np.ndarray,
    params: Params,
    num_heads: int,
    self_mask: np.ndarray | None = None,
    memory_mask: np.ndarray | None = None,
    norm_first: bool = False,
) -> np.ndarray:
    """The stack of decoder layers; every layer attends to the same encoder output ``memory``."""
    for layer_params in params["layers"]:
        x = decoder_layer(x, memory, layer_params, num_heads, self_mask, memory_mask, norm_first)
    return layer_norm(x, **params["norm"]) if norm_first else x


def embed(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Token embedding times sqrt(d_model) plus the sinusoidal positional encoding: ``(batch, seq_len, d_model)``."""
    seq_len, d_model = ids.shape[1], table.shape[1]
    return table[ids] * math.sqrt(d_model) + sinusoidal_positional_encoding(seq_len, d_model).astype(table.dtype)


def transformer(
    src_ids: np.ndarray,
    tgt_ids: np.ndarray,
    params: Params,
    num_heads: int,
    pad_id: int = 0,
    norm_first: bool = False,
    shared_embeddings: bool = False,
) -> np.ndarray:
    """The full encoder-decoder forward pass: ids in, logits ``(batch, tgt_len, tgt_vocab)`` out (no softmax).

    The masks are built from the ids: the encoder's self-attention and the decoder's cross-attention see only real
    source tokens; the decoder's self-attention sees only real target tokens at or before its own position.
    With ``shared_embeddings`` the one table ``params["src_embed"]`` ``(vocab, d_model)`` embeds both sides and,
    transposed, is the output layer's weight: ``logits = y @ table.T + params["generator"]["b"]``.
    """
    if shared_embeddings:
        table = params["src_embed"]
        params = {**params, "tgt_embed": table, "generator": {"w": table.T, "b": params["generator"]["b"]}}
    src_ids, tgt_ids = np.asarray(src_ids), np.asarray(tgt_ids)
    src_mask = padding_mask(src_ids, pad_id)  # (batch, 1, 1, src_len)
    tgt_mask = combine_masks(padding_mask(tgt_ids, pad_id), causal_mask(tgt_ids.shape[1]))  # (batch, 1, tgt, tgt)
    memory = encoder(embed(src_ids, params["src_embed"]), params["encoder"], num_heads, src_mask, norm_first)
    y = embed(tgt_ids, params["tgt_embed"])
    y = decoder(y, memory, params["decoder"], num_heads, tgt_mask, src_mask, norm_first)
    return y @ params["generator"]["w"] + params["generator"]["b"]


# ---------------------------------------------------------------------------------------------------------------
# Reading the parameters out of a companion.torch or companion.keras model
# ---------------------------------------------------------------------------------------------------------------


def _array(value: Any) -> np.ndarray:
    """A torch tensor or parameter, a Keras variable or an array, as a float64 NumPy array."""
    return np.array(as_numpy(value), dtype=np.float64)


def norm_params(layer: Any) -> dict[str, np.ndarray]:
    """``{"gamma", "beta"}`` of an ``nn.LayerNorm`` or a ``keras.layers.LayerNormalization``."""
    if hasattr(layer, "gamma"):
        return {"gamma": _array(layer.gamma), "beta": _array(layer.beta)}
    return {"gamma": _array(layer.weight), "beta": _array(layer.bias)}


def embedding_params(layer: Any) -> np.ndarray:
    """The ``(vocab_size, d_model)`` table of a TokenEmbedding, ``nn.Embedding`` or ``keras.layers.Embedding``."""
    layer = getattr(layer, "embedding", layer)  # TokenEmbedding wraps the table
    return _array(layer.embeddings if hasattr(layer, "embeddings") else layer.weight)


def feed_forward_params(ffn: Any) -> dict[str, np.ndarray]:
    """``w1, b1, w2, b2`` of a PositionwiseFeedForward (either framework)."""
    (w1, b1), (w2, b2) = dense_numpy(ffn.linear1, np.float64), dense_numpy(ffn.linear2, np.float64)
    return {"w1": w1, "b1": b1, "w2": w2, "b2": b2}


def encoder_layer_params(layer: Any) -> Params:
    return {
        "self_attn": params_numpy(layer.self_attn, np.float64),
        "ffn": feed_forward_params(layer.ffn),
        "addnorm1": norm_params(layer.addnorm1.norm),
        "addnorm2": norm_params(layer.addnorm2.norm),
    }


def decoder_layer_params(layer: Any) -> Params:
    return {
        "self_attn": params_numpy(layer.self_attn, np.float64),
        "cross_attn": params_numpy(layer.cross_attn, np.float64),
        "ffn": feed_forward_params(layer.ffn),
        "addnorm1": norm_params(layer.addnorm1.norm),
        "addnorm2": norm_params(layer.addnorm2.norm),
        "addnorm3": norm_params(layer.addnorm3.norm),
    }


def stack_params(stack: Any) -> Params:
    """``{"layers": [...], "norm": ...}`` of a companion Encoder or Decoder."""
    read = decoder_layer_params if hasattr(stack.layers[0], "cross_attn") else encoder_layer_params
    params: Params = {"layers": [read(layer) for layer in stack.layers]}
    if getattr(stack, "norm", None) is not None:
        params["norm"] = norm_params(stack.norm)
    return params


def transformer_params(model: Any) -> Params:
    """The nested parameter dictionary of a companion Transformer (torch or keras), as float64 arrays.

    For a model with ``shared_embeddings`` the table appears once (``"src_embed"``) and ``"generator"`` holds only
    the bias: pass ``shared_embeddings=True`` to :func:`transformer`.
    """
    if getattr(model, "shared_embeddings", False):
        return {
            "src_embed": embedding_params(model.src_embed),
            "encoder": stack_params(model.encoder),
            "decoder": stack_params(model.decoder),
            "generator": {"b": _array(model.generator.bias)},
        }
    w, b = dense_numpy(model.generator, np.float64)
    return {
        "src_embed": embedding_params(model.src_embed),
        "tgt_embed": embedding_params(model.tgt_embed),
        "encoder": stack_params(model.encoder),
        "decoder": stack_params(model.decoder),
        "generator": {"w": w, "b": b},
    }
