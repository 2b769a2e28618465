"""Sinusoidal positional encoding in PyTorch: tell the model *where* each token sits.

Self-attention is permutation-invariant: shuffle the tokens and each one gets the same output, only shuffled.
Adding a position-dependent vector to every embedding breaks that symmetry.
"""

from __future__ import annotations

import torch
from torch import nn


def sinusoidal_positional_encoding(max_len: int, d_model: int) -> torch.Tensor:
    """The fixed table of "Attention Is All You Need", section 3.5, shape ``(max_len, d_model)``, float32.

    ``PE[pos, 2i] = sin(pos / 10000**(2i / d_model))`` and ``PE[pos, 2i + 1] = cos(pos / 10000**(2i / d_model))``:
    each column pair is one frequency, and the wavelengths form a geometric progression from 2*pi towards
    10000*2*pi (the last pair stops one ratio short).
    """
    if d_model <= 0 or d_model % 2:
        raise ValueError(f"d_model must be a positive even number (sine and cosine columns pair up); got {d_model}")
    if max_len <= 0:
        raise ValueError(f"max_len must be positive; got {max_len}")
    # float64 for the angles: in float32, position 500 times a frequency near 1 is already off by about 3e-5.
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model / 2,)
    angle = position / 10000.0 ** (two_i / d_model)  # (max_len, d_model / 2)
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.float()


class PositionalEncoding(nn.Module):
    """Add the sinusoidal table to a batch of embeddings, then apply dropout.

    Args:
        d_model: embedding size (even).
        max_len: longest sequence the table covers.
        dropout: dropout rate applied to the sum (0.1 in the paper).
    """

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.dropout = nn.Dropout(dropout)
        # A buffer, not a parameter: it moves with .to(device) but is never trained. persistent=False keeps it out
        # of the state_dict, since it is recomputed from (max_len, d_model) anyway.
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, seq_len, d_model)`` -> ``(batch, seq_len, d_model)``."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, seq_len, d_model={self.d_model}); got {tuple(x.shape)}")
        seq_len = x.shape[1]
        if seq_len > self.max_len:
            raise ValueError(
                f"x has seq_len={seq_len} but the positional table stops at max_len={self.max_len}; "
                f"build the model with max_len >= {seq_len}"
            )
        return self.dropout(x + self.pe[:seq_len].to(x.dtype))
