"""Sinusoidal positional encoding in Keras 3: tell the model *where* each token sits.

Self-attention is permutation-invariant: shuffle the tokens and each one gets the same output, only shuffled.
Adding a position-dependent vector to every embedding breaks that symmetry.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops


def sinusoidal_positional_encoding(max_len: int, d_model: int):
    """The fixed table of "Attention Is All You Need", section 3.5, shape ``(max_len, d_model)``, float32 tensor.

    ``PE[pos, 2i] = sin(pos / 10000**(2i / d_model))`` and ``PE[pos, 2i + 1] = cos(pos / 10000**(2i / d_model))``:
    each column pair is one frequency, and the wavelengths form a geometric progression from 2*pi towards
    10000*2*pi (the last pair stops one ratio short).
    """
    if d_model <= 0 or d_model % 2:
        raise ValueError(f"d_model must be a positive even number (sine and cosine columns pair up); got {d_model}")
    if max_len <= 0:
        raise ValueError(f"max_len must be positive; got {max_len}")
    # The table is a constant, computed once: NumPy in float64 gives the same numbers on every backend (JAX would
    # silently drop to float32, and in float32 position 500 times a frequency near 1 is off by about 3e-5).
    position = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)  # (d_model / 2,)
    angle = position / 10000.0 ** (two_i / d_model)  # (max_len, d_model / 2)
    pe = np.empty((max_len, d_model))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return ops.convert_to_tensor(pe, dtype="float32")


@keras.saving.register_keras_serializable(package="companion")
class PositionalEncoding(keras.layers.Layer):
    """Add the sinusoidal table to a batch of embeddings, then apply dropout.

    Args:
        d_model: embedding size (even).
        max_len: longest sequence the table covers.
        dropout: dropout rate applied to the sum (0.1 in the paper).
    """

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.max_len = d_model, max_len
        self.dropout = keras.layers.Dropout(dropout)
        # A plain tensor, not a weight: never trained, not saved (it is recomputed from max_len and d_model).
        self.pe = sinusoidal_positional_encoding(max_len, d_model)

    def call(self, x, training=None):
        """``(batch, seq_len, d_model)`` -> ``(batch, seq_len, d_model)``."""
        if len(x.shape) != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, seq_len, d_model={self.d_model}); got {tuple(x.shape)}")
        seq_len = x.shape[1]
        if seq_len is not None and seq_len > self.max_len:
            raise ValueError(
                f"x has seq_len={seq_len} but the positional table stops at max_len={self.max_len}; "
                f"build the model with max_len >= {seq_len}"
            )
        pe = ops.slice(self.pe, (0, 0), (ops.shape(x)[1], self.d_model))  # (seq_len, d_model)
        return self.dropout(x + ops.cast(pe, x.dtype), training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "max_len": self.max_len, "dropout": self.dropout.rate}
