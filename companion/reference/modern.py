"""The blocks of today's decoder-only models in NumPy (the oracle): RMSNorm, rotary position embedding (RoPE),
the SwiGLU feed-forward network and the sliding-window causal mask.

Shapes follow the framework code: activations ``(batch, seq_len, d_model)``, per-head tensors
``(batch, num_heads, seq_len, head_dim)``; weights are passed explicitly in the ``x @ w`` convention.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "interleave_permutation",
    "rms_norm",
    "rotary_angles",
    "rotary_embedding",
    "rotary_embedding_interleaved",
    "rotate_half",
    "sliding_window_mask",
    "swiglu",
]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last axis: LayerNorm without the mean and the shift.

    Args:
        x: ``(..., d_model)``.
        weight: ``(d_model,)``, the learned gain.
    """
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotary_angles(positions: np.ndarray, head_dim: int, base: float = 10000.0) -> np.ndarray:
    """The rotation angles ``position * base**(-2i / head_dim)``, ``(len(positions), head_dim // 2)``.

    Pair ``i`` turns by ``base**(-2i / head_dim)`` radians per position: the first pair fast, the last slowly.
    """
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs of numbers); got {head_dim}")
    frequencies = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (head_dim // 2,)
    return np.asarray(positions, dtype=np.float64)[:, None] * frequencies[None, :]


def rotate_half(x: np.ndarray) -> np.ndarray:
    """``(x1, x2) -> (-x2, x1)`` on the two halves of the last axis: a quarter turn of every pair ``(x_i,
    x_{i + head_dim/2})``."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotary_embedding(x: np.ndarray, offset: int = 0, base: float = 10000.0) -> np.ndarray:
    """Rotate each pair ``(x_i, x_{i + head_dim/2})`` of ``x`` by its position's angle (the half-split layout).

    Args:
        x: ``(..., seq_len, head_dim)``; row ``t`` sits at position ``offset + t``.
        offset: position of the first row (the length of a key/value cache).

    Returns:
        same shape: ``x * cos + rotate_half(x) * sin`` with ``cos``, ``sin`` of the angles repeated for both halves.
    """
    angles = rotary_angles(np.arange(offset, offset + x.shape[-2]), x.shape[-1], base)  # (seq_len, head_dim/2)
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)
    return x * cos + rotate_half(x) * sin


def rotary_embedding_interleaved(x: np.ndarray, offset: int = 0, base: float = 10000.0) -> np.ndarray:
    """The RoFormer paper's layout: rotate each *adjacent* pair ``(x_{2i}, x_{2i+1})`` by the angle of pair ``i``.

    The same rotations as :func:`rotary_embedding` on other pairs of coordinates:
    ``rotary_embedding_interleaved(x)[..., p] == rotary_embedding(x[..., p])`` with
    ``p = interleave_permutation(head_dim)``.
    """
    angles = rotary_angles(np.arange(offset, offset + x.shape[-2]), x.shape[-1], base)  # (seq_len, head_dim/2)
    cos, sin = np.cos(angles), np.sin(angles)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x, dtype=np.result_type(x, np.float64))
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def interleave_permutation(head_dim: int) -> np.ndarray:
    """The order of coordinates that turns adjacent pairs into half-split pairs: even indices, then odd ones."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def swiglu(x: np.ndarray, params: dict[str, np.ndarray]) -> np.ndarray:
    """``(silu(x @ w1) * (x @ w3)) @ w2``: a gated feed-forward network without biases.

    Args:
        x: ``(batch, seq_len, d_model)``.
        params: ``w1`` and ``w3`` ``(d_model, d_ff)``, ``w2`` ``(d_ff, d_model)``.
    """
    gate = x @ params["w1"]
    return (gate / (1 + np.exp(-gate)) * (x @ params["w3"])) @ params["w2"]


def sliding_window_mask(length: int, window: int) -> np.ndarray:
    """bool ``(1, 1, length, length)``: query ``i`` may attend to keys ``i - window + 1 .. i``, the ``window``
    latest positions, itself included."""
    if window < 1:
        raise ValueError(f"window must be a positive integer; got {window}")
    query, key = np.arange(length)[:, None], np.arange(length)[None, :]
    return ((key <= query) & (key > query - window))[None, None]
