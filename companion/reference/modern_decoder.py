"""The Llama-style decoder in NumPy: forward pass, parameter count, generation, and reading the weights out of
``companion.torch.ModernDecoder`` or ``companion.keras.ModernDecoder`` (the oracle).

Parameters mirror the attribute names of the two models, in the ``x @ W`` convention::

    {"token_embed": (vocab_size, d_model),
     "blocks": [{"attn_norm": (d_model,), "attn": {"wq", "wk", "wv", "wo"},
                 "ffn_norm": (d_model,), "ffn": {"w1", "w2", "w3"}}, ...],
     "norm": (d_model,),
     "head": (d_model, vocab_size)}            # only when the weights are not tied
"""

from __future__ import annotations

from typing import Any

import numpy as np

from companion.convert import dense_numpy
from companion.reference.grouped import grouped_query_attention
from companion.reference.masking import causal_mask
from companion.reference.model import _array, embedding_params
from companion.reference.modern import rms_norm, sliding_window_mask, swiglu
from companion.sampling import check_sampling_args, make_rng, sample_next

Params = dict[str, Any]

__all__ = ["modern_decoder_forward", "modern_decoder_generate", "modern_decoder_parameter_count",
           "modern_decoder_params"]


def modern_decoder_forward(
    ids: np.ndarray,
    params: Params,
    num_heads: int,
    num_kv_heads: int,
    window: int | None = None,
    rope_base: float = 10000.0,
    eps: float = 1e-6,
) -> np.ndarray:
    """ids ``(batch, length)`` -> logits ``(batch, length, vocab_size)``: token vectors (no position vector),
    pre-RMSNorm blocks of grouped-query attention with RoPE and SwiGLU, a final RMSNorm, the output layer."""
    ids = np.asarray(ids)
    length = ids.shape[1]
    x = params["token_embed"][ids]  # (batch, length, d_model)
    mask = causal_mask(length) if window is None else sliding_window_mask(length, window)
    for block in params["blocks"]:
        h = rms_norm(x, block["attn_norm"], eps)
        x = x + grouped_query_attention(h, block["attn"], num_heads, num_kv_heads, mask, rope_base)
        x = x + swiglu(rms_norm(x, block["ffn_norm"], eps), block["ffn"])
    h = rms_norm(x, params["norm"], eps)
    return h @ (params["token_embed"].T if "head" not in params else params["head"])


def modern_decoder_params(model: Any) -> Params:
    """The parameter dictionary of a ``ModernDecoder`` of either framework, as float64."""

    def weights(layer: Any, names: str) -> dict[str, np.ndarray]:
        return {f"w{n}": dense_numpy(getattr(layer, f"w{n}"), np.float64)[0] for n in names}

    params: Params = {
        "token_embed": embedding_params(model.token_embed),
        "blocks": [{"attn_norm": _array(b.attn_norm.weight), "attn": weights(b.attn, "qkvo"),
                    "ffn_norm": _array(b.ffn_norm.weight), "ffn": weights(b.ffn, "123")} for b in model.blocks],
        "norm": _array(model.norm.weight),
    }
    if model.head is not None:
        params["head"] = dense_numpy(model.head, np.float64)[0]
    return params


def modern_decoder_parameter_count(
    vocab_size: int,
    d_model: int = 512,
    num_heads: int = 8,
    num_kv_heads: int = 2,
    num_layers: int = 6,
    d_ff: int = 1376,
    tie_weights: bool = True,
) -> int:
    """Trainable parameters of ``ModernDecoder(vocab_size, d_model, num_heads, num_kv_heads, num_layers, d_ff, ...)``.

    * the token table ``vocab_size * d_model`` (no position table);
    * one block: queries and output ``2 * d_model**2``, keys and values ``2 * d_model * num_kv_heads * head_dim``,
      SwiGLU ``3 * d_model * d_ff``, two RMSNorm gains ``2 * d_model``;
    * the final RMSNorm ``d_model``; the output layer ``d_model * vocab_size`` unless tied.
    """
    for name, value in {"vocab_size": vocab_size, "d_model": d_model, "num_heads": num_heads,
                        "num_kv_heads": num_kv_heads, "num_layers": num_layers, "d_ff": d_ff}.items():
        if value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value}")
    kv_width = num_kv_heads * (d_model // num_heads)
    block = 2 * d_model * d_model + 2 * d_model * kv_width + 3 * d_model * d_ff + 2 * d_model
    return vocab_size * d_model + num_layers * block + d_model + (0 if tie_weights else d_model * vocab_size)


def modern_decoder_generate(
    ids: np.ndarray,
    params: Params,
    num_heads: int,
    num_kv_heads: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    window: int | None = None,
) -> np.ndarray:
    """The oracle of ``generate`` for this model: the whole sequence at every step, each next token chosen by
    ``companion.sampling.sample_next``. Returns int64 ``(batch, length + max_new_tokens)``."""
    check_sampling_args(temperature, top_k, top_p)
    ids = np.asarray(ids, dtype=np.int64)
    rng = make_rng(seed)
    for _ in range(max_new_tokens):
        logits = modern_decoder_forward(ids, params, num_heads, num_kv_heads, window)[:, -1]
        ids = np.concatenate([ids, sample_next(logits, temperature, top_k, top_p, rng)[:, None]], axis=1)
    return ids
