"""Multi-head attention in Keras 3: ``num_heads`` attentions of width ``d_model // num_heads`` side by side."""

from __future__ import annotations

import keras
from keras import ops

from .attention import check_mask, scaled_dot_product_attention


@keras.saving.register_keras_serializable(package="companion")
class MultiHeadAttention(keras.layers.Layer):
    """Project, split into heads, attend per head, merge, project back.

    Args:
        d_model: width of the inputs and of the output.
        num_heads: number of heads; must divide ``d_model``. Each head has width ``d_head = d_model // num_heads``.
        dropout: dropout on the attention weights during training.

    The four projections ``wq, wk, wv, wo`` are ``keras.layers.Dense(d_model)`` with bias:
    ``4 * d_model**2 + 4 * d_model`` parameters, whatever the number of heads.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.d_model, self.num_heads, self.d_head = d_model, num_heads, d_model // num_heads
        self.dropout = dropout
        # The projections follow this layer's dtype policy (float16, mixed_bfloat16, ...).
        self.wq = keras.layers.Dense(d_model, name="wq", dtype=self.dtype_policy)
        self.wk = keras.layers.Dense(d_model, name="wk", dtype=self.dtype_policy)
        self.wv = keras.layers.Dense(d_model, name="wv", dtype=self.dtype_policy)
        self.wo = keras.layers.Dense(d_model, name="wo", dtype=self.dtype_policy)
        self.supports_masking = True  # see compute_mask
        # Dropout draws random numbers; a layer-owned generator keeps that reproducible and traceable.
        self.seed_generator = keras.random.SeedGenerator() if dropout > 0 else None

    def build(self, query_shape, key_shape=None, value_shape=None):
        key_shape = query_shape if key_shape is None else key_shape
        value_shape = key_shape if value_shape is None else value_shape
        # Check before building: a Dense built on the wrong width would stay wrong for every later call.
        for name, shape in (("query", query_shape), ("key", key_shape), ("value", value_shape)):
            self._check_shape(name, tuple(shape))
        self.wq.build(query_shape)
        self.wk.build(key_shape)
        self.wv.build(value_shape)
        self.wo.build(query_shape)

    def split_heads(self, x):
        """``(batch, seq_len, d_model)`` -> ``(batch, num_heads, seq_len, d_head)``.

        Reshape *then* transpose: each position keeps its own d_model numbers, cut into num_heads slices. A plain
        reshape to ``(batch, num_heads, seq_len, d_head)`` would mix positions across heads.
        """
        batch, seq_len = ops.shape(x)[0], ops.shape(x)[1]
        x = ops.reshape(x, (batch, seq_len, self.num_heads, self.d_head))
        return ops.transpose(x, (0, 2, 1, 3))

    def merge_heads(self, x):
        """``(batch, num_heads, seq_len, d_head)`` -> ``(batch, seq_len, d_model)``, the inverse of split_heads."""
        batch, seq_len = ops.shape(x)[0], ops.shape(x)[2]
        return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (batch, seq_len, self.d_model))

    def call(self, query, key, value, mask=None, return_weights: bool = False, training=None):
        """Attend from each query position to the key/value positions.

        Args:
            query: ``(batch, query_len, d_model)``.
            key, value: ``(batch, key_len, d_model)``; pass the same tensor three times for self-attention.
            mask: boolean, True = may attend, broadcastable to ``(batch, num_heads, query_len, key_len)``.
            return_weights: also return the attention weights.
            training: whether dropout is active (Keras sets it inside ``fit``).

        Returns:
            ``(batch, query_len, d_model)``, or ``(out, weights (batch, num_heads, query_len, key_len))``.
        """
        for name, x in (("query", query), ("key", key), ("value", value)):
            self._check_shape(name, tuple(x.shape))
        if None not in (key.shape[1], value.shape[1]) and key.shape[1] != value.shape[1]:
            raise ValueError(
                f"value must have shape (batch, key_len={key.shape[1]}, d_model) like key; got {tuple(value.shape)}"
            )
        check_mask(mask, (query.shape[0], self.num_heads, query.shape[1], key.shape[1]))
        q = self.split_heads(self.wq(query))  # (batch, num_heads, query_len, d_head)
        k = self.split_heads(self.wk(key))  # (batch, num_heads, key_len, d_head)
        v = self.split_heads(self.wv(value))  # (batch, num_heads, key_len, d_head)
        heads, weights = scaled_dot_product_attention(
            q, k, v, mask, return_weights=True, dropout=self.dropout, training=bool(training), seed=self.seed_generator
        )
        out = self.wo(self.merge_heads(heads))  # (batch, query_len, d_model)
        return (out, weights) if return_weights else out

    # --- Incremental decoding (the key/value cache) ---------------------------------------------------------------
    # Generating token t with the plain call recomputes the keys and values of tokens 0..t-1, which have not
    # changed. The three methods below let a decoder keep them: project the keys and values once
    # (project_key_value), attend with them later (attend_projected), or, for self-attention, append the new
    # positions' keys and values to those of the earlier ones (self_attention_cached). They are plain methods, not
    # Keras calls, so a cache (a tuple of tensors) goes in and out untouched; the layer must be built.

    def project_key_value(self, key, value):
        """``key``, ``value`` ``(batch, key_len, d_model)`` -> projected and split ``k``, ``v``, each
        ``(batch, num_heads, key_len, d_head)``: what a cache stores."""
        for name, x in (("key", key), ("value", value)):
            self._check_shape(name, tuple(x.shape))
        return self.split_heads(self.wk(key)), self.split_heads(self.wv(value))

    def attend_projected(self, query, k, v, mask=None, training=None):
        """Attend from ``query`` ``(batch, query_len, d_model)`` to keys and values already projected by
        :meth:`project_key_value`, ``k`` and ``v`` ``(batch, num_heads, key_len, d_head)``.

        Gives the same ``(batch, query_len, d_model)`` as ``call(query, key, value, mask)`` when ``k, v`` are
        ``project_key_value(key, value)``. ``mask`` is broadcastable to ``(batch, num_heads, query_len, key_len)``.
        """
        self._check_shape("query", tuple(query.shape))
        expected = (query.shape[0], self.num_heads, k.shape[2] if len(k.shape) == 4 else -1, self.d_head)
        for name, x in (("k", k), ("v", v)):
            if tuple(x.shape) != expected:
                raise ValueError(
                    f"{name} must have shape (batch={expected[0]}, num_heads={self.num_heads}, key_len, "
                    f"d_head={self.d_head}) like k; got shape {tuple(x.shape)}"
                )
        check_mask(mask, (query.shape[0], self.num_heads, query.shape[1], k.shape[2]))
        q = self.split_heads(self.wq(query))  # (batch, num_heads, query_len, d_head)
        heads = scaled_dot_product_attention(
            q, k, v, mask, dropout=self.dropout, training=bool(training), seed=self.seed_generator
        )
        return self.wo(self.merge_heads(heads))  # (batch, query_len, d_model)

    def self_attention_cached(self, x, past=None, mask=None, training=None):
        """Self-attention of the new positions ``x`` ``(batch, new_len, d_model)`` over the earlier positions and
        themselves.

        Args:
            past: ``(k, v)`` of the earlier positions, each ``(batch, num_heads, past_len, d_head)``, or None.
            mask: broadcastable to ``(batch, num_heads, new_len, past_len + new_len)``; None lets every new position
                see every key (right for a single new position; several need a causal mask).

        Returns:
            ``(batch, new_len, d_model)`` and the grown cache ``(k, v)``, each ``(batch, num_heads,
            past_len + new_len, d_head)``.
        """
        k, v = self.project_key_value(x, x)
        if past is not None:
            k, v = ops.concatenate([past[0], k], axis=2), ops.concatenate([past[1], v], axis=2)
        return self.attend_projected(x, k, v, mask, training=training), (k, v)

    def compute_mask(self, *args, **kwargs):
        # Our `mask` is an attention mask, not a Keras per-timestep mask: the output carries no mask (a loss or a
        # later layer would misread it). Together with `supports_masking` this also keeps Keras from warning that
        # the mask is "destroyed" when it is passed as `mask=...`.
        return None

    def _check_shape(self, name: str, shape: tuple) -> None:
        if len(shape) != 3 or shape[-1] not in (None, self.d_model):
            raise ValueError(f"{name} must have shape (batch, seq_len, d_model={self.d_model}); got shape {shape}")

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads, "dropout": self.dropout}
