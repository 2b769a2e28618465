"""Token embeddings in Keras 3: ids ``(batch, seq_len)`` -> vectors ``(batch, seq_len, d_model)``."""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops


def check_ids(ids, vocab_size: int, name: str = "ids") -> None:
    """Raise ValueError unless ``ids`` is an integer tensor of shape (batch, seq_len) with values in range.

    Inside a compiled graph the values are unknown, so only the rank and dtype are checked there.
    """
    dtype = keras.backend.standardize_dtype(ids.dtype)
    if "int" not in dtype:
        raise ValueError(f"{name} must be an integer tensor of shape (batch, seq_len); got dtype {dtype}")
    if len(ids.shape) != 2:
        raise ValueError(f"{name} must have shape (batch, seq_len); got shape {tuple(ids.shape)}")
    try:
        values = ops.convert_to_numpy(ids)
    except Exception:  # a symbolic tensor (tf.function / jit): values are not known yet
        return
    if values.size and (values.min() < 0 or values.max() >= vocab_size):
        raise ValueError(
            f"{name} must lie in [0, vocab_size={vocab_size}); got values from {values.min()} to {values.max()}"
        )


def as_ids(ids):
    """Lists and NumPy arrays -> a backend integer tensor (tensors pass through)."""
    return ids if ops.is_tensor(ids) else ops.convert_to_tensor(np.asarray(ids))


def check_rank(shape, name: str = "ids") -> None:
    """Raise ValueError unless ``shape`` is ``(batch, seq_len)``.

    Keras builds a model from the shapes of its first inputs: this catches wrong ids there, before any weight
    exists.
    """
    if len(shape) != 2:
        raise ValueError(f"{name} must have shape (batch, seq_len); got shape {tuple(shape)}")


def check_length(ids, max_len: int, name: str = "ids", what: str = "max_len") -> None:
    """Raise ValueError unless ``ids`` ``(batch, seq_len)`` holds between 1 and ``max_len`` tokens.

    ``what`` names the limit in the message (``max_len`` for the paper's model, ``n_steps`` for source 004's).
    While a graph is traced the length may be unknown (None): it is checked when the values come.
    """
    length = ids.shape[1]
    if length is not None and not 1 <= length <= max_len:
        raise ValueError(f"{name} must have between 1 and {what}={max_len} tokens; got {length}")


@keras.saving.register_keras_serializable(package="companion")
class TokenEmbedding(keras.layers.Layer):
    """A learned vector per token id, optionally multiplied by sqrt(d_model) as in the paper.

    Looking up row ``i`` of the table is the same as multiplying the one-hot vector of ``i`` by the table; the
    lookup just skips the zeros. The sqrt(d_model) factor multiplies the norm of every row by sqrt(d_model), and
    that is all it does. Whether the scaled rows then match the positional encoding added next (norm
    sqrt(d_model / 2) per position) depends on how the table was initialised: ``keras.layers.Embedding``'s default,
    uniform in [-0.05, 0.05], makes them 0.05 * sqrt(2 * d_model / 3) times as large (0.33 at d_model = 64). The
    companion's Keras ``Transformer`` keeps that default; chapter 1 measures the ratio for other initialisations.

    Args:
        vocab_size: number of ids, PAD included.
        d_model: length of each vector.
        scale: multiply by sqrt(d_model).
    """

    def __init__(self, vocab_size: int, d_model: int, scale: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.d_model, self.scale = vocab_size, d_model, scale
        self.embedding = keras.layers.Embedding(vocab_size, d_model, name="embedding")

    def build(self, input_shape):
        self.embedding.build(input_shape)

    def call(self, ids):
        """ids ``(batch, seq_len)`` -> ``(batch, seq_len, d_model)``."""
        ids = ops.convert_to_tensor(np.asarray(ids) if isinstance(ids, list | tuple) else ids)
        check_ids(ids, self.vocab_size)
        vectors = self.embedding(ids)
        return vectors * math.sqrt(self.d_model) if self.scale else vectors

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.d_model)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model, "scale": self.scale}
