"""The blocks of today's decoder-only models in PyTorch: RMSNorm, rotary position embedding (RoPE), the SwiGLU
feed-forward network and the sliding-window causal mask (same names and arguments in ``companion.keras.modern``;
the NumPy oracle is ``companion.reference.modern``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["RMSNorm", "RotaryEmbedding", "SwiGLU", "rotate_half", "sliding_window_mask"]


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last axis (Zhang and Sennrich, 2019).

    LayerNorm without subtracting the mean and without the shift ``beta``: one statistic instead of two, and
    ``d_model`` weights instead of ``2 * d_model``. As in Llama, float16 and bfloat16 inputs are normalised in
    float32 and cast back before the gain.

    Args:
        d_model: size normalised over.
        eps: added to the mean square inside the square root.

    Weight: ``weight`` ``(d_model,)``, starting at ones.
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        if d_model < 1:
            raise ValueError(f"d_model must be a positive integer; got {d_model}")
        self.d_model, self.eps = d_model, eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., d_model)`` -> same shape and dtype."""
        if x.dim() < 1 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (..., d_model={self.d_model}); got shape {tuple(x.shape)}")
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        normed = wide * torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight.to(x.dtype) * normed.to(x.dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, eps={self.eps}"


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(x1, x2) -> (-x2, x1)`` on the two halves of the last axis: a quarter turn of every pair."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al., 2021) in the half-split layout of GPT-NeoX, Hugging Face transformers
    and Keras Hub.

    The pair ``(x_i, x_{i + head_dim/2})`` of a query or key at position ``p`` is turned by the angle
    ``p * base**(-2i / head_dim)``. A rotation preserves lengths, and the dot product of two vectors rotated by
    ``a`` and ``b`` depends only on ``a - b``: the score of a query at ``m`` and a key at ``n`` sees only ``m - n``.

    Args:
        head_dim: width of one head (even).
        max_len: the cosines and sines are tabulated for positions ``0 .. max_len - 1``.
        base: the wavelength scale (10000 in the paper and Llama 2; larger bases in later models).

    No weights: the tables are float64 buffers, left out of the state dict.
    """

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        if head_dim < 2 or head_dim % 2:
            raise ValueError(f"head_dim must be a positive even integer (RoPE rotates pairs); got {head_dim}")
        if max_len < 1:
            raise ValueError(f"max_len must be a positive integer; got {max_len}")
        self.head_dim, self.max_len, self.base = head_dim, max_len, base
        frequencies = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (head_dim // 2,)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * frequencies[None, :]
        angles = torch.cat([angles, angles], dim=-1)  # (max_len, head_dim): both halves of a pair turn together
        # Kept in float64 (a float64 model must not inherit float32 round-off) and cast to the input's dtype.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``x`` ``(batch, num_heads, seq_len, head_dim)`` whose row ``t`` sits at position ``offset + t`` -> the
        rotated tensor, same shape and dtype. ``offset`` is the length of the key/value cache."""
        if x.dim() != 4 or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"x must have shape (batch, num_heads, seq_len, head_dim={self.head_dim}); got shape {tuple(x.shape)}"
            )
        if not 0 <= offset <= self.max_len - x.shape[2]:
            raise ValueError(
                f"offset + seq_len must fit in max_len={self.max_len}; got offset {offset} and seq_len {x.shape[2]}"
            )
        cos = self.cos[offset : offset + x.shape[2]].to(x.dtype)  # (seq_len, head_dim)
        sin = self.sin[offset : offset + x.shape[2]].to(x.dtype)
        return x * cos + rotate_half(x) * sin

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_len={self.max_len}, base={self.base}"


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)``: the gated feed-forward network of Llama (Shazeer, 2020), without biases.

    ``w1`` makes a gate, passed through ``silu(z) = z * sigmoid(z)``, that multiplies the linear branch ``w3``
    element by element. Three matrices instead of two: Llama takes ``d_ff`` about ``8/3 * d_model`` so that the
    count matches a ReLU network of ``4 * d_model``.

    Args:
        d_model: input and output width.
        d_ff: hidden width.

    Weights: ``w1``, ``w3`` ``nn.Linear(d_model, d_ff, bias=False)`` and ``w2`` ``nn.Linear(d_ff, d_model,
    bias=False)``.
    """

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.d_model, self.d_ff = d_model, d_ff
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, seq_len, d_model)`` -> ``(batch, seq_len, d_model)``."""
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, seq_len, d_model={self.d_model}); got {tuple(x.shape)}")
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def sliding_window_mask(length: int, window: int, device: torch.device | str | None = None) -> torch.Tensor:
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
    ones = torch.ones(length, length, dtype=torch.bool, device=device)
    return (ones.tril() & ones.triu(-(window - 1)))[None, None]

