"""The position-wise feed-forward network and the Add & Norm wrapper in PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class PositionwiseFeedForward(nn.Module):
    """``FFN(x) = max(0, x W1 + b1) W2 + b2``, the same two-layer network applied at every position.

    It is equivalent to two 1x1 convolutions over the sequence. The hidden layer is wider than the model
    (``d_ff = 2048`` vs ``d_model = 512`` in the paper).

    Args:
        d_model: input and output size.
        d_ff: hidden size.
        dropout: dropout on the hidden activations.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, seq_len, d_model)`` -> ``(batch, seq_len, d_model)``."""
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class AddNorm(nn.Module):
    """A residual connection around a sublayer, with layer normalization.

    Post-LN (the paper, ``norm_first=False``): ``LayerNorm(x + Dropout(sublayer(x)))``.
    Pre-LN (``norm_first=True``): ``x + Dropout(sublayer(LayerNorm(x)))``. Pre-LN leaves the residual path
    untouched from input to output, which makes deep stacks easier to train (Xiong et al. 2020 trained them without
    a warm-up in their settings; GPT-3 and Llama still warm up); a pre-LN stack
    needs one final LayerNorm (see ``Encoder``).

    Args:
        d_model: size normalized over.
        dropout: dropout on the sublayer's output, before the addition.
        norm_first: pre-LN instead of post-LN.
        eps: added to the variance inside the square root (1e-5, as torch and our keras layers use).
    """

    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False, eps: float = 1e-5):
        super().__init__()
        self.norm_first = norm_first
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``x`` ``(batch, seq_len, d_model)`` and a callable of the same shape in and out -> same shape."""
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))
