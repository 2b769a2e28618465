"""Layer normalization, the position-wise feed-forward network and Add & Norm in NumPy (the oracle).

Weights follow the ``x @ W + b`` convention: ``W`` has shape ``(in_features, out_features)``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Normalize each position's vector over its last axis, then scale by ``gamma`` and shift by ``beta``.

    ``(x - mean) / sqrt(var + eps) * gamma + beta`` with the *biased* variance (divide by ``d_model``) and ``eps``
    inside the square root, exactly as ``torch.nn.LayerNorm`` and ``keras.layers.LayerNormalization`` compute it.

    Args:
        x: ``(..., d_model)``.
        gamma, beta: ``(d_model,)``.
    """
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)  # ddof=0: the biased variance
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def feed_forward(x: np.ndarray, params: dict[str, np.ndarray]) -> np.ndarray:
    """``FFN(x) = max(0, x W1 + b1) W2 + b2``, applied to every position separately.

    Args:
        x: ``(batch, seq_len, d_model)``.
        params: ``w1 (d_model, d_ff)``, ``b1 (d_ff,)``, ``w2 (d_ff, d_model)``, ``b2 (d_model,)``.

    Returns:
        ``(batch, seq_len, d_model)``.
    """
    hidden = relu(x @ params["w1"] + params["b1"])  # (batch, seq_len, d_ff)
    return hidden @ params["w2"] + params["b2"]


def add_norm(
    x: np.ndarray,
    sublayer: Callable[[np.ndarray], np.ndarray],
    gamma: np.ndarray,
    beta: np.ndarray,
    norm_first: bool = False,
    eps: float = 1e-5,
) -> np.ndarray:
    """A residual connection around ``sublayer`` plus layer normalization.

    Post-LN (the paper, ``norm_first=False``): ``LayerNorm(x + sublayer(x))``.
    Pre-LN (``norm_first=True``): ``x + sublayer(LayerNorm(x))``; the residual path stays un-normalized.

    Args:
        x: ``(batch, seq_len, d_model)``.
        sublayer: maps ``(batch, seq_len, d_model)`` to the same shape.
    """
    if norm_first:
        return x + sublayer(layer_norm(x, gamma, beta, eps))
    return layer_norm(x + sublayer(x), gamma, beta, eps)
