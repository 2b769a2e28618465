"""A decoder-only model built like today's open models (Llama, Mistral) in Keras 3: pre-RMSNorm blocks, rotary
positions, grouped-query attention, a SwiGLU feed-forward network, no biases.

The public names, identical in ``companion.torch.modern_decoder`` (see there for what changed from chapter 8's
GPT): ``ModernDecoder(vocab_size, d_model=512, num_heads=8, num_kv_heads=2, num_layers=6, d_ff=1376,
max_len=512, window=None, rope_base=10000.0, eps=1e-6, tie_weights=True)`` with ``model(ids)`` and
``model.forward_cached(ids, cache)`` as chapter 8's ``GPT``, so ``companion.keras.gpt.generate`` runs it
unchanged; and ``ModernBlock``. The cache stores, per block, the rotated keys and the values of the key/value
heads only: ``(batch, num_kv_heads, cached_len, head_dim)`` each.
"""

from __future__ import annotations

import keras
from keras import ops

from .gpt import cache_length
from .grouped import GroupedQueryAttention
from .masking import causal_mask
from .modern import RMSNorm, SwiGLU, sliding_window_mask
from .text import as_ids, check_ids

__all__ = ["ModernBlock", "ModernDecoder"]

register = keras.saving.register_keras_serializable(package="companion")


@register
class ModernBlock(keras.layers.Layer):
    """``x + attn(attn_norm(x))``, then ``x + ffn(ffn_norm(x))``: pre-RMSNorm residual block.

    Weights: ``attn_norm``, ``ffn_norm`` (:class:`RMSNorm`), ``attn`` (:class:`GroupedQueryAttention`), ``ffn``
    (:class:`SwiGLU`).
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, d_ff: int, max_len: int = 512,
                 rope_base: float = 10000.0, eps: float = 1e-6, **kwargs):
        super().__init__(**kwargs)
        self.config = {"d_model": d_model, "num_heads": num_heads, "num_kv_heads": num_kv_heads, "d_ff": d_ff,
                       "max_len": max_len, "rope_base": rope_base, "eps": eps}
        self.attn_norm = RMSNorm(d_model, eps, name="attn_norm")
        self.attn = GroupedQueryAttention(d_model, num_heads, num_kv_heads, max_len, rope_base, name="attn")
        self.ffn_norm = RMSNorm(d_model, eps, name="ffn_norm")
        self.ffn = SwiGLU(d_model, d_ff, name="ffn")

    def build(self, x_shape, mask_shape=None):
        for layer in (self.attn_norm, self.attn, self.ffn_norm, self.ffn):
            layer.build(x_shape)

    def call(self, x, mask=None):
        """``x`` ``(batch, length, d_model)`` -> same shape. Pass ``mask`` by keyword."""
        x = x + self.attn(self.attn_norm(x), mask=mask)
        return x + self.ffn(self.ffn_norm(x))

    def forward_cached(self, x, past=None, mask=None):
        """The new positions ``x`` ``(batch, new_len, d_model)`` given the cached ``past`` -> same shape and the
        grown ``(k, v)``, each ``(batch, num_kv_heads, past_len + new_len, head_dim)``."""
        attended, kv = self.attn.forward_cached(self.attn_norm(x), past, mask)
        x = x + attended
        return x + self.ffn(self.ffn_norm(x)), kv

    def compute_output_shape(self, x_shape, mask_shape=None):
        return x_shape

    def compute_mask(self, *args, **kwargs):
        return None

    def get_config(self):
        return {**super().get_config(), **self.config}


@register
class ModernDecoder(keras.Model):
    """A Llama-style language model: ids ``(batch, length)`` -> logits ``(batch, length, vocab_size)``.

    Args:
        vocab_size: number of token ids.
        d_model, num_heads, num_layers, d_ff: width, query heads, blocks, SwiGLU hidden width.
        num_kv_heads: key/value heads (divides ``num_heads``): ``num_heads`` for MHA, 1 for MQA.
        max_len: longest sequence (the rotary tables' length; no weight depends on it).
        window: if set, each position sees only the ``window`` latest positions, itself included.
        rope_base: base of the rotary angles.
        eps: RMSNorm's epsilon.
        tie_weights: logits ``h @ E^T`` with the token table ``E`` instead of a separate ``head``.

    Weights: ``token_embed`` (normal, standard deviation 0.02), ``blocks`` (:class:`ModernBlock`, matrices
    Glorot-uniform as in the torch twin), the final ``norm`` (:class:`RMSNorm`), ``head`` when untied.
    """

    def __init__(self, vocab_size: int, d_model: int = 512, num_heads: int = 8, num_kv_heads: int = 2,
                 num_layers: int = 6, d_ff: int = 1376, max_len: int = 512, window: int | None = None,
                 rope_base: float = 10000.0, eps: float = 1e-6, tie_weights: bool = True, **kwargs):
        super().__init__(**kwargs)
        for name, value in {"vocab_size": vocab_size, "d_model": d_model, "num_layers": num_layers, "d_ff": d_ff,
                            "max_len": max_len, "window": 1 if window is None else window}.items():
            if value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value}")
        self.config = {"vocab_size": vocab_size, "d_model": d_model, "num_heads": num_heads,
                       "num_kv_heads": num_kv_heads, "num_layers": num_layers, "d_ff": d_ff, "max_len": max_len,
                       "window": window, "rope_base": rope_base, "eps": eps, "tie_weights": tie_weights}
        self.vocab_size, self.d_model, self.num_heads, self.num_kv_heads = vocab_size, d_model, num_heads, num_kv_heads
        self.num_layers, self.d_ff, self.max_len, self.window = num_layers, d_ff, max_len, window
        self.tie_weights = tie_weights
        init = keras.initializers.RandomNormal(stddev=0.02)
        self.token_embed = keras.layers.Embedding(vocab_size, d_model, embeddings_initializer=init, name="token_embed")
        self.blocks = [ModernBlock(d_model, num_heads, num_kv_heads, d_ff, max_len, rope_base, eps,
                                   name=f"blocks_{i}") for i in range(num_layers)]
        self.norm = RMSNorm(d_model, eps, name="norm")
        self.head = None if tie_weights else keras.layers.Dense(vocab_size, use_bias=False, name="head")

    def build(self, ids_shape):
        if len(ids_shape) != 2:
            raise ValueError(f"ids must have shape (batch, length); got shape {tuple(ids_shape)}")
        x_shape = (*ids_shape, self.d_model)
        self.token_embed.build(ids_shape)
        for block in self.blocks:
            block.build(x_shape)
        self.norm.build(x_shape)
        if self.head is not None:
            self.head.build(x_shape)

    def mask(self, length: int, past: int = 0):
        """The rows ``past..length-1`` of the causal (or sliding-window) mask, ``(1, 1, length - past, length)``;
        None for one new position without a window (it may see everything)."""
        if self.window is None:
            return causal_mask(length)[:, :, past:] if length - past > 1 else None
        return sliding_window_mask(length, self.window)[:, :, past:]

    def _check(self, ids, past: int = 0) -> None:
        check_ids(ids, self.vocab_size, "ids")
        length = ids.shape[1]
        if length is not None and not past < length <= self.max_len:  # None while tracing a graph
            raise ValueError(
                f"ids must have between {past + 1} and max_len={self.max_len} tokens"
                + (f" (the cache holds {past})" if past else "") + f"; got {length}"
            )

    def _logits(self, h):
        """``(batch, n, d_model)`` -> ``(batch, n, vocab_size)``: the final RMSNorm, then the output layer."""
        h = self.norm(h)
        if self.head is None:
            return ops.matmul(h, ops.transpose(ops.cast(self.token_embed.embeddings, h.dtype)))
        return self.head(h)

    def call(self, ids, training=None):
        """ids ``(batch, length)`` -> logits ``(batch, length, vocab_size)``; position ``i`` sees tokens ``0..i``
        (the ``window`` latest of them when a window is set)."""
        ids = as_ids(ids)
        self._check(ids)
        x = self.token_embed(ids)  # (batch, length, d_model): no position vector, RoPE acts inside attention
        mask = self.mask(ops.shape(ids)[1])
        for block in self.blocks:
            x = block(x, mask=mask)
        return self._logits(x)

    def forward_cached(self, ids, cache=None):
        """The logits of the positions of ``ids`` ``(batch, length)`` that ``cache`` does not hold yet, and the
        grown cache (one ``(k, v)`` per block, each ``(batch, num_kv_heads, cached_len, head_dim)``).

        Returns logits ``(batch, length - cached_len, vocab_size)``, equal to ``model(ids)[:, cached_len:]``.
        The model must be built (called once) or is built here.
        """
        ids = as_ids(ids)
        if not self.built:
            self.build(tuple(ids.shape))
        past = cache_length(cache)
        self._check(ids, past)
        if cache is not None and (len(cache) != self.num_layers or cache[0][0].shape[0] != ids.shape[0]):
            raise ValueError(
                f"cache must hold one (k, v) per block ({self.num_layers}) for a batch of {ids.shape[0]}; got "
                f"{len(cache)} pairs for a batch of {cache[0][0].shape[0]}"
            )
        x = self.token_embed(ids[:, past:])
        mask = self.mask(ids.shape[1], past)
        grown = []
        for index, block in enumerate(self.blocks):
            x, kv = block.forward_cached(x, None if cache is None else cache[index], mask)
            grown.append(kv)
        return self._logits(x), grown

    def get_config(self):
        return {**super().get_config(), **self.config}
