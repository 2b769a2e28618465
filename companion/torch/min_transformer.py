"""Source 004's MinTransformer in PyTorch: the stripped-down 2+2-layer encoder-decoder that the course counts and
compares with the paper's model (``companion.torch.model``).

Reading order: ``AttentionHead`` -> ``MinEncoderLayer`` / ``MinDecoderLayer`` -> ``MinTransformer``. The model
has no positional encoding, no residual connections and no LayerNorm, which is what chapter 7 uses it to show.
Same names and arguments as ``companion.keras.min_transformer``.
"""

from __future__ import annotations

import torch
from torch import nn

from .addnorm import PositionwiseFeedForward
from .attention import scaled_dot_product_attention
from .masking import causal_mask
from .text import check_ids, check_length


class AttentionHead(nn.Module):
    """One attention head as source 004 builds it: bias-free ``Wq, Wk, Wv`` of ``d_model x d_head``, no output
    projection. ``(batch, query_len, d_model)`` -> ``(batch, query_len, d_head)``."""

    def __init__(self, d_model: int, d_head: int):
        super().__init__()
        self.wq = nn.Linear(d_model, d_head, bias=False)
        self.wk = nn.Linear(d_model, d_head, bias=False)
        self.wv = nn.Linear(d_model, d_head, bias=False)

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return scaled_dot_product_attention(self.wq(query), self.wk(key), self.wv(value), mask)


def _concat_heads(
    heads: nn.ModuleList, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Run every head and concatenate their outputs: ``num_heads * d_head = d_model`` features, no ``W_O``."""
    return torch.cat([head(query, key, value, mask) for head in heads], dim=-1)


class MinEncoderLayer(nn.Module):
    """Source 004's encoder layer: heads, then the fully connected sublayer. No residual, no LayerNorm."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int):
        super().__init__()
        self.heads = nn.ModuleList(AttentionHead(d_model, d_model // num_heads) for _ in range(num_heads))
        self.ffn = PositionwiseFeedForward(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, src_len, d_model)`` -> same shape."""
        return self.ffn(_concat_heads(self.heads, x, x, x))


class MinDecoderLayer(nn.Module):
    """Source 004's decoder layer with the attention roles put right.

    The source creates the masked self-attention heads but never calls them, and its cross-attention takes queries
    and keys from the encoder and values from the decoder. Here ``self_heads`` do the masked self-attention and
    ``cross_heads`` take queries from the decoder and keys and values from the encoder output.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int):
        super().__init__()
        self.self_heads = nn.ModuleList(AttentionHead(d_model, d_model // num_heads) for _ in range(num_heads))
        self.cross_heads = nn.ModuleList(AttentionHead(d_model, d_model // num_heads) for _ in range(num_heads))
        self.ffn = PositionwiseFeedForward(d_model, d_ff)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x ``(batch, tgt_len, d_model)`` and memory ``(batch, src_len, d_model)`` -> ``(batch, tgt_len, d_model)``."""
        h = _concat_heads(self.self_heads, x, x, x, mask)
        h = _concat_heads(self.cross_heads, h, memory, memory)
        return self.ffn(h)


class MinTransformer(nn.Module):
    """A faithful replica of source 004's "MinTransformer" (2 encoder + 2 decoder layers), with the cross-attention
    roles corrected and logits instead of a softmax output.

    No positional encoding, no residual connections, no LayerNorm, embeddings not scaled, heads concatenated
    without an output projection. Without residuals, each attention layer averages the positions together: after
    the two encoder layers of a freshly initialised model every source position carries (to float32 precision) the
    same vector, so the cross-attention returns that vector whatever the query, and the logits do not depend on the
    target ids at all. The residual connections of the real Transformer keep each position's own information.

    With the defaults it has 13,681,040 parameters:

    ==========================  ==============================================================
    part                        parameters
    ==========================  ==============================================================
    source embedding            300 x 512 = 153,600
    target embedding            400 x 512 = 204,800
    each encoder layer (x2)     8 heads x 3 x 512 x 64 + (512 x 2048 + 2048) + (2048 x 512 + 512) = 2,886,144
    each decoder layer (x2)     2 x 8 x 3 x 512 x 64 + the same FC sublayer = 3,672,576
    output Dense(400)           512 x 400 + 400 = 205,200
    ==========================  ==============================================================

    Args:
        n_steps: longest sequence accepted (the source pads or truncates every sentence to it).
        src_vocab_size, tgt_vocab_size, num_heads, d_model, d_ff: as in the source.
    """

    num_encoder_layers = num_decoder_layers = 2

    def __init__(
        self,
        n_steps: int = 25,
        src_vocab_size: int = 300,
        tgt_vocab_size: int = 400,
        num_heads: int = 8,
        d_model: int = 512,
        d_ff: int = 2048,
    ):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        self.n_steps, self.src_vocab_size, self.tgt_vocab_size = n_steps, src_vocab_size, tgt_vocab_size
        self.src_embed = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d_model)
        self.encoder_layers = nn.ModuleList(
            MinEncoderLayer(d_model, num_heads, d_ff) for _ in range(self.num_encoder_layers)
        )
        self.decoder_layers = nn.ModuleList(
            MinDecoderLayer(d_model, num_heads, d_ff) for _ in range(self.num_decoder_layers)
        )
        self.generator = nn.Linear(d_model, tgt_vocab_size)

    def _check(self, ids: torch.Tensor, vocab_size: int, name: str) -> None:
        check_ids(ids, vocab_size, name)
        check_length(ids, self.n_steps, name, "n_steps")

    def forward(self, src_ids: torch.Tensor, tgt_ids: torch.Tensor) -> torch.Tensor:
        """src_ids ``(batch, src_len)`` and tgt_ids ``(batch, tgt_len)`` -> logits ``(batch, tgt_len, tgt_vocab)``."""
        self._check(src_ids, self.src_vocab_size, "src_ids")
        self._check(tgt_ids, self.tgt_vocab_size, "tgt_ids")
        memory = self.src_embed(src_ids)
        for layer in self.encoder_layers:
            memory = layer(memory)
        # (1, tgt_len, tgt_len): the heads work on 3-D tensors (no head axis), so drop causal_mask's head axis.
        mask = causal_mask(tgt_ids.shape[1], device=tgt_ids.device)[0]
        y = self.tgt_embed(tgt_ids)
        for layer in self.decoder_layers:
            y = layer(y, memory, mask)
        return self.generator(y)
