"""The Transformer of "Attention Is All You Need" in Keras 3, layer by layer, plus seed 004's MinTransformer.

Reading order: ``EncoderLayer`` -> ``DecoderLayer`` -> ``Encoder`` / ``Decoder`` (stacks) -> ``Transformer``
(embeddings, masks, generator). ``MinTransformer`` is the stripped-down 2+2-layer model of seed 004, kept to
count its parameters and to show what the missing parts (positions, residuals, normalization) are for.

``keras.ops`` only, so every layer runs on the TensorFlow, PyTorch and JAX backends. Each layer builds its
sublayers explicitly in ``build``, so a model loaded from a ``.keras`` file has all its weights before they are
restored.
"""

from __future__ import annotations

import keras
from keras import ops

from .addnorm import AddNorm, PositionwiseFeedForward
from .attention import scaled_dot_product_attention
from .masking import causal_mask, combine_masks, padding_mask
from .multihead import MultiHeadAttention
from .positional import PositionalEncoding
from .text import TokenEmbedding, check_ids

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


def _as_ids(ids):
    """Lists and NumPy arrays -> a backend integer tensor (tensors pass through)."""
    return ids if ops.is_tensor(ids) else ops.convert_to_tensor(ids)


def _check_rank(shape, name: str) -> None:
    """Keras builds a model from the shapes of its first inputs: catch wrong ids there, before any weight exists."""
    if len(shape) != 2:
        raise ValueError(f"{name} must have shape (batch, seq_len); got shape {tuple(shape)}")


def _check_length(ids, max_len: int, name: str, what: str = "max_len") -> None:
    length = ids.shape[1]
    if length is not None and not 1 <= length <= max_len:  # None while tracing a graph: not known yet
        raise ValueError(f"{name} must have between 1 and {what}={max_len} tokens; got {length}")


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
        _check_shared(shared_embeddings, src_vocab_size, tgt_vocab_size)
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
        _check_rank(src_ids_shape, "src_ids")
        _check_rank(tgt_ids_shape, "tgt_ids")
        src_shape, tgt_shape = (*src_ids_shape, self.d_model), (*tgt_ids_shape, self.d_model)
        self.src_embed.build(src_ids_shape)
        if not self.tgt_embed.built:  # the same layer as src_embed when the embeddings are shared
            self.tgt_embed.build(tgt_ids_shape)
        self.encoder.build(src_shape)
        self.decoder.build(tgt_shape, src_shape)
        self.generator.build(tgt_shape)

    def _check(self, ids, vocab_size: int, name: str) -> None:
        check_ids(ids, vocab_size, name)
        _check_length(ids, self.max_len, name)

    def encode(self, src_ids):
        """``src_ids`` ``(batch, src_len)`` -> ``memory`` ``(batch, src_len, d_model)`` and ``src_mask``
        ``(batch, 1, 1, src_len)``."""
        src_ids = _as_ids(src_ids)
        self._check(src_ids, self.src_vocab_size, "src_ids")
        src_mask = padding_mask(src_ids, self.pad_id)
        memory = self.encoder(self.positional(self.src_embed(src_ids)), mask=src_mask)
        return memory, src_mask

    def decode(self, tgt_ids, memory, src_mask, return_weights: bool = False):
        """``tgt_ids`` ``(batch, tgt_len)`` -> logits ``(batch, tgt_len, tgt_vocab)`` (no softmax).

        With ``return_weights`` also the per-layer self- and cross-attention weights (see :class:`Decoder`).
        """
        tgt_ids = _as_ids(tgt_ids)
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


def _check_shared(shared_embeddings: bool, src_vocab_size: int, tgt_vocab_size: int) -> None:
    if shared_embeddings and src_vocab_size != tgt_vocab_size:
        raise ValueError(
            "shared_embeddings=True needs one joint vocabulary: src_vocab_size must equal tgt_vocab_size; got "
            f"{src_vocab_size} and {tgt_vocab_size}"
        )


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


# ---------------------------------------------------------------------------------------------------------------
# Seed 004's MinTransformer
# ---------------------------------------------------------------------------------------------------------------


@register
class AttentionHead(keras.layers.Layer):
    """One attention head as seed 004 builds it: bias-free ``Wq, Wk, Wv`` of ``d_model x d_head``, no output
    projection. ``(batch, query_len, d_model)`` -> ``(batch, query_len, d_head)``."""

    def __init__(self, d_model: int, d_head: int, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_head = d_model, d_head
        self.wq = keras.layers.Dense(d_head, use_bias=False, name="wq")
        self.wk = keras.layers.Dense(d_head, use_bias=False, name="wk")
        self.wv = keras.layers.Dense(d_head, use_bias=False, name="wv")

    def build(self, query_shape, key_shape=None, value_shape=None, mask_shape=None):
        self.wq.build(query_shape)
        self.wk.build(query_shape if key_shape is None else key_shape)
        self.wv.build(query_shape if value_shape is None else value_shape)

    def call(self, query, key, value, mask=None):
        return scaled_dot_product_attention(self.wq(query), self.wk(key), self.wv(value), mask)

    def compute_output_shape(self, query_shape, key_shape=None, value_shape=None, mask_shape=None):
        return (*query_shape[:-1], self.d_head)

    def compute_mask(self, *args, **kwargs):
        return None  # `mask` is an attention mask, not a Keras per-timestep mask to attach to the output

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "d_head": self.d_head}


def _concat_heads(heads: list, query, key, value, mask=None):
    """Run every head and concatenate their outputs: ``num_heads * d_head = d_model`` features, no ``W_O``."""
    return ops.concatenate([head(query, key, value, mask) for head in heads], axis=-1)


@register
class MinEncoderLayer(keras.layers.Layer):
    """Seed 004's encoder layer: heads, then the fully connected sublayer. No residual, no LayerNorm."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.d_ff = d_model, num_heads, d_ff
        self.heads = [AttentionHead(d_model, d_model // num_heads, name=f"heads_{i}") for i in range(num_heads)]
        self.ffn = PositionwiseFeedForward(d_model, d_ff, name="ffn")

    def build(self, x_shape):
        for head in self.heads:
            head.build(x_shape)
        self.ffn.build(x_shape)

    def call(self, x):
        """``(batch, src_len, d_model)`` -> same shape."""
        return self.ffn(_concat_heads(self.heads, x, x, x))

    def compute_output_shape(self, x_shape):
        return x_shape

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads, "d_ff": self.d_ff}


@register
class MinDecoderLayer(keras.layers.Layer):
    """Seed 004's decoder layer with the attention roles put right.

    The seed creates the masked self-attention heads but never calls them, and its cross-attention takes queries
    and keys from the encoder and values from the decoder. Here ``self_heads`` do the masked self-attention and
    ``cross_heads`` take queries from the decoder and keys and values from the encoder output.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.d_ff = d_model, num_heads, d_ff
        d_head = d_model // num_heads
        self.self_heads = [AttentionHead(d_model, d_head, name=f"self_heads_{i}") for i in range(num_heads)]
        self.cross_heads = [AttentionHead(d_model, d_head, name=f"cross_heads_{i}") for i in range(num_heads)]
        self.ffn = PositionwiseFeedForward(d_model, d_ff, name="ffn")

    def build(self, x_shape, memory_shape, mask_shape=None):
        for head in self.self_heads:
            head.build(x_shape)
        for head in self.cross_heads:
            head.build(x_shape, memory_shape, memory_shape)
        self.ffn.build(x_shape)

    def call(self, x, memory, mask=None):
        """x ``(batch, tgt_len, d_model)`` and memory ``(batch, src_len, d_model)`` -> ``(batch, tgt_len, d_model)``."""
        h = _concat_heads(self.self_heads, x, x, x, mask)
        h = _concat_heads(self.cross_heads, h, memory, memory)
        return self.ffn(h)

    def compute_output_shape(self, x_shape, memory_shape, mask_shape=None):
        return x_shape

    def compute_mask(self, *args, **kwargs):
        return None  # `mask` is an attention mask, not a Keras per-timestep mask to attach to the output

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads, "d_ff": self.d_ff}


@register
class MinTransformer(keras.Model):
    """A faithful replica of seed 004's "MinTransformer" (2 encoder + 2 decoder layers), with the cross-attention
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

    The weights exist once the model is built: call it once or ``model.build((batch, n_steps), (batch, n_steps))``.

    Args:
        n_steps: longest sequence accepted (the seed pads or truncates every sentence to it).
        src_vocab_size, tgt_vocab_size, num_heads, d_model, d_ff: as in the seed.
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
        **kwargs,
    ):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        self.config = {
            "n_steps": n_steps,
            "src_vocab_size": src_vocab_size,
            "tgt_vocab_size": tgt_vocab_size,
            "num_heads": num_heads,
            "d_model": d_model,
            "d_ff": d_ff,
        }
        self.n_steps, self.src_vocab_size, self.tgt_vocab_size, self.d_model = (
            n_steps, src_vocab_size, tgt_vocab_size, d_model
        )
        self.src_embed = keras.layers.Embedding(src_vocab_size, d_model, name="src_embed")
        self.tgt_embed = keras.layers.Embedding(tgt_vocab_size, d_model, name="tgt_embed")
        self.encoder_layers = [
            MinEncoderLayer(d_model, num_heads, d_ff, name=f"encoder_layers_{i}")
            for i in range(self.num_encoder_layers)
        ]
        self.decoder_layers = [
            MinDecoderLayer(d_model, num_heads, d_ff, name=f"decoder_layers_{i}")
            for i in range(self.num_decoder_layers)
        ]
        self.generator = keras.layers.Dense(tgt_vocab_size, name="generator")

    def build(self, src_ids_shape, tgt_ids_shape):
        _check_rank(src_ids_shape, "src_ids")
        _check_rank(tgt_ids_shape, "tgt_ids")
        src_shape, tgt_shape = (*src_ids_shape, self.d_model), (*tgt_ids_shape, self.d_model)
        self.src_embed.build(src_ids_shape)
        self.tgt_embed.build(tgt_ids_shape)
        for layer in self.encoder_layers:
            layer.build(src_shape)
        for layer in self.decoder_layers:
            layer.build(tgt_shape, src_shape)
        self.generator.build(tgt_shape)

    def _check(self, ids, vocab_size: int, name: str) -> None:
        check_ids(ids, vocab_size, name)
        _check_length(ids, self.n_steps, name, "n_steps")

    def call(self, src_ids, tgt_ids):
        """src_ids ``(batch, src_len)`` and tgt_ids ``(batch, tgt_len)`` -> logits ``(batch, tgt_len, tgt_vocab)``."""
        src_ids, tgt_ids = _as_ids(src_ids), _as_ids(tgt_ids)
        self._check(src_ids, self.src_vocab_size, "src_ids")
        self._check(tgt_ids, self.tgt_vocab_size, "tgt_ids")
        memory = self.src_embed(src_ids)
        for layer in self.encoder_layers:
            memory = layer(memory)
        # (1, tgt_len, tgt_len): the heads work on 3-D tensors (no head axis), so drop causal_mask's head axis.
        mask = causal_mask(ops.shape(tgt_ids)[1])[0]
        y = self.tgt_embed(tgt_ids)
        for layer in self.decoder_layers:
            y = layer(y, memory, mask)
        return self.generator(y)

    def get_config(self):
        return {**super().get_config(), **self.config}
