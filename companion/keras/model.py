"""The Transformer of "Attention Is All You Need" in Keras 3, layer by layer.

Reading order: ``EncoderLayer`` -> ``DecoderLayer`` -> ``Encoder`` / ``Decoder`` (stacks) -> ``Transformer``
(embeddings, masks, generator). Source 004's stripped-down ``MinTransformer`` is in ``.min_transformer``.

``keras.ops`` only, so every layer runs on the TensorFlow, PyTorch and JAX backends. Each layer builds its
sublayers explicitly in ``build``, so a model loaded from a ``.keras`` file has all its weights before they are
restored.
"""

from __future__ import annotations

import keras
from keras import ops

from ..text import check_shared_vocabulary
from .addnorm import AddNorm, PositionwiseFeedForward
from .masking import causal_mask, combine_masks, padding_mask
from .multihead import MultiHeadAttention
from .positional import PositionalEncoding
from .text import TokenEmbedding, as_ids, check_ids, check_length, check_rank

register = keras.saving.register_keras_serializable(package="companion")


def _attend(mha: MultiHeadAttention, query, memory, mask, weights: dict | None, name: str):
    """``mha(query, memory, memory, mask)``; when ``weights`` is a dict, also store the attention weights there."""
    if weights is None:
        return mha(query, memory, memory, mask)
    out, weights[name] = mha(query, memory, memory, mask, return_weights=True)
    return out


@register
class EncoderLayer(keras.layers.Layer):
    """Self-attention then a position-wise feed-forward network, each inside Add & Norm.

    Args:
        d_model: model width (512 in the paper).
        num_heads: attention heads; must divide ``d_model``.
        d_ff: hidden width of the feed-forward network (2048 in the paper).
        dropout: dropout rate used everywhere in the layer.
        norm_first: pre-LN instead of the paper's post-LN.
    """

    def __init__(
        self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False, **kwargs
    ):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.d_ff, self.rate, self.norm_first = (
            d_model, num_heads, d_ff, dropout, norm_first
        )
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout, name="self_attn")
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout, name="ffn")
        self.addnorm1 = AddNorm(d_model, dropout, norm_first, name="addnorm1")
        self.addnorm2 = AddNorm(d_model, dropout, norm_first, name="addnorm2")

    def build(self, x_shape, mask_shape=None):
        self.self_attn.build(x_shape, x_shape, x_shape)
        self.ffn.build(x_shape)
        self.addnorm1.build(x_shape)
        self.addnorm2.build(x_shape)

    def call(self, x, mask=None, return_weights: bool = False, training=None):
        """``x`` ``(batch, seq_len, d_model)`` -> same shape.

        Args:
            mask: bool, True = may attend, broadcastable to ``(batch, num_heads, seq_len, seq_len)``; usually the
                source padding mask ``(batch, 1, 1, seq_len)``.
            return_weights: also return the self-attention weights ``(batch, num_heads, seq_len, seq_len)``.
            training: dropout on or off; Keras hands it down to every sublayer.

        Pass ``mask`` by keyword when it may be None: Keras fills an argument called ``mask`` that was left empty
        with the input's own Keras mask, and ``layer(x, None)`` then gets it twice.
        """
        weights = {} if return_weights else None  # _attend fills it for the heatmaps
        # Sublayer 1: each position attends to every real (non-padding) position of the same sentence.
        x = self.addnorm1(x, sublayer=lambda h: _attend(self.self_attn, h, h, mask, weights, "self"))
        # Sublayer 2: the same small network at every position.
        x = self.addnorm2(x, sublayer=self.ffn)
        return (x, weights["self"]) if return_weights else x

    def compute_output_shape(self, x_shape, mask_shape=None):
        return x_shape

    def compute_mask(self, *args, **kwargs):
        # Keras reads an argument called `mask` as a per-timestep mask and would attach it to the output (or warn
        # that it is dropped). Ours is an attention mask, used up inside the layer.
        return None

    def get_config(self):
        return {**super().get_config(), **_layer_config(self)}


@register
class DecoderLayer(keras.layers.Layer):
    """Masked self-attention, cross-attention over the encoder output, then the feed-forward network.

    The two attention layers are separate (their weights differ). In the cross-attention the decoder asks the
    questions: queries come from the decoder state, keys and values from the encoder output ``memory``.

    Args: as for :class:`EncoderLayer`.
    """

    def __init__(
        self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False, **kwargs
    ):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.d_ff, self.rate, self.norm_first = (
            d_model, num_heads, d_ff, dropout, norm_first
        )
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout, name="self_attn")
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout, name="cross_attn")
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout, name="ffn")
        self.addnorm1 = AddNorm(d_model, dropout, norm_first, name="addnorm1")
        self.addnorm2 = AddNorm(d_model, dropout, norm_first, name="addnorm2")
        self.addnorm3 = AddNorm(d_model, dropout, norm_first, name="addnorm3")

    def build(self, x_shape, memory_shape, self_mask_shape=None, memory_mask_shape=None):
        self.self_attn.build(x_shape, x_shape, x_shape)
        self.cross_attn.build(x_shape, memory_shape, memory_shape)
        self.ffn.build(x_shape)
        for addnorm in (self.addnorm1, self.addnorm2, self.addnorm3):
            addnorm.build(x_shape)

    def call(self, x, memory, self_mask=None, memory_mask=None, return_weights: bool = False, training=None):
        """x ``(batch, tgt_len, d_model)`` and memory ``(batch, src_len, d_model)`` -> ``(batch, tgt_len, d_model)``.

        Args:
            self_mask: broadcastable to ``(batch, num_heads, tgt_len, tgt_len)``: causal AND target padding.
            memory_mask: broadcastable to ``(batch, num_heads, tgt_len, src_len)``: the source padding mask.
            return_weights: also return the self-attention weights ``(batch, num_heads, tgt_len, tgt_len)`` and
                the cross-attention weights ``(batch, num_heads, tgt_len, src_len)`` (the alignment heatmaps).
        """
        weights = {} if return_weights else None  # _attend fills it for the heatmaps
        # Sublayer 1: masked self-attention: target position i sees target positions 0..i only.
        x = self.addnorm1(x, sublayer=lambda h: _attend(self.self_attn, h, h, self_mask, weights, "self"))
        # Sublayer 2: cross-attention: queries from the decoder, keys and values from the encoder output.
        x = self.addnorm2(x, sublayer=lambda h: _attend(self.cross_attn, h, memory, memory_mask, weights, "cross"))
        # Sublayer 3: the position-wise feed-forward network.
        x = self.addnorm3(x, sublayer=self.ffn)
        return (x, weights["self"], weights["cross"]) if return_weights else x

    def compute_output_shape(self, x_shape, memory_shape, self_mask_shape=None, memory_mask_shape=None):
        return x_shape

    def get_config(self):
        return {**super().get_config(), **_layer_config(self)}


def _layer_config(layer) -> dict:
    return {
        "d_model": layer.d_model,
        "num_heads": layer.num_heads,
        "d_ff": layer.d_ff,
        "dropout": layer.rate,
        "norm_first": layer.norm_first,
    }


@register
class Encoder(keras.layers.Layer):
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
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_layers, self.d_model, self.num_heads, self.d_ff, self.rate, self.norm_first = (
            num_layers, d_model, num_heads, d_ff, dropout, norm_first
        )
        self.layers = [
            EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first, name=f"layers_{i}") for i in range(num_layers)
        ]
        self.norm = keras.layers.LayerNormalization(epsilon=1e-5, name="norm") if norm_first else None

    def build(self, x_shape, mask_shape=None):
        for layer in self.layers:
            layer.build(x_shape)
        if self.norm is not None:
            self.norm.build(x_shape)

    def call(self, x, mask=None, training=None):
        """``(batch, src_len, d_model)`` -> ``(batch, src_len, d_model)``, the "memory" the decoder attends to."""
        for layer in self.layers:
            x = layer(x, mask=mask)
        return self.norm(x) if self.norm is not None else x

    def compute_output_shape(self, x_shape, mask_shape=None):
        return x_shape

    def compute_mask(self, *args, **kwargs):
        # Keras reads an argument called `mask` as a per-timestep mask and would attach it to the output (or warn
        # that it is dropped). Ours is an attention mask, used up inside the layer.
        return None

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, **_layer_config(self)}


@register
class Decoder(keras.layers.Layer):
    """``num_layers`` decoder layers, each attending to the same encoder output; final ``norm`` only for pre-LN."""

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_layers, self.d_model, self.num_heads, self.d_ff, self.rate, self.norm_first = (
            num_layers, d_model, num_heads, d_ff, dropout, norm_first
        )
        self.layers = [
            DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first, name=f"layers_{i}") for i in range(num_layers)
        ]
        self.norm = keras.layers.LayerNormalization(epsilon=1e-5, name="norm") if norm_first else None

    def build(self, x_shape, memory_shape, self_mask_shape=None, memory_mask_shape=None):
        for layer in self.layers:
            layer.build(x_shape, memory_shape)
        if self.norm is not None:
            self.norm.build(x_shape)

    def call(self, x, memory, self_mask=None, memory_mask=None, return_weights: bool = False, training=None):
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

    def compute_output_shape(self, x_shape, memory_shape, self_mask_shape=None, memory_mask_shape=None):
        return x_shape

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, **_layer_config(self)}


@register
class Transformer(keras.Model):
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
            (``src_vocab_size == tgt_vocab_size``); ``tgt_embed`` is then the same layer as ``src_embed`` and
            ``generator`` is a :class:`TiedOutput` that multiplies by the transposed table and adds its own bias.

    Every layer keeps its Keras default initialisation: Xavier/Glorot uniform for the ``Dense`` kernels, the same
    distribution as the PyTorch ``Transformer``'s linear weights, but uniform in [-0.05, 0.05] for the embedding
    tables (``keras.layers.Embedding``'s default), where the PyTorch ``Transformer`` uses Xavier/Glorot uniform
    (variance ``2 / (vocab_size + d_model)``). Chapter 1 compares the two.
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
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_shared_vocabulary(shared_embeddings, src_vocab_size, tgt_vocab_size)
        self.config = {
            "src_vocab_size": src_vocab_size,
            "tgt_vocab_size": tgt_vocab_size,
            "d_model": d_model,
            "num_heads": num_heads,
            "num_layers": num_layers,
            "d_ff": d_ff,
            "max_len": max_len,
            "dropout": dropout,
            "pad_id": pad_id,
            "norm_first": norm_first,
            "shared_embeddings": shared_embeddings,
        }
        self.src_vocab_size, self.tgt_vocab_size, self.d_model = src_vocab_size, tgt_vocab_size, d_model
        self.max_len, self.pad_id, self.shared_embeddings = max_len, pad_id, shared_embeddings
        self.src_embed = TokenEmbedding(src_vocab_size, d_model, name="src_embed")  # times sqrt(d_model)
        self.tgt_embed = (
            self.src_embed if shared_embeddings else TokenEmbedding(tgt_vocab_size, d_model, name="tgt_embed")
        )
        self.positional = PositionalEncoding(d_model, max_len, dropout, name="positional")  # shared: no weights
        self.encoder = Encoder(num_layers, d_model, num_heads, d_ff, dropout, norm_first, name="encoder")
        self.decoder = Decoder(num_layers, d_model, num_heads, d_ff, dropout, norm_first, name="decoder")
        self.generator = (
            TiedOutput(self.src_embed.embedding, name="generator")
            if shared_embeddings
            else keras.layers.Dense(tgt_vocab_size, name="generator")
        )

    def build(self, src_ids_shape, tgt_ids_shape):
        check_rank(src_ids_shape, "src_ids")
        check_rank(tgt_ids_shape, "tgt_ids")
        src_shape, tgt_shape = (*src_ids_shape, self.d_model), (*tgt_ids_shape, self.d_model)
        self.src_embed.build(src_ids_shape)
        if not self.tgt_embed.built:  # the same layer as src_embed when the embeddings are shared
            self.tgt_embed.build(tgt_ids_shape)
        self.encoder.build(src_shape)
        self.decoder.build(tgt_shape, src_shape)
        self.generator.build(tgt_shape)

    def _check(self, ids, vocab_size: int, name: str) -> None:
        check_ids(ids, vocab_size, name)
        check_length(ids, self.max_len, name)

    def encode(self, src_ids):
        """``src_ids`` ``(batch, src_len)`` -> ``memory`` ``(batch, src_len, d_model)`` and ``src_mask``
        ``(batch, 1, 1, src_len)``."""
        src_ids = as_ids(src_ids)
        self._check(src_ids, self.src_vocab_size, "src_ids")
        src_mask = padding_mask(src_ids, self.pad_id)
        memory = self.encoder(self.positional(self.src_embed(src_ids)), mask=src_mask)
        return memory, src_mask

    def decode(self, tgt_ids, memory, src_mask, return_weights: bool = False):
        """``tgt_ids`` ``(batch, tgt_len)`` -> logits ``(batch, tgt_len, tgt_vocab)`` (no softmax).

        With ``return_weights`` also the per-layer self- and cross-attention weights (see :class:`Decoder`).
        """
        tgt_ids = as_ids(tgt_ids)
        self._check(tgt_ids, self.tgt_vocab_size, "tgt_ids")
        if None not in (tgt_ids.shape[0], memory.shape[0]) and tgt_ids.shape[0] != memory.shape[0]:
            raise ValueError(f"tgt_ids has batch {tgt_ids.shape[0]} but memory has batch {memory.shape[0]}")
        tgt_mask = combine_masks(padding_mask(tgt_ids, self.pad_id), causal_mask(ops.shape(tgt_ids)[1]))
        y = self.positional(self.tgt_embed(tgt_ids))
        decoded = self.decoder(y, memory, self_mask=tgt_mask, memory_mask=src_mask, return_weights=return_weights)
        if return_weights:
            y, self_weights, cross_weights = decoded
            return self.generator(y), self_weights, cross_weights
        return self.generator(decoded)

    def call(self, src_ids, tgt_ids, training=None):
        """src_ids ``(batch, src_len)`` and tgt_ids ``(batch, tgt_len)`` -> logits ``(batch, tgt_len, tgt_vocab)``."""
        memory, src_mask = self.encode(src_ids)
        return self.decode(tgt_ids, memory, src_mask)

    def get_config(self):
        return {**super().get_config(), **self.config}


@register
class TiedOutput(keras.layers.Layer):
    """The pre-softmax linear layer tied to an embedding table: ``logits = y @ table.T + bias``.

    The table ``(vocab_size, d_model)`` belongs to ``embedding`` (a ``keras.layers.Embedding``) and is not
    copied: a gradient from the logits and one from the embedding lookup update the same variable. Only the bias
    ``(vocab_size,)`` is this layer's own. ``(batch, seq_len, d_model)`` -> ``(batch, seq_len, vocab_size)``.
    The layer is created by :class:`Transformer`, which passes its own embedding (so it has no config of its own).
    """

    def __init__(self, embedding: keras.layers.Embedding, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding
        self.vocab_size = embedding.input_dim

    def build(self, y_shape):
        self.bias = self.add_weight(shape=(self.vocab_size,), initializer="zeros", name="bias")

    def call(self, y):
        return ops.matmul(y, ops.transpose(self.embedding.embeddings)) + self.bias

    def compute_output_shape(self, y_shape):
        return (*y_shape[:-1], self.vocab_size)
