"""A decoder-only Transformer (GPT) in PyTorch, and text generation with it.

The public names, identical in ``companion.keras.gpt`` (a stable agreement other modules rely on):

* ``GPT(vocab_size, d_model=512, num_heads=8, num_layers=6, d_ff=2048, max_len=512, dropout=0.1,
  tie_weights=True)``; ``model(ids)`` maps ids ``(batch, length)`` to next-token logits
  ``(batch, length, vocab_size)``; ``model.forward_cached(ids, cache)`` does the same for the positions not in
  ``cache`` yet (the key/value cache, see below).
* ``generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None, use_cache=True)``
  returns the prompt followed by ``max_new_tokens`` new tokens, ``(batch, length + max_new_tokens)``.
  ``temperature=0`` is greedy decoding. The choice of each token is framework-free: ``companion.sampling``.

GPT keeps only the decoder side of the encoder-decoder Transformer, without cross-attention: every block is
masked self-attention then the feed-forward network, so position ``i`` predicts token ``i + 1`` from tokens
``0..i``. As in GPT-2 the blocks are pre-LN (a final LayerNorm closes the stack), positions are learned vectors
(a second embedding table, so ``max_len`` is a hard limit), and with ``tie_weights`` the output layer reuses the
token embedding table: ``logits = h @ E^T``. The feed-forward network is the course's ReLU one (GPT-2 uses GELU).

**The key/value cache.** Generating token ``t`` with ``model(ids)`` recomputes the keys and values of tokens
``0..t-1`` in every layer, although they have not changed (a token's key and value depend only on the tokens at
or before it). ``forward_cached`` keeps them: the cache is a list with one ``(k, v)`` pair per block, each
``(batch, num_heads, cached_len, d_head)``, and each step only computes the new positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..sampling import check_sampling_args, make_rng, sample_next
from .addnorm import AddNorm, PositionwiseFeedForward
from .masking import causal_mask
from .multihead import MultiHeadAttention
from .text import check_ids

KVCache = list[tuple[torch.Tensor, torch.Tensor]]

__all__ = ["GPT", "GPTBlock", "cache_length", "generate"]


class GPTBlock(nn.Module):
    """Masked self-attention then the feed-forward network, each inside a pre-LN Add & Norm.

    It is the encoder layer of chapter 6 with ``norm_first=True``, run under a causal mask.

    Args:
        d_model, num_heads, d_ff: as for the Transformer's layers.
        dropout: on the attention weights and on each sublayer's output.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.addnorm1 = AddNorm(d_model, dropout, norm_first=True)
        self.addnorm2 = AddNorm(d_model, dropout, norm_first=True)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` ``(batch, length, d_model)`` -> same shape; ``mask`` is usually ``causal_mask(length)``."""
        x = self.addnorm1(x, sublayer=lambda h: self.self_attn(h, h, h, mask))
        return self.addnorm2(x, sublayer=self.ffn)

    def forward_cached(
        self,
        x: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The new positions ``x`` ``(batch, new_len, d_model)``, given the keys and values ``past`` of the earlier
        ones -> the output for the new positions, same shape, and the grown ``(k, v)``.

        ``mask`` is broadcastable to ``(batch, num_heads, new_len, past_len + new_len)``.
        """
        grown = {}

        def self_attention(h: torch.Tensor) -> torch.Tensor:
            out, grown["kv"] = self.self_attn.self_attention_cached(h, past, mask)
            return out

        x = self.addnorm1(x, sublayer=self_attention)
        return self.addnorm2(x, sublayer=self.ffn), grown["kv"]


def cache_length(cache: KVCache | None) -> int:
    """How many positions a cache holds (0 for None)."""
    return 0 if not cache else int(cache[0][0].shape[2])


class GPT(nn.Module):
    """A decoder-only Transformer language model: ids ``(batch, length)`` -> logits ``(batch, length, vocab_size)``.

    Args:
        vocab_size: number of token ids.
        d_model, num_heads, num_layers, d_ff: width, heads, blocks and feed-forward width.
        max_len: longest sequence (the size of the learned position table).
        dropout: one rate for the embeddings, the attention weights and every sublayer output.
        tie_weights: compute the logits with the token embedding table (``h @ E^T``) instead of a separate
            ``head`` layer (``nn.Linear(d_model, vocab_size, bias=False)``); saves ``vocab_size * d_model`` weights.

    Weights: ``token_embed`` and ``position_embed`` (``nn.Embedding``, initialised with a normal of standard
    deviation 0.02), ``blocks`` (:class:`GPTBlock`; the Keras twin cannot call them ``layers``), the final
    ``norm``, and ``head`` when not tied. The matrices of the blocks start Xavier/Glorot-uniform, as in the Keras
    twin. ``companion.reference.gpt_parameter_count`` gives the count by formula.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 512,
        num_heads: int = 8,
        num_layers: int = 6,
        d_ff: int = 2048,
        max_len: int = 512,
        dropout: float = 0.1,
        tie_weights: bool = True,
    ):
        super().__init__()
        for name, value in {"vocab_size": vocab_size, "d_model": d_model, "num_layers": num_layers,
                            "d_ff": d_ff, "max_len": max_len}.items():
            if value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value}")
        self.vocab_size, self.d_model, self.num_heads, self.num_layers = vocab_size, d_model, num_heads, num_layers
        self.d_ff, self.max_len, self.tie_weights = d_ff, max_len, tie_weights
        self.token_embed = nn.Embedding(vocab_size, d_model)
        self.position_embed = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(GPTBlock(d_model, num_heads, d_ff, dropout) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model, eps=1e-5)
        self.head = None if tie_weights else nn.Linear(d_model, vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for table in (self.token_embed, self.position_embed):
            nn.init.normal_(table.weight, std=0.02)

    def _check(self, ids: torch.Tensor, past: int = 0) -> None:
        check_ids(ids, self.vocab_size, "ids")
        if not past < ids.shape[1] <= self.max_len:
            raise ValueError(
                f"ids must have between {past + 1} and max_len={self.max_len} tokens"
                + (f" (the cache holds {past})" if past else "") + f"; got {ids.shape[1]}"
            )

    def _embed(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """Token plus position vectors of ``ids`` ``(batch, n)`` sitting at positions ``start..start+n-1``."""
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        return self.dropout(self.token_embed(ids) + self.position_embed(positions))  # (batch, n, d_model)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """``(batch, n, d_model)`` -> ``(batch, n, vocab_size)``: the final LayerNorm, then the output layer."""
        h = self.norm(h)
        return F.linear(h, self.token_embed.weight) if self.head is None else self.head(h)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids ``(batch, length)`` -> logits ``(batch, length, vocab_size)``; position ``i`` sees tokens ``0..i``."""
        self._check(ids)
        x = self._embed(ids, 0)
        mask = causal_mask(ids.shape[1], ids.device)  # (1, 1, length, length)
        for block in self.blocks:
            x = block(x, mask)
        return self._logits(x)

    def forward_cached(self, ids: torch.Tensor, cache: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        """The logits of the positions of ``ids`` that ``cache`` does not hold yet, and the grown cache.

        Args:
            ids: ``(batch, length)``: the whole sequence so far. Its first ``cache_length(cache)`` tokens must be
                the ones the cache was built from; only the others are computed.
            cache: one ``(k, v)`` per block, each ``(batch, num_heads, cached_len, d_head)``; None to start.

        Returns:
            logits ``(batch, length - cached_len, vocab_size)`` (equal to ``model(ids)[:, cached_len:]``) and the
            cache of all ``length`` positions.
        """
        past = cache_length(cache)
        self._check(ids, past)
        if cache is not None and (len(cache) != self.num_layers or cache[0][0].shape[0] != ids.shape[0]):
            raise ValueError(
                f"cache must hold one (k, v) per block ({self.num_layers}) for a batch of {ids.shape[0]}; got "
                f"{len(cache)} pairs for a batch of {cache[0][0].shape[0] if cache else 0}"
            )
        x = self._embed(ids[:, past:], past)
        # A new position may see every cached one and the new ones up to itself: rows past.. of the causal mask.
        # A single new position sees everything, so it needs no mask (and the fused kernel runs unmasked).
        mask = causal_mask(ids.shape[1], ids.device)[:, :, past:] if ids.shape[1] - past > 1 else None
        grown: KVCache = []
        for index, block in enumerate(self.blocks):
            x, kv = block.forward_cached(x, None if cache is None else cache[index], mask)
            grown.append(kv)
        return self._logits(x), grown

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, max_len={self.max_len}, tie_weights={self.tie_weights}"


@torch.no_grad()
def generate(
    model: GPT,
    ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    use_cache: bool = True,
) -> torch.Tensor:
    """Continue each prompt of ``ids`` ``(batch, length)`` by ``max_new_tokens`` tokens, one at a time.

    Each step feeds the sequence so far, takes the logits of its last position and picks the next token with
    ``companion.sampling.sample_next`` (temperature, then top-k, then top-p; ``temperature=0`` is greedy).
    ``seed`` makes the draws reproducible: the same model, prompt and seed give the same tokens here and in
    ``companion.keras.gpt.generate``. With ``use_cache`` each step computes only the new position (see
    :meth:`GPT.forward_cached`); without it every step runs the whole sequence. Both give the same tokens.

    Returns:
        int64 ``(batch, length + max_new_tokens)``: the prompt followed by the new tokens. The whole result must
        fit in the model: ``length + max_new_tokens <= max_len``.
    """
    check_sampling_args(temperature, top_k, top_p)
    device = next(model.parameters()).device
    ids = torch.as_tensor(ids, device=device)
    check_ids(ids, model.vocab_size, "ids")
    ids = ids.long()
    if max_new_tokens < 0 or not 1 <= ids.shape[1] <= model.max_len - max_new_tokens:
        raise ValueError(
            f"ids (batch, length) plus max_new_tokens must fit in max_len={model.max_len} with length >= 1 and "
            f"max_new_tokens >= 0; got length {ids.shape[1]} and max_new_tokens {max_new_tokens}"
        )
    rng = make_rng(seed)
    was_training = model.training
    model.eval()
    cache = None
    for _ in range(max_new_tokens):
        if use_cache:
            logits, cache = model.forward_cached(ids, cache)
        else:
            logits = model(ids)
        last = logits[:, -1].float().cpu().numpy()  # (batch, vocab_size)
        next_ids = torch.as_tensor(sample_next(last, temperature, top_k, top_p, rng), device=device)
        ids = torch.cat([ids, next_ids[:, None]], dim=1)
    model.train(was_training)
    return ids
