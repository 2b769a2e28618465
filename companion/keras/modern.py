"""The blocks of today's decoder-only models in Keras 3 (``keras.ops`` only, so any backend): RMSNorm, rotary
position embedding (RoPE), the SwiGLU feed-forward network and the sliding-window causal mask (same names and
arguments in ``companion.torch.modern``; the NumPy oracle is ``companion.reference.modern``)."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

__all__ = ["RMSNorm", "RotaryEmbedding", "SwiGLU", "rotate_half", "sliding_window_mask"]

register = keras.saving.register_keras_serializable(package="companion")


@register
class RMSNorm(keras.layers.Layer):
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last axis (Zhang and Sennrich, 2019).

    LayerNorm without subtracting the mean and without the shift ``beta``: one statistic instead of two, and
    ``d_model`` weights instead of ``2 * d_model``. As in Llama, float16 and bfloat16 inputs are normalised in
    float32 and cast back before the gain.

    Args:
        d_model: size normalised over.
        eps: added to the mean square inside the square root.

    Weight: ``weight`` ``(d_model,)``, starting at ones.
    """

    def __init__(self, d_model: int, eps: float = 1e-6, **kwargs):
        super().__init__(**kwargs)
        if d_model < 1:
            raise ValueError(f"d_model must be a positive integer; got {d_model}")
        self.d_model, self.eps = d_model, eps

    def build(self, input_shape=None):
        self.weight = self.add_weight(name="weight", shape=(self.d_model,), initializer="ones")

    def call(self, x):
        """``(..., d_model)`` -> same shape and dtype."""
        if len(x.shape) < 1 or x.shape[-1] not in (None, self.d_model):
            raise ValueError(f"x must have shape (..., d_model={self.d_model}); got shape {tuple(x.shape)}")
        dtype = keras.backend.standardize_dtype(x.dtype)
        wide = ops.cast(x, "float32") if dtype in ("float16", "bfloat16") else x
        normed = wide * ops.rsqrt(ops.mean(ops.square(wide), axis=-1, keepdims=True) + self.eps)
        return ops.cast(self.weight, dtype) * ops.cast(normed, dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "eps": self.eps}


def rotate_half(x):
    """``(x1, x2) -> (-x2, x1)`` on the two halves of the last axis: a quarter turn of every pair."""
    x1, x2 = ops.split(x, 2, axis=-1)
    return ops.concatenate([-x2, x1], axis=-1)


@register
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding (Su et al., 2021) in the half-split layout of GPT-NeoX, Hugging Face transformers
    and Keras Hub.

    The pair ``(x_i, x_{i + head_dim/2})`` of a query or key at position ``p`` is turned by the angle
    ``p * base**(-2i / head_dim)``. A rotation preserves lengths, and the dot product of two vectors rotated by
    ``a`` and ``b`` depends only on ``a - b``: the score of a query at ``m`` and a key at ``n`` sees only ``m - n``.

    Args:
        head_dim: width of one head (even).
        max_len: the cosines and sines are tabulated for positions ``0 .. max_len - 1``.
        base: the wavelength scale (10000 in the paper and Llama 2; larger bases in later models).

    No weights: the tables are float64 NumPy constants, cast to the input's dtype.
    """

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0, **kwargs):
        super().__init__(**kwargs)
        if head_dim < 2 or head_dim % 2:
            raise ValueError(f"head_dim must be a positive even integer (RoPE rotates pairs); got {head_dim}")
        if max_len < 1:
            raise ValueError(f"max_len must be a positive integer; got {max_len}")
        self.head_dim, self.max_len, self.base = head_dim, max_len, base
        frequencies = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (head_dim // 2,)
        angles = np.arange(max_len, dtype=np.float64)[:, None] * frequencies[None, :]
        angles = np.concatenate([angles, angles], axis=-1)  # (max_len, head_dim): both halves of a pair turn together
        self.cos, self.sin = np.cos(angles), np.sin(angles)

    def call(self, x, offset: int = 0):
        """``x`` ``(batch, num_heads, seq_len, head_dim)`` whose row ``t`` sits at position ``offset + t`` -> the
        rotated tensor, same shape and dtype. ``offset`` is the length of the key/value cache."""
        if len(x.shape) != 4 or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"x must have shape (batch, num_heads, seq_len, head_dim={self.head_dim}); got shape {tuple(x.shape)}"
            )
        seq_len = x.shape[2]
        if seq_len is not None and not 0 <= offset <= self.max_len - seq_len:
            raise ValueError(
                f"offset + seq_len must fit in max_len={self.max_len}; got offset {offset} and seq_len {seq_len}"
            )
        dtype = keras.backend.standardize_dtype(x.dtype)
        length = ops.shape(x)[2]
        cos = ops.slice(ops.convert_to_tensor(self.cos, dtype), (offset, 0), (length, self.head_dim))
        sin = ops.slice(ops.convert_to_tensor(self.sin, dtype), (offset, 0), (length, self.head_dim))
        return x * cos + rotate_half(x) * sin

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "head_dim": self.head_dim, "max_len": self.max_len, "base": self.base}


@register
class SwiGLU(keras.layers.Layer):
    """``w2(silu(w1 x) * w3 x)``: the gated feed-forward network of Llama (Shazeer, 2020), without biases.

    ``w1`` makes a gate, passed through ``silu(z) = z * sigmoid(z)``, that multiplies the linear branch ``w3``
    element by element. Three matrices instead of two: Llama takes ``d_ff`` about ``8/3 * d_model`` so that the
    count matches a ReLU network of ``4 * d_model``.

    Args:
        d_model: input and output width.
        d_ff: hidden width.

    Weights: ``w1``, ``w3`` ``Dense(d_ff, use_bias=False)`` and ``w2`` ``Dense(d_model, use_bias=False)``.
    """

    def __init__(self, d_model: int, d_ff: int, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_ff = d_model, d_ff
        self.w1 = keras.layers.Dense(d_ff, use_bias=False, name="w1")
        self.w2 = keras.layers.Dense(d_model, use_bias=False, name="w2")
        self.w3 = keras.layers.Dense(d_ff, use_bias=False, name="w3")

    def build(self, input_shape):
        self.w1.build(input_shape)
        self.w3.build(input_shape)
        self.w2.build((*input_shape[:-1], self.d_ff))

    def call(self, x):
        """``(batch, seq_len, d_model)`` -> ``(batch, seq_len, d_model)``."""
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, seq_len, d_model={self.d_model}); got {tuple(x.shape)}")
        return self.w2(ops.silu(self.w1(x)) * self.w3(x))

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.d_model)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff}


def sliding_window_mask(length: int, window: int):
    """bool ``(1, 1, length, length)``: query ``i`` may attend to keys ``i - window + 1 .. i`` (True = may attend).

    The window holds ``window`` positions, the query's own included, as in Hugging Face transformers (its
    ``sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``), in xformers' ``make_local_attention(window)``
    that Mistral's own implementation uses (``mistral/cache.py``), and in the rolling cache of ``window`` entries
    from which Mistral's first ``one_file_ref.py`` generates. The Mistral 7B paper, and the prompt mask of that
    ``one_file_ref.py`` (mistralai/mistral-src, commit c18d5b9, 2023-09-27), let position ``i`` see
    ``i - window .. i``, one position more. With a key/value cache of ``past`` positions, the rows of the new
    positions are ``mask[:, :, past:]``, as with ``causal_mask``. ``window >= length`` gives the causal mask.
    """
    if window < 1:
        raise ValueError(f"window must be a positive integer; got {window}")
    positions = ops.arange(length)
    query, key = ops.expand_dims(positions, 1), ops.expand_dims(positions, 0)
    allowed = ops.logical_and(key <= query, key > query - window)
    return ops.expand_dims(allowed, (0, 1))
