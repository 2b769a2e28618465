"""Source 004's MinTransformer in Keras 3: the stripped-down 2+2-layer encoder-decoder that the course counts and
compares with the paper's model (``companion.keras.model``).

Reading order: ``AttentionHead`` -> ``MinEncoderLayer`` / ``MinDecoderLayer`` -> ``MinTransformer``. The model
has no positional encoding, no residual connections and no LayerNorm, which is what chapter 7 uses it to show.
Same names and arguments as ``companion.torch.min_transformer``; ``keras.ops`` only, so any backend.
"""

from __future__ import annotations

import keras
from keras import ops

from .addnorm import PositionwiseFeedForward
from .attention import scaled_dot_product_attention
from .masking import causal_mask
from .text import as_ids, check_ids, check_length, check_rank

register = keras.saving.register_keras_serializable(package="companion")


@register
class AttentionHead(keras.layers.Layer):
    """One attention head as source 004 builds it: bias-free ``Wq, Wk, Wv`` of ``d_model x d_head``, no output
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
    """Source 004's encoder layer: heads, then the fully connected sublayer. No residual, no LayerNorm."""

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
    """Source 004's decoder layer with the attention roles put right.

    The source creates the masked self-attention heads but never calls them, and its cross-attention takes queries
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

    The weights exist once the model is built: call it once or ``model.build((batch, n_steps), (batch, n_steps))``.

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
        check_rank(src_ids_shape, "src_ids")
        check_rank(tgt_ids_shape, "tgt_ids")
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
        check_length(ids, self.n_steps, name, "n_steps")

    def call(self, src_ids, tgt_ids):
        """src_ids ``(batch, src_len)`` and tgt_ids ``(batch, tgt_len)`` -> logits ``(batch, tgt_len, tgt_vocab)``."""
        src_ids, tgt_ids = as_ids(src_ids), as_ids(tgt_ids)
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
