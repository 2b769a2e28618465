"""A decoder-only model built like today's open models (Llama, Mistral) in PyTorch: pre-RMSNorm blocks, rotary
positions, grouped-query attention, a SwiGLU feed-forward network, no biases.

The public names, identical in ``companion.keras.modern_decoder``:

* ``ModernDecoder(vocab_size, d_model=512, num_heads=8, num_kv_heads=2, num_layers=6, d_ff=1376, max_len=512,
  window=None, rope_base=10000.0, eps=1e-6, tie_weights=True)``; ``model(ids)`` maps ids ``(batch, length)`` to
  logits ``(batch, length, vocab_size)`` and ``model.forward_cached(ids, cache)`` those of the positions not in
  ``cache`` yet, exactly as chapter 8's ``GPT``, so ``companion.torch.gpt.generate`` runs it unchanged.
* ``ModernBlock(d_model, num_heads, num_kv_heads, d_ff, max_len=512, rope_base=10000.0, eps=1e-6)``.

What changed from chapter 8's GPT, block by block: RMSNorm instead of LayerNorm; no position table, the rotary
embedding turns queries and keys inside every attention instead; ``num_kv_heads`` key/value heads shared by the
query heads; SwiGLU instead of the ReLU network; no bias anywhere; no dropout. ``window`` restricts every
position to the ``window`` latest ones (Mistral's sliding window). The cache stores, per block, the rotated keys
and the values of the key/value heads only: ``(batch, num_kv_heads, cached_len, head_dim)`` each.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .gpt import cache_length
from .grouped import GroupedQueryAttention
from .masking import causal_mask
from .modern import RMSNorm, SwiGLU, sliding_window_mask
from .text import check_ids

KVCache = list[tuple[torch.Tensor, torch.Tensor]]

__all__ = ["ModernBlock", "ModernDecoder"]


class ModernBlock(nn.Module):
    """``x + attn(attn_norm(x))``, then ``x + ffn(ffn_norm(x))``: pre-RMSNorm residual block.

    Weights: ``attn_norm``, ``ffn_norm`` (:class:`RMSNorm`), ``attn`` (:class:`GroupedQueryAttention`), ``ffn``
    (:class:`SwiGLU`).
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, d_ff: int, max_len: int = 512,
                 rope_base: float = 10000.0, eps: float = 1e-6):
        super().__init__()
        self.attn_norm = RMSNorm(d_model, eps)
        self.attn = GroupedQueryAttention(d_model, num_heads, num_kv_heads, max_len, rope_base)
        self.ffn_norm = RMSNorm(d_model, eps)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` ``(batch, length, d_model)`` -> same shape."""
        x = x + self.attn(self.attn_norm(x), mask)
        return x + self.ffn(self.ffn_norm(x))

    def forward_cached(
        self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The new positions ``x`` ``(batch, new_len, d_model)`` given the cached ``past`` -> same shape and the
        grown ``(k, v)``, each ``(batch, num_kv_heads, past_len + new_len, head_dim)``."""
        attended, kv = self.attn.forward_cached(self.attn_norm(x), past, mask)
        x = x + attended
        return x + self.ffn(self.ffn_norm(x)), kv


class ModernDecoder(nn.Module):
    """A Llama-style language model: ids ``(batch, length)`` -> logits ``(batch, length, vocab_size)``.

    Args:
        vocab_size: number of token ids.
        d_model, num_heads, num_layers, d_ff: width, query heads, blocks, SwiGLU hidden width.
        num_kv_heads: key/value heads (divides ``num_heads``): ``num_heads`` for MHA, 1 for MQA.
        max_len: longest sequence (the rotary tables' length; no weight depends on it).
        window: if set, each position sees only the ``window`` latest positions, itself included.
        rope_base: base of the rotary angles.
        eps: RMSNorm's epsilon.
        tie_weights: logits ``h @ E^T`` with the token table ``E`` instead of a separate ``head``.

    Weights: ``token_embed`` (normal, standard deviation 0.02), ``blocks`` (:class:`ModernBlock`, matrices
    Xavier/Glorot-uniform as in the Keras twin), the final ``norm`` (:class:`RMSNorm`), ``head`` when untied.
    ``companion.reference.modern_decoder_parameter_count`` gives the count by formula.
    """

    def __init__(self, vocab_size: int, d_model: int = 512, num_heads: int = 8, num_kv_heads: int = 2,
                 num_layers: int = 6, d_ff: int = 1376, max_len: int = 512, window: int | None = None,
                 rope_base: float = 10000.0, eps: float = 1e-6, tie_weights: bool = True):
        super().__init__()
        for name, value in {"vocab_size": vocab_size, "d_model": d_model, "num_layers": num_layers, "d_ff": d_ff,
                            "max_len": max_len, "window": 1 if window is None else window}.items():
            if value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value}")
        self.vocab_size, self.d_model, self.num_heads, self.num_kv_heads = vocab_size, d_model, num_heads, num_kv_heads
        self.num_layers, self.d_ff, self.max_len, self.window = num_layers, d_ff, max_len, window
        self.tie_weights = tie_weights
        self.token_embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(ModernBlock(d_model, num_heads, num_kv_heads, d_ff, max_len, rope_base, eps)
                                    for _ in range(num_layers))
        self.norm = RMSNorm(d_model, eps)
        self.head = None if tie_weights else nn.Linear(d_model, vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        nn.init.normal_(self.token_embed.weight, std=0.02)

    def mask(self, length: int, past: int = 0, device: torch.device | None = None) -> torch.Tensor | None:
        """The rows ``past..length-1`` of the causal (or sliding-window) mask, ``(1, 1, length - past, length)``;
        None for one new position without a window (it may see everything)."""
        if self.window is None:
            return causal_mask(length, device)[:, :, past:] if length - past > 1 else None
        return sliding_window_mask(length, self.window, device)[:, :, past:]

    def _check(self, ids: torch.Tensor, past: int = 0) -> None:
        check_ids(ids, self.vocab_size, "ids")
        if not past < ids.shape[1] <= self.max_len:
            raise ValueError(
                f"ids must have between {past + 1} and max_len={self.max_len} tokens"
                + (f" (the cache holds {past})" if past else "") + f"; got {ids.shape[1]}"
            )

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """``(batch, n, d_model)`` -> ``(batch, n, vocab_size)``: the final RMSNorm, then the output layer."""
        h = self.norm(h)
        return F.linear(h, self.token_embed.weight) if self.head is None else self.head(h)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids ``(batch, length)`` -> logits ``(batch, length, vocab_size)``; position ``i`` sees tokens ``0..i``
        (the ``window`` latest of them when a window is set)."""
        self._check(ids)
        x = self.token_embed(ids)  # (batch, length, d_model): no position vector, RoPE acts inside attention
        mask = self.mask(ids.shape[1], 0, ids.device)
        for block in self.blocks:
            x = block(x, mask)
        return self._logits(x)

    def forward_cached(self, ids: torch.Tensor, cache: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        """The logits of the positions of ``ids`` ``(batch, length)`` that ``cache`` does not hold yet, and the
        grown cache (one ``(k, v)`` per block, each ``(batch, num_kv_heads, cached_len, head_dim)``).

        Returns logits ``(batch, length - cached_len, vocab_size)``, equal to ``model(ids)[:, cached_len:]``.
        """
        past = cache_length(cache)
        self._check(ids, past)
        if cache is not None and (len(cache) != self.num_layers or cache[0][0].shape[0] != ids.shape[0]):
            raise ValueError(
                f"cache must hold one (k, v) per block ({self.num_layers}) for a batch of {ids.shape[0]}; got "
                f"{len(cache)} pairs for a batch of {cache[0][0].shape[0]}"
            )
        x = self.token_embed(ids[:, past:])
        mask = self.mask(ids.shape[1], past, ids.device)
        grown: KVCache = []
        for index, block in enumerate(self.blocks):
            x, kv = block.forward_cached(x, None if cache is None else cache[index], mask)
            grown.append(kv)
        return self._logits(x), grown

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, max_len={self.max_len}, window={self.window}, tie={self.tie_weights}"
