"""Token embeddings in PyTorch: ids ``(batch, seq_len)`` -> vectors ``(batch, seq_len, d_model)``."""

from __future__ import annotations

import math

import torch
from torch import nn


def check_ids(ids: torch.Tensor, vocab_size: int, name: str = "ids") -> None:
    """Raise ValueError unless ``ids`` is an integer tensor of shape (batch, seq_len) with values in range."""
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor of shape (batch, seq_len); got dtype {ids.dtype}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, seq_len); got shape {tuple(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(
            f"{name} must lie in [0, vocab_size={vocab_size}); got values from {int(ids.min())} to {int(ids.max())}"
        )


def check_length(ids: torch.Tensor, max_len: int, name: str = "ids", what: str = "max_len") -> None:
    """Raise ValueError unless ``ids`` ``(batch, seq_len)`` holds between 1 and ``max_len`` tokens.

    ``what`` names the limit in the message (``max_len`` for the paper's model, ``n_steps`` for source 004's).
    """
    length = ids.shape[1]
    if not 1 <= length <= max_len:
        raise ValueError(f"{name} must have between 1 and {what}={max_len} tokens; got {length}")


class TokenEmbedding(nn.Module):
    """A learned vector per token id, optionally multiplied by sqrt(d_model) as in the paper.

    Looking up row ``i`` of the table is the same as multiplying the one-hot vector of ``i`` by the table; the
    lookup just skips the zeros. The sqrt(d_model) factor multiplies the norm of every row by sqrt(d_model), and
    that is all it does. Whether the scaled rows then match the positional encoding added next (norm
    sqrt(d_model / 2) per position) depends on how the table was initialised: ``nn.Embedding``'s default, N(0, 1),
    makes them about sqrt(2 * d_model) times larger. The companion's ``Transformer`` re-initialises the table with
    Xavier/Glorot uniform; chapter 1 measures the ratio for that and other initialisations.

    Args:
        vocab_size: number of ids, PAD included.
        d_model: length of each vector.
        scale: multiply by sqrt(d_model).
    """

    def __init__(self, vocab_size: int, d_model: int, scale: bool = True):
        super().__init__()
        self.vocab_size, self.d_model, self.scale = vocab_size, d_model, scale
        self.embedding = nn.Embedding(vocab_size, d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids ``(batch, seq_len)`` -> ``(batch, seq_len, d_model)``."""
        check_ids(ids, self.vocab_size)
        vectors = self.embedding(ids)
        return vectors * math.sqrt(self.d_model) if self.scale else vectors
