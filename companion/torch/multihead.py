"""Multi-head attention in PyTorch: ``num_heads`` attentions of width ``d_model // num_heads`` side by side."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import check_mask, scaled_dot_product_attention


class MultiHeadAttention(nn.Module):
    """Project, split into heads, attend per head, merge, project back.

    Args:
        d_model: width of the inputs and of the output.
        num_heads: number of heads; must divide ``d_model``. Each head has width ``d_head = d_model // num_heads``.
        dropout: dropout on the attention weights during training.

    The four projections ``wq, wk, wv, wo`` are ``nn.Linear(d_model, d_model)`` with bias:
    ``4 * d_model**2 + 4 * d_model`` parameters, whatever the number of heads.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.d_model, self.num_heads, self.d_head = d_model, num_heads, d_model // num_heads
        self.dropout = dropout
        self.wq = nn.Linear(d_model, d_model)
        self.wk = nn.Linear(d_model, d_model)
        self.wv = nn.Linear(d_model, d_model)
        self.wo = nn.Linear(d_model, d_model)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, seq_len, d_model)`` -> ``(batch, num_heads, seq_len, d_head)``.

        Reshape *then* transpose: each position keeps its own d_model numbers, cut into num_heads slices. A plain
        reshape to ``(batch, num_heads, seq_len, d_head)`` would mix positions across heads.
        """
        batch, seq_len, _ = x.shape
        return x.view(batch, seq_len, self.num_heads, self.d_head).transpose(1, 2)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, num_heads, seq_len, d_head)`` -> ``(batch, seq_len, d_model)``, the inverse of split_heads."""
        batch, _, seq_len, _ = x.shape
        return x.transpose(1, 2).reshape(batch, seq_len, self.d_model)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from each query position to the key/value positions.

        Args:
            query: ``(batch, query_len, d_model)``.
            key, value: ``(batch, key_len, d_model)``; pass the same tensor three times for self-attention.
            mask: boolean, True = may attend, broadcastable to ``(batch, num_heads, query_len, key_len)``.
            return_weights: also return the attention weights.

        Returns:
            ``(batch, query_len, d_model)``, or ``(out, weights (batch, num_heads, query_len, key_len))``.
        """
        self._check_inputs(query, key, value, mask)
        q = self.split_heads(self.wq(query))  # (batch, num_heads, query_len, d_head)
        k = self.split_heads(self.wk(key))  # (batch, num_heads, key_len, d_head)
        v = self.split_heads(self.wv(value))  # (batch, num_heads, key_len, d_head)
        heads, weights = self._attend_heads(q, k, v, mask, return_weights)
        out = self.wo(self.merge_heads(heads))  # (batch, query_len, d_model)
        return (out, weights) if return_weights else out

    def _attend_heads(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, return_weights: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention per head: q ``(batch, num_heads, query_len, d_head)``, k and v ``(batch, num_heads, key_len,
        d_head)`` -> ``(batch, num_heads, query_len, d_head)`` and the weights (None unless ``return_weights``)."""
        dropout = self.dropout if self.training else 0.0
        if return_weights:
            return scaled_dot_product_attention(
                q, k, v, mask, return_weights=True, dropout=dropout, training=self.training
            )
        # The fused kernel computes the same thing without keeping the (query_len, key_len) weights for us.
        attn_mask = None
        if mask is not None:
            # A query that may see no key at all (a fully masked row, e.g. a padding position under a causal
            # mask) gets uniform weights in the explicit path. The fused kernel would return zeros there with a
            # boolean mask, and a wrong gradient with a huge negative fill. So give such a query a zero vector,
            # which makes all its scores 0, and unmask its row: uniform weights, and, as in the explicit path,
            # no gradient through its scores.
            blind = ~mask.any(dim=-1, keepdim=True)  # (..., query_len, 1)
            q = q.masked_fill(blind, 0.0)
            attn_mask = mask | blind
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout), None

    # --- Incremental decoding (the key/value cache) ---------------------------------------------------------------
    # Generating token t with the plain forward recomputes the keys and values of tokens 0..t-1, which have not
    # changed. The three methods below let a decoder keep them: project the keys and values once
    # (project_key_value), attend with them later (attend_projected), or, for self-attention, append the new
    # positions' keys and values to those of the earlier ones (self_attention_cached).

    def project_key_value(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``key``, ``value`` ``(batch, key_len, d_model)`` -> projected and split ``k``, ``v``, each
        ``(batch, num_heads, key_len, d_head)``: what a cache stores."""
        for name, x in (("key", key), ("value", value)):
            if x.dim() != 3 or x.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name} must have shape (batch, seq_len, d_model={self.d_model}); got shape {tuple(x.shape)}"
                )
        return self.split_heads(self.wk(key)), self.split_heads(self.wv(value))

    def attend_projected(
        self, query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attend from ``query`` ``(batch, query_len, d_model)`` to keys and values already projected by
        :meth:`project_key_value`, ``k`` and ``v`` ``(batch, num_heads, key_len, d_head)``.

        Gives the same ``(batch, query_len, d_model)`` as ``forward(query, key, value, mask)`` when ``k, v`` are
        ``project_key_value(key, value)``. ``mask`` is broadcastable to ``(batch, num_heads, query_len, key_len)``.
        """
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise ValueError(
                f"query must have shape (batch, query_len, d_model={self.d_model}); got shape {tuple(query.shape)}"
            )
        expected = (query.shape[0], self.num_heads, k.shape[2] if k.dim() == 4 else -1, self.d_head)
        for name, x in (("k", k), ("v", v)):
            if tuple(x.shape) != expected:
                raise ValueError(
                    f"{name} must have shape (batch={expected[0]}, num_heads={self.num_heads}, key_len, "
                    f"d_head={self.d_head}) like k; got shape {tuple(x.shape)}"
                )
        check_mask(mask, torch.Size((query.shape[0], self.num_heads, query.shape[1], k.shape[2])))
        heads, _ = self._attend_heads(self.split_heads(self.wq(query)), k, v, mask, False)
        return self.wo(self.merge_heads(heads))  # (batch, query_len, d_model)

    def self_attention_cached(
        self,
        x: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Self-attention of the new positions ``x`` ``(batch, new_len, d_model)`` over the earlier positions and
        themselves.

        Args:
            past: ``(k, v)`` of the earlier positions, each ``(batch, num_heads, past_len, d_head)``, or None.
            mask: broadcastable to ``(batch, num_heads, new_len, past_len + new_len)``; None lets every new position
                see every key (right for a single new position; several need a causal mask).

        Returns:
            ``(batch, new_len, d_model)`` and the grown cache ``(k, v)``, each ``(batch, num_heads,
            past_len + new_len, d_head)``.
        """
        k, v = self.project_key_value(x, x)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        return self.attend_projected(x, k, v, mask), (k, v)

    def _check_inputs(self, query, key, value, mask) -> None:
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.dim() != 3 or x.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name} must have shape (batch, seq_len, d_model={self.d_model}); got shape {tuple(x.shape)}"
                )
        if not (query.shape[0] == key.shape[0] == value.shape[0]):
            raise ValueError(
                f"query, key and value must have the same batch size; got {query.shape[0]}, {key.shape[0]}, "
                f"{value.shape[0]}"
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(
                f"value must have shape (batch, key_len={key.shape[1]}, d_model) like key; got {tuple(value.shape)}"
            )
        check_mask(mask, torch.Size((query.shape[0], self.num_heads, query.shape[1], key.shape[1])))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, dropout={self.dropout}"
