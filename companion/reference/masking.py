"""Attention masks in NumPy (the oracle for ``companion.torch.masking`` and ``companion.keras.masking``).

One convention everywhere: a boolean mask, ``True`` = *may attend*, broadcastable to
``(batch, num_heads, query_len, key_len)``.
"""

from __future__ import annotations

import numpy as np


def padding_mask(ids: np.ndarray, pad_id: int = 0) -> np.ndarray:
    """ids ``(batch, key_len)`` -> bool ``(batch, 1, 1, key_len)``, True where the token is not padding."""
    ids = np.asarray(ids)
    return (ids != pad_id)[:, None, None, :]


def causal_mask(length: int) -> np.ndarray:
    """bool ``(1, 1, length, length)``: query ``i`` may attend to keys ``0..i`` (lower triangle, diagonal included)."""
    return np.tril(np.ones((length, length), dtype=bool))[None, None]


def combine_masks(*masks: np.ndarray | None) -> np.ndarray | None:
    """Logical AND of the masks with broadcasting; ``None`` entries are skipped, all ``None`` gives ``None``."""
    result = None
    for mask in masks:
        if mask is None:
            continue
        result = np.asarray(mask, dtype=bool) if result is None else np.logical_and(result, mask)
    return result
