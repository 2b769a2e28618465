"""Grouped-query attention with rotary positions in PyTorch, and its key/value cache (same names and arguments in
``companion.keras.grouped``; the oracle is ``companion.reference.grouped``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import check_mask
from .modern import RotaryEmbedding

__all__ = ["GroupedQueryAttention", "repeat_kv"]


def repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """``(batch, num_kv_heads, seq_len, head_dim)`` -> ``(batch, num_kv_heads * group, seq_len, head_dim)``: each
    key/value head repeated for the ``group`` query heads that read it (query head ``h`` reads ``h // group``)."""
    return x if group == 1 else x.repeat_interleave(group, dim=1)


class GroupedQueryAttention(nn.Module):
    """Causal self-attention in which ``num_heads`` query heads share ``num_kv_heads`` key/value heads
    (Ainslie et al., 2023), with rotary positions on queries and keys and no biases, as in Llama.

    ``num_kv_heads == num_heads`` is multi-head attention, ``num_kv_heads == 1`` multi-query attention. Sharing
    shrinks the key/value projections and, above all, the key/value cache, by ``num_heads / num_kv_heads``.

    Args:
        d_model: width of the input and the output.
        num_heads: query heads; must divide ``d_model``; ``head_dim = d_model // num_heads``.
        num_kv_heads: key/value heads; must divide ``num_heads``.
        max_len: longest position the rotary tables cover.
        rope_base: base of the rotary angles; None for no rotary embedding.

    Weights: ``wq`` ``nn.Linear(d_model, num_heads * head_dim)``, ``wk`` and ``wv`` ``nn.Linear(d_model,
    num_kv_heads * head_dim)``, ``wo`` ``nn.Linear(num_heads * head_dim, d_model)``, all without bias.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, max_len: int = 512,
                 rope_base: float | None = 10000.0):
        super().__init__()
        if num_heads < 1 or d_model % num_heads:
            raise ValueError(f"num_heads ({num_heads}) must divide d_model ({d_model})")
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.head_dim, self.group = d_model // num_heads, num_heads // num_kv_heads
        self.max_len, self.rope_base = max_len, rope_base
        self.wq = nn.Linear(d_model, num_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(num_heads * self.head_dim, d_model, bias=False)
        self.rotary = None if rope_base is None else RotaryEmbedding(self.head_dim, max_len, rope_base)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """``(batch, seq_len, heads * head_dim)`` -> ``(batch, heads, seq_len, head_dim)``."""
        batch, seq_len, _ = x.shape
        return x.view(batch, seq_len, heads, self.head_dim).transpose(1, 2)

    def project(self, x: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` ``(batch, seq_len, d_model)`` at positions ``offset..`` -> ``q`` ``(batch, num_heads, seq_len,
        head_dim)`` and ``k``, ``v`` ``(batch, num_kv_heads, seq_len, head_dim)``, queries and keys rotated."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, seq_len, d_model={self.d_model}); got {tuple(x.shape)}")
        q = self._split(self.wq(x), self.num_heads)
        k = self._split(self.wk(x), self.num_kv_heads)
        v = self._split(self.wv(x), self.num_kv_heads)
        if self.rotary is not None:
            q, k = self.rotary(q, offset), self.rotary(k, offset)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``q`` ``(batch, num_heads, query_len, head_dim)`` over ``k``, ``v`` ``(batch, num_kv_heads, key_len,
        head_dim)`` -> ``(batch, query_len, d_model)``, through ``wo``."""
        batch, _, query_len, _ = q.shape
        check_mask(mask, torch.Size((batch, self.num_heads, query_len, k.shape[2])))
        attn_mask = None
        if mask is not None:
            # A query that may see no key gets uniform weights in the course's explicit attention; the fused
            # kernel would give zeros. A zero query with its row unmasked gives the same uniform weights.
            blind = ~mask.any(dim=-1, keepdim=True)
            q, attn_mask = q.masked_fill(blind, 0.0), mask | blind
        heads = F.scaled_dot_product_attention(q, repeat_kv(k, self.group), repeat_kv(v, self.group),
                                               attn_mask=attn_mask)
        return self.wo(heads.transpose(1, 2).reshape(batch, query_len, self.num_heads * self.head_dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` ``(batch, seq_len, d_model)`` -> same shape. ``mask``: boolean, True = may attend, broadcastable
        to ``(batch, num_heads, seq_len, seq_len)``, usually ``causal_mask`` or ``sliding_window_mask``."""
        q, k, v = self.project(x)
        return self.attend(q, k, v, mask)

    def forward_cached(
        self,
        x: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Self-attention of the new positions ``x`` ``(batch, new_len, d_model)`` over the cached ones and
        themselves.

        Args:
            past: ``(k, v)`` of the earlier positions, each ``(batch, num_kv_heads, past_len, head_dim)``, keys
                already rotated; None to start. The new positions sit at ``past_len ..``.
            mask: broadcastable to ``(batch, num_heads, new_len, past_len + new_len)``.

        Returns:
            ``(batch, new_len, d_model)`` and the grown cache, each ``(batch, num_kv_heads, past_len + new_len,
            head_dim)``: only the key/value heads are stored.
        """
        past_len = 0 if past is None else past[0].shape[2]
        if past is not None and (past[0].shape[1] != self.num_kv_heads or past[0].shape[-1] != self.head_dim):
            raise ValueError(
                f"past keys must have shape (batch, num_kv_heads={self.num_kv_heads}, past_len, "
                f"head_dim={self.head_dim}); got {tuple(past[0].shape)}"
            )
        q, k, v = self.project(x, past_len)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        return self.attend(q, k, v, mask), (k, v)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}"
