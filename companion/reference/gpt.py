"""The decoder-only Transformer (GPT) in NumPy: forward pass, parameter count and generation (the oracle).

Parameters are a dictionary that mirrors the attribute names of ``companion.torch.gpt.GPT`` and
``companion.keras.gpt.GPT``, in the ``x @ W + b`` convention::

    {"token_embed": (vocab_size, d_model), "position_embed": (max_len, d_model),
     "blocks": [{"self_attn": {"wq", "bq", ...}, "ffn": {"w1", "b1", "w2", "b2"},
                 "addnorm1": {"gamma", "beta"}, "addnorm2": {...}}, ...],
     "norm": {"gamma", "beta"},
     "head": (d_model, vocab_size)}            # only when the weights are not tied

A GPT block computes exactly what a pre-LN encoder layer computes under a causal mask, so the oracle reuses
:func:`companion.reference.model.encoder_layer`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from companion.convert import dense_numpy
from companion.reference.addnorm import layer_norm
from companion.reference.masking import causal_mask
from companion.reference.model import embedding_params, encoder_layer_params, norm_params
from companion.reference.model import encoder_layer as _block
from companion.sampling import check_sampling_args, make_rng, sample_next

Params = dict[str, Any]


def gpt_forward(ids: np.ndarray, params: Params, num_heads: int) -> np.ndarray:
    """ids ``(batch, length)`` -> logits ``(batch, length, vocab_size)`` (no softmax); position ``i`` sees ``0..i``.

    The input of the first block is the token vector plus the learned position vector (no sqrt(d_model) scaling);
    the blocks are pre-LN; a final LayerNorm, then ``h @ E^T`` with the token table ``E`` (tied weights) or
    ``h @ head``.
    """
    ids = np.asarray(ids)
    length = ids.shape[1]
    x = params["token_embed"][ids] + params["position_embed"][:length]  # (batch, length, d_model)
    mask = causal_mask(length)  # (1, 1, length, length)
    for block in params["blocks"]:
        x = _block(x, block, num_heads, mask, norm_first=True)
    h = layer_norm(x, **params["norm"])
    return h @ (params["token_embed"].T if "head" not in params else params["head"])


def gpt_params(model: Any) -> Params:
    """The parameter dictionary of a ``companion.torch.gpt.GPT`` or ``companion.keras.gpt.GPT``, as float64."""
    params: Params = {
        "token_embed": embedding_params(model.token_embed),
        "position_embed": embedding_params(model.position_embed),
        "blocks": [encoder_layer_params(block) for block in model.blocks],  # same attribute names
        "norm": norm_params(model.norm),
    }
    if model.head is not None:
        params["head"] = dense_numpy(model.head, np.float64)[0]
    return params


def gpt_parameter_count(
    vocab_size: int,
    d_model: int = 512,
    num_layers: int = 6,
    d_ff: int = 2048,
    max_len: int = 512,
    tie_weights: bool = True,
) -> int:
    """Trainable parameters of ``GPT(vocab_size, d_model, num_heads, num_layers, d_ff, max_len, tie_weights=...)``.

    * token and position tables: ``(vocab_size + max_len) * d_model``;
    * one block: an attention ``4 * (d_model**2 + d_model)``, the feed-forward network
      ``2 * d_model * d_ff + d_ff + d_model`` and two LayerNorms ``2 * 2 * d_model``;
    * the final LayerNorm: ``2 * d_model``;
    * the output layer: nothing when tied to the token table, else ``d_model * vocab_size`` (no bias).

    The number of heads does not matter (the heads split ``d_model``).
    """
    for name, value in {"vocab_size": vocab_size, "d_model": d_model, "num_layers": num_layers, "d_ff": d_ff,
                        "max_len": max_len}.items():
        if value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value}")
    block = 4 * (d_model * d_model + d_model) + (2 * d_model * d_ff + d_ff + d_model) + 2 * 2 * d_model
    head = 0 if tie_weights else d_model * vocab_size
    return (vocab_size + max_len) * d_model + num_layers * block + 2 * d_model + head


def gpt_generate(
    ids: np.ndarray,
    params: Params,
    num_heads: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
) -> np.ndarray:
    """The oracle of ``generate``: run the whole sequence at every step (no cache) and choose each next token with
    ``companion.sampling.sample_next``. Returns int64 ``(batch, length + max_new_tokens)``."""
    check_sampling_args(temperature, top_k, top_p)
    ids = np.asarray(ids, dtype=np.int64)
    rng = make_rng(seed)
    for _ in range(max_new_tokens):
        logits = gpt_forward(ids, params, num_heads)[:, -1]  # (batch, vocab_size)
        ids = np.concatenate([ids, sample_next(logits, temperature, top_k, top_p, rng)[:, None]], axis=1)
    return ids


__all__ = ["gpt_forward", "gpt_generate", "gpt_params", "gpt_parameter_count"]
