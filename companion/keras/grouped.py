"""Grouped-query attention with rotary positions in Keras 3, and its key/value cache (same names and arguments in
``companion.torch.grouped``; the oracle is ``companion.reference.grouped``)."""

from __future__ import annotations

import keras
from keras import ops

from .attention import check_mask, scaled_dot_product_attention
from .modern import RotaryEmbedding

__all__ = ["GroupedQueryAttention", "repeat_kv"]


def repeat_kv(x, group: int):
    """``(batch, num_kv_heads, seq_len, head_dim)`` -> ``(batch, num_kv_heads * group, seq_len, head_dim)``: each
    key/value head repeated for the ``group`` query heads that read it (query head ``h`` reads ``h // group``)."""
    return x if group == 1 else ops.repeat(x, group, axis=1)


@keras.saving.register_keras_serializable(package="companion")
class GroupedQueryAttention(keras.layers.Layer):
    """Causal self-attention in which ``num_heads`` query heads share ``num_kv_heads`` key/value heads
    (Ainslie et al., 2023), with rotary positions on queries and keys and no biases, as in Llama.

    ``num_kv_heads == num_heads`` is multi-head attention, ``num_kv_heads == 1`` multi-query attention. Sharing
    shrinks the key/value projections and, above all, the key/value cache, by ``num_heads / num_kv_heads``.

    Args:
        d_model: width of the input and the output.
        num_heads: query heads; must divide ``d_model``; ``head_dim = d_model // num_heads``.
        num_kv_heads: key/value heads; must divide ``num_heads``.
        max_len: longest position the rotary tables cover.
        rope_base: base of the rotary angles; None for no rotary embedding.

    Weights: ``wq`` ``Dense(num_heads * head_dim)``, ``wk`` and ``wv`` ``Dense(num_kv_heads * head_dim)``, ``wo``
    ``Dense(d_model)``, all without bias.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, max_len: int = 512,
                 rope_base: float | None = 10000.0, **kwargs):
        super().__init__(**kwargs)
        if num_heads < 1 or d_model % num_heads:
            raise ValueError(f"num_heads ({num_heads}) must divide d_model ({d_model})")
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.head_dim, self.group = d_model // num_heads, num_heads // num_kv_heads
        self.max_len, self.rope_base = max_len, rope_base
        self.wq = keras.layers.Dense(num_heads * self.head_dim, use_bias=False, name="wq")
        self.wk = keras.layers.Dense(num_kv_heads * self.head_dim, use_bias=False, name="wk")
        self.wv = keras.layers.Dense(num_kv_heads * self.head_dim, use_bias=False, name="wv")
        self.wo = keras.layers.Dense(d_model, use_bias=False, name="wo")
        self.rotary = None if rope_base is None else RotaryEmbedding(self.head_dim, max_len, rope_base, name="rotary")

    def build(self, x_shape, mask_shape=None):
        for dense in (self.wq, self.wk, self.wv):
            dense.build(x_shape)
        self.wo.build((*x_shape[:-1], self.num_heads * self.head_dim))

    def _split(self, x, heads: int):
        """``(batch, seq_len, heads * head_dim)`` -> ``(batch, heads, seq_len, head_dim)``."""
        batch, seq_len = ops.shape(x)[0], ops.shape(x)[1]
        return ops.transpose(ops.reshape(x, (batch, seq_len, heads, self.head_dim)), (0, 2, 1, 3))

    def project(self, x, offset: int = 0):
        """``x`` ``(batch, seq_len, d_model)`` at positions ``offset..`` -> ``q`` ``(batch, num_heads, seq_len,
        head_dim)`` and ``k``, ``v`` ``(batch, num_kv_heads, seq_len, head_dim)``, queries and keys rotated."""
        if len(x.shape) != 3 or x.shape[-1] not in (None, self.d_model):
            raise ValueError(f"x must have shape (batch, seq_len, d_model={self.d_model}); got {tuple(x.shape)}")
        q = self._split(self.wq(x), self.num_heads)
        k = self._split(self.wk(x), self.num_kv_heads)
        v = self._split(self.wv(x), self.num_kv_heads)
        if self.rotary is not None:
            q, k = self.rotary(q, offset=offset), self.rotary(k, offset=offset)
        return q, k, v

    def attend(self, q, k, v, mask):
        """``q`` ``(batch, num_heads, query_len, head_dim)`` over ``k``, ``v`` ``(batch, num_kv_heads, key_len,
        head_dim)`` -> ``(batch, query_len, d_model)``, through ``wo``."""
        check_mask(mask, (q.shape[0], self.num_heads, q.shape[2], k.shape[2]))
        heads = scaled_dot_product_attention(q, repeat_kv(k, self.group), repeat_kv(v, self.group), mask)
        batch, query_len = ops.shape(q)[0], ops.shape(q)[2]
        merged = ops.reshape(ops.transpose(heads, (0, 2, 1, 3)), (batch, query_len, self.num_heads * self.head_dim))
        return self.wo(merged)

    def call(self, x, mask=None):
        """``x`` ``(batch, seq_len, d_model)`` -> same shape. ``mask``: boolean, True = may attend, broadcastable
        to ``(batch, num_heads, seq_len, seq_len)``, usually ``causal_mask`` or ``sliding_window_mask``.

        Pass ``mask`` by keyword: Keras fills an empty argument called ``mask`` with the input's own Keras mask.
        """
        q, k, v = self.project(x)
        return self.attend(q, k, v, mask)

    def forward_cached(self, x, past=None, mask=None):
        """Self-attention of the new positions ``x`` ``(batch, new_len, d_model)`` over the cached ones and
        themselves.

        Args:
            past: ``(k, v)`` of the earlier positions, each ``(batch, num_kv_heads, past_len, head_dim)``, keys
                already rotated; None to start. The new positions sit at ``past_len ..``.
            mask: broadcastable to ``(batch, num_heads, new_len, past_len + new_len)``.

        Returns:
            ``(batch, new_len, d_model)`` and the grown cache, each ``(batch, num_kv_heads, past_len + new_len,
            head_dim)``: only the key/value heads are stored.
        """
        past_len = 0 if past is None else int(past[0].shape[2])
        if past is not None and (past[0].shape[1] != self.num_kv_heads or past[0].shape[-1] != self.head_dim):
            raise ValueError(
                f"past keys must have shape (batch, num_kv_heads={self.num_kv_heads}, past_len, "
                f"head_dim={self.head_dim}); got {tuple(past[0].shape)}"
            )
        q, k, v = self.project(x, past_len)
        if past is not None:
            k, v = ops.concatenate([past[0], k], axis=2), ops.concatenate([past[1], v], axis=2)
        return self.attend(q, k, v, mask), (k, v)

    def compute_output_shape(self, x_shape, mask_shape=None):
        return x_shape

    def compute_mask(self, *args, **kwargs):
        # Our `mask` is an attention mask used up inside the layer, not a Keras per-timestep mask.
        return None

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads,
                "num_kv_heads": self.num_kv_heads, "max_len": self.max_len, "rope_base": self.rope_base}
