"""The Transformer of "Attention Is All You Need" in PyTorch, layer by layer.

Reading order: ``EncoderLayer`` -> ``DecoderLayer`` -> ``Encoder`` / ``Decoder`` (stacks) -> ``Transformer``
(embeddings, masks, generator). Source 004's stripped-down ``MinTransformer`` is in ``.min_transformer``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..text import check_shared_vocabulary
from .addnorm import AddNorm, PositionwiseFeedForward
from .masking import causal_mask, combine_masks, padding_mask
from .multihead import MultiHeadAttention
from .positional import PositionalEncoding
from .text import TokenEmbedding, check_ids, check_length

AttentionWeights = dict[str, torch.Tensor]


def _attend(
    mha: MultiHeadAttention,
    query: torch.Tensor,
    memory: torch.Tensor,
    mask: torch.Tensor | None,
    weights: AttentionWeights | None,
    name: str,
) -> torch.Tensor:
    """``mha(query, memory, memory, mask)``; when ``weights`` is a dict, also store the attention weights there."""
    if weights is None:
        return mha(query, memory, memory, mask)
    out, weights[name] = mha(query, memory, memory, mask, return_weights=True)
    return out


class EncoderLayer(nn.Module):
    """Self-attention then a position-wise feed-forward network, each inside Add & Norm.

    Args:
        d_model: model width (512 in the paper).
        num_heads: attention heads; must divide ``d_model``.
        d_ff: hidden width of the feed-forward network (2048 in the paper).
        dropout: dropout rate used everywhere in the layer.
        norm_first: pre-LN instead of the paper's post-LN.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.addnorm1 = AddNorm(d_model, dropout, norm_first)
        self.addnorm2 = AddNorm(d_model, dropout, norm_first)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, return_weights: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``(batch, seq_len, d_model)`` -> same shape.

        Args:
            mask: bool, True = may attend, broadcastable to ``(batch, num_heads, seq_len, seq_len)``; usually the
                source padding mask ``(batch, 1, 1, seq_len)``.
            return_weights: also return the self-attention weights ``(batch, num_heads, seq_len, seq_len)``.
        """
        weights: AttentionWeights | None = {} if return_weights else None  # _attend fills it for the heatmaps
        # Sublayer 1: each position attends to every real (non-padding) position of the same sentence.
        x = self.addnorm1(x, sublayer=lambda h: _attend(self.self_attn, h, h, mask, weights, "self"))
        # Sublayer 2: the same small network at every position.
        x = self.addnorm2(x, sublayer=self.ffn)
        return (x, weights["self"]) if return_weights else x


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, then the feed-forward network.

    The two attention modules are separate (their weights differ). In the cross-attention the decoder asks the
    questions: queries come from the decoder state, keys and values from the encoder output ``memory``.

    Args: as for :class:`EncoderLayer`.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.addnorm1 = AddNorm(d_model, dropout, norm_first)
        self.addnorm2 = AddNorm(d_model, dropout, norm_first)
        self.addnorm3 = AddNorm(d_model, dropout, norm_first)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        self_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x ``(batch, tgt_len, d_model)`` and memory ``(batch, src_len, d_model)`` -> ``(batch, tgt_len, d_model)``.

        Args:
            self_mask: broadcastable to ``(batch, num_heads, tgt_len, tgt_len)``: causal AND target padding.
            memory_mask: broadcastable to ``(batch, num_heads, tgt_len, src_len)``: the source padding mask.
            return_weights: also return the self-attention weights ``(batch, num_heads, tgt_len, tgt_len)`` and
                the cross-attention weights ``(batch, num_heads, tgt_len, src_len)`` (the alignment heatmaps).
        """
        weights: AttentionWeights | None = {} if return_weights else None  # _attend fills it for the heatmaps
        # Sublayer 1: masked self-attention: target position i sees target positions 0..i only.
        x = self.addnorm1(x, sublayer=lambda h: _attend(self.self_attn, h, h, self_mask, weights, "self"))
        # Sublayer 2: cross-attention: queries from the decoder, keys and values from the encoder output.
        x = self.addnorm2(x, sublayer=lambda h: _attend(self.cross_attn, h, memory, memory_mask, weights, "cross"))
        # Sublayer 3: the position-wise feed-forward network.
        x = self.addnorm3(x, sublayer=self.ffn)
        return (x, weights["self"], weights["cross"]) if return_weights else x


class Encoder(nn.Module):
    """``num_layers`` encoder layers; a pre-LN stack ends with a final LayerNorm (``norm``), a post-LN stack doesn't.

    In pre-LN the last layer's output is an un-normalized residual sum, so one more LayerNorm is needed before
    the decoder (or a classifier) reads it. Post-LN layers already end with a LayerNorm.
    """

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first) for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model, eps=1e-5) if norm_first else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``(batch, src_len, d_model)`` -> ``(batch, src_len, d_model)``, the "memory" the decoder attends to."""
        for layer in self.layers:
            x = layer(x, mask=mask)
        return self.norm(x) if self.norm is not None else x


class Decoder(nn.Module):
    """``num_layers`` decoder layers, each attending to the same encoder output; final ``norm`` only for pre-LN."""

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first) for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model, eps=1e-5) if norm_first else None

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        self_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """``(batch, tgt_len, d_model)`` -> same shape.

        With ``return_weights`` also returns two lists with one tensor per layer: the self-attention weights
        ``(batch, num_heads, tgt_len, tgt_len)`` and the cross-attention weights
        ``(batch, num_heads, tgt_len, src_len)``.
        """
        self_weights, cross_weights = [], []
        for layer in self.layers:
            if return_weights:
                x, self_w, cross_w = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask, return_weights=True)
                self_weights.append(self_w)
                cross_weights.append(cross_w)
            else:
                x = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask)
        if self.norm is not None:
            x = self.norm(x)
        return (x, self_weights, cross_weights) if return_weights else x


class Transformer(nn.Module):
    """The encoder-decoder Transformer: source ids and target ids in, next-token logits out.

    ``model(src_ids, tgt_ids)`` = ``decode(tgt_ids, *encode(src_ids))``. Training feeds the target shifted right
    (``<bos> y1 y2 ...``) and compares the logits with ``y1 y2 ... <eos>``; the causal mask makes position ``i``
    see only target tokens ``0..i``, so all positions train in parallel. Greedy decoding calls ``encode`` once and
    ``decode`` once per generated token.

    The masks are built here from the ids, so callers never pass them:

    ========================  ==============================  ====================================
    attention                 mask                            shape
    ========================  ==============================  ====================================
    encoder self-attention    source padding                  ``(batch, 1, 1, src_len)``
    decoder self-attention    target padding AND causal       ``(batch, 1, tgt_len, tgt_len)``
    decoder cross-attention   source padding                  ``(batch, 1, 1, src_len)``
    ========================  ==============================  ====================================

    Args:
        src_vocab_size, tgt_vocab_size: number of ids on each side, PAD included.
        d_model, num_heads, num_layers, d_ff: 512, 8, 6, 2048 in the paper (its "base" model).
        max_len: longest source or target sequence accepted (size of the positional table).
        dropout: one rate for every dropout in the model (0.1 in the paper).
        pad_id: the padding id, masked out as a key everywhere.
        norm_first: pre-LN layers (plus a final LayerNorm per stack) instead of the paper's post-LN.
        shared_embeddings: share one weight matrix between the source embedding, the target embedding and the
            pre-softmax linear layer, as in section 3.4 of the paper. Needs one joint vocabulary
            (``src_vocab_size == tgt_vocab_size``); ``tgt_embed`` is then the same module as ``src_embed`` and
            ``generator`` is a :class:`TiedOutput` that multiplies by the transposed table and adds its own bias.

    Every parameter with two or more axes is re-initialised with Xavier/Glorot uniform, as ``torch.nn.Transformer``
    does with its own: the weight matrices of the linear layers, which then start from the same distribution as
    the Keras ``Transformer``'s (Xavier/Glorot uniform is the default of ``keras.layers.Dense``), and the embedding
    tables too, where the frameworks part: a ``(vocab_size, d_model)`` table here has variance
    ``2 / (vocab_size + d_model)``, while the Keras ``Transformer`` keeps ``keras.layers.Embedding``'s default,
    uniform in [-0.05, 0.05] (standard deviation 0.0289 whatever the sizes; 0.0434 here at vocab_size 1000,
    d_model 64). The biases keep their layers' defaults (``nn.Linear``: uniform in +-1/sqrt(fan_in); Keras: zeros).
    Chapter 1 compares the embedding initialisations.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 512,
        num_heads: int = 8,
        num_layers: int = 6,
        d_ff: int = 2048,
        max_len: int = 512,
        dropout: float = 0.1,
        pad_id: int = 0,
        norm_first: bool = False,
        shared_embeddings: bool = False,
    ):
        super().__init__()
        check_shared_vocabulary(shared_embeddings, src_vocab_size, tgt_vocab_size)
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.max_len, self.pad_id, self.shared_embeddings = max_len, pad_id, shared_embeddings
        self.src_embed = TokenEmbedding(src_vocab_size, d_model)  # times sqrt(d_model)
        self.tgt_embed = self.src_embed if shared_embeddings else TokenEmbedding(tgt_vocab_size, d_model)
        self.positional = PositionalEncoding(d_model, max_len, dropout)  # shared: it has no weights
        self.encoder = Encoder(num_layers, d_model, num_heads, d_ff, dropout, norm_first)
        self.decoder = Decoder(num_layers, d_model, num_heads, d_ff, dropout, norm_first)
        self.generator = (
            TiedOutput(self.src_embed.embedding) if shared_embeddings else nn.Linear(d_model, tgt_vocab_size)
        )
        for p in self.parameters():  # a shared table is listed (and initialised) once
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def _check(self, ids: torch.Tensor, vocab_size: int, name: str) -> None:
        check_ids(ids, vocab_size, name)
        check_length(ids, self.max_len, name)

    def encode(self, src_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``src_ids`` ``(batch, src_len)`` -> ``memory`` ``(batch, src_len, d_model)`` and ``src_mask``
        ``(batch, 1, 1, src_len)``."""
        self._check(src_ids, self.src_vocab_size, "src_ids")
        src_mask = padding_mask(src_ids, self.pad_id)
        memory = self.encoder(self.positional(self.src_embed(src_ids)), mask=src_mask)
        return memory, src_mask

    def decode(
        self,
        tgt_ids: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """``tgt_ids`` ``(batch, tgt_len)`` -> logits ``(batch, tgt_len, tgt_vocab)`` (no softmax).

        With ``return_weights`` also the per-layer self- and cross-attention weights (see :class:`Decoder`).
        """
        self._check(tgt_ids, self.tgt_vocab_size, "tgt_ids")
        if tgt_ids.shape[0] != memory.shape[0]:
            raise ValueError(f"tgt_ids has batch {tgt_ids.shape[0]} but memory has batch {memory.shape[0]}")
        tgt_mask = combine_masks(padding_mask(tgt_ids, self.pad_id), causal_mask(tgt_ids.shape[1], tgt_ids.device))
        y = self.positional(self.tgt_embed(tgt_ids))
        decoded = self.decoder(y, memory, self_mask=tgt_mask, memory_mask=src_mask, return_weights=return_weights)
        if return_weights:
            y, self_weights, cross_weights = decoded
            return self.generator(y), self_weights, cross_weights
        return self.generator(decoded)

    def forward(self, src_ids: torch.Tensor, tgt_ids: torch.Tensor) -> torch.Tensor:
        """src_ids ``(batch, src_len)`` and tgt_ids ``(batch, tgt_len)`` -> logits ``(batch, tgt_len, tgt_vocab)``."""
        memory, src_mask = self.encode(src_ids)
        return self.decode(tgt_ids, memory, src_mask)


class TiedOutput(nn.Module):
    """The pre-softmax linear layer tied to an embedding table: ``logits = y @ table.T + bias``.

    The table ``(vocab_size, d_model)`` belongs to ``embedding`` (an ``nn.Embedding``) and is not copied: a
    gradient from the logits and one from the embedding lookup update the same numbers. Only the bias
    ``(vocab_size,)`` is this layer's own. ``(batch, seq_len, d_model)`` -> ``(batch, seq_len, vocab_size)``.
    """

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.embedding = embedding
        self.bias = nn.Parameter(torch.zeros(embedding.num_embeddings))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(y, self.embedding.weight, self.bias)
