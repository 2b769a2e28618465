"""Sinusoidal positional encoding in NumPy: the oracle the torch and keras versions are tested against."""

from __future__ import annotations

import numpy as np


def sinusoidal_positional_encoding(max_len: int, d_model: int) -> np.ndarray:
    """The fixed table of "Attention Is All You Need", section 3.5, shape ``(max_len, d_model)``, float32.

    ``PE[pos, 2i] = sin(pos / 10000**(2i / d_model))`` and ``PE[pos, 2i + 1] = cos(pos / 10000**(2i / d_model))``.
    Column pair ``(2i, 2i + 1)`` is a sine and a cosine of one frequency; the wavelengths grow geometrically with
    ``i``, from 2*pi towards 10000*2*pi (the last pair stops one ratio short). The angles are computed in float64:
    in float32 the angle of position 500 already carries a rounding error of about 3e-5.
    """
    if d_model <= 0 or d_model % 2:
        raise ValueError(f"d_model must be a positive even number (sine and cosine columns pair up); got {d_model}")
    if max_len <= 0:
        raise ValueError(f"max_len must be positive; got {max_len}")
    position = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)  # (d_model / 2,)
    angle = position / 10000.0 ** (two_i / d_model)  # (max_len, d_model / 2)
    pe = np.empty((max_len, d_model))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return pe.astype(np.float32)


def add_positional_encoding(x: np.ndarray, max_len: int | None = None) -> np.ndarray:
    """``x + PE[:seq_len]`` for ``x`` of shape ``(batch, seq_len, d_model)`` (no dropout: the oracle is exact)."""
    seq_len, d_model = x.shape[-2], x.shape[-1]
    if max_len is not None and seq_len > max_len:
        raise ValueError(f"sequence length {seq_len} exceeds max_len={max_len}")
    return x + sinusoidal_positional_encoding(seq_len, d_model).astype(x.dtype)
