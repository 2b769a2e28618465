"""A decoder-only Transformer (GPT) in Keras 3, and text generation with it.

The public names, identical in ``companion.torch.gpt`` (a stable agreement other modules rely on):

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
``(batch, num_heads, cached_len, d_head)``, and each step only computes the new positions. It is a plain method,
not a Keras call, so the cache goes in and out as it is; the model must be built (called once) first.
"""

from __future__ import annotations

import keras
from keras import ops

from ..sampling import check_sampling_args, make_rng, sample_next
from .addnorm import AddNorm, PositionwiseFeedForward
from .masking import causal_mask
from .multihead import MultiHeadAttention
from .text import as_ids, check_ids

__all__ = ["GPT", "GPTBlock", "cache_length", "generate"]

register = keras.saving.register_keras_serializable(package="companion")


@register
class GPTBlock(keras.layers.Layer):
    """Masked self-attention then the feed-forward network, each inside a pre-LN Add & Norm.

    It is the encoder layer of chapter 6 with ``norm_first=True``, run under a causal mask.

    Args:
        d_model, num_heads, d_ff: as for the Transformer's layers.
        dropout: on the attention weights and on each sublayer's output.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.d_ff, self.rate = d_model, num_heads, d_ff, dropout
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout, name="self_attn")
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout, name="ffn")
        self.addnorm1 = AddNorm(d_model, dropout, norm_first=True, name="addnorm1")
        self.addnorm2 = AddNorm(d_model, dropout, norm_first=True, name="addnorm2")

    def build(self, x_shape, mask_shape=None):
        self.self_attn.build(x_shape, x_shape, x_shape)
        self.ffn.build(x_shape)
        self.addnorm1.build(x_shape)
        self.addnorm2.build(x_shape)

    def call(self, x, mask=None, training=None):
        """``x`` ``(batch, length, d_model)`` -> same shape; ``mask`` is usually ``causal_mask(length)``.

        Pass ``mask`` by keyword: Keras fills an empty argument called ``mask`` with the input's own Keras mask.
        """
        x = self.addnorm1(x, sublayer=lambda h: self.self_attn(h, h, h, mask))
        return self.addnorm2(x, sublayer=self.ffn)

    def forward_cached(self, x, past=None, mask=None):
        """The new positions ``x`` ``(batch, new_len, d_model)``, given the keys and values ``past`` of the earlier
        ones -> the output for the new positions, same shape, and the grown ``(k, v)``.

        ``mask`` is broadcastable to ``(batch, num_heads, new_len, past_len + new_len)``.
        """
        grown = {}

        def self_attention(h):
            out, grown["kv"] = self.self_attn.self_attention_cached(h, past, mask)
            return out

        x = self.addnorm1(x, sublayer=self_attention)
        return self.addnorm2(x, sublayer=self.ffn), grown["kv"]

    def compute_output_shape(self, x_shape, mask_shape=None):
        return x_shape

    def compute_mask(self, *args, **kwargs):
        # Our `mask` is an attention mask used up inside the layer, not a Keras per-timestep mask.
        return None

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads, "d_ff": self.d_ff,
                "dropout": self.rate}


def cache_length(cache) -> int:
    """How many positions a cache holds (0 for None)."""
    return 0 if not cache else int(cache[0][0].shape[2])


@register
class GPT(keras.Model):
    """A decoder-only Transformer language model: ids ``(batch, length)`` -> logits ``(batch, length, vocab_size)``.

    Args:
        vocab_size: number of token ids.
        d_model, num_heads, num_layers, d_ff: width, heads, blocks and feed-forward width.
        max_len: longest sequence (the size of the learned position table).
        dropout: one rate for the embeddings, the attention weights and every sublayer output.
        tie_weights: compute the logits with the token embedding table (``h @ E^T``) instead of a separate
            ``head`` layer (``Dense(vocab_size, use_bias=False)``); saves ``vocab_size * d_model`` weights.

    Weights: ``token_embed`` and ``position_embed`` (``keras.layers.Embedding``, initialised with a normal of
    standard deviation 0.02), ``blocks`` (:class:`GPTBlock`; not ``layers``, which ``keras.Model`` reserves), the
    final ``norm``, and ``head`` when not tied. The matrices of the blocks start Glorot-uniform (Keras' default),
    as in the torch twin. ``companion.reference.gpt_parameter_count`` gives the count by formula.
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
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in {"vocab_size": vocab_size, "d_model": d_model, "num_layers": num_layers,
                            "d_ff": d_ff, "max_len": max_len}.items():
            if value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value}")
        self.config = {"vocab_size": vocab_size, "d_model": d_model, "num_heads": num_heads,
                       "num_layers": num_layers, "d_ff": d_ff, "max_len": max_len, "dropout": dropout,
                       "tie_weights": tie_weights}
        self.vocab_size, self.d_model, self.num_heads, self.num_layers = vocab_size, d_model, num_heads, num_layers
        self.d_ff, self.max_len, self.tie_weights = d_ff, max_len, tie_weights
        init = keras.initializers.RandomNormal(stddev=0.02)
        self.token_embed = keras.layers.Embedding(vocab_size, d_model, embeddings_initializer=init, name="token_embed")
        self.position_embed = keras.layers.Embedding(max_len, d_model, embeddings_initializer=init,
                                                     name="position_embed")
        self.dropout = keras.layers.Dropout(dropout)
        self.blocks = [GPTBlock(d_model, num_heads, d_ff, dropout, name=f"blocks_{i}") for i in range(num_layers)]
        self.norm = keras.layers.LayerNormalization(epsilon=1e-5, name="norm")
        self.head = None if tie_weights else keras.layers.Dense(vocab_size, use_bias=False, name="head")

    def build(self, ids_shape):
        if len(ids_shape) != 2:
            raise ValueError(f"ids must have shape (batch, length); got shape {tuple(ids_shape)}")
        x_shape = (*ids_shape, self.d_model)
        self.token_embed.build(ids_shape)
        self.position_embed.build((ids_shape[1],))
        for block in self.blocks:
            block.build(x_shape)
        self.norm.build(x_shape)
        if self.head is not None:
            self.head.build(x_shape)

    def _check(self, ids, past: int = 0) -> None:
        check_ids(ids, self.vocab_size, "ids")
        length = ids.shape[1]
        if length is not None and not past < length <= self.max_len:  # None while tracing a graph
            raise ValueError(
                f"ids must have between {past + 1} and max_len={self.max_len} tokens"
                + (f" (the cache holds {past})" if past else "") + f"; got {length}"
            )

    def _embed(self, ids, start: int, training=None):
        """Token plus position vectors of ``ids`` ``(batch, n)`` sitting at positions ``start..start+n-1``."""
        positions = ops.arange(start, start + ops.shape(ids)[1])
        x = self.token_embed(ids) + self.position_embed(positions)  # (batch, n, d_model)
        return self.dropout(x, training=training)

    def _logits(self, h):
        """``(batch, n, d_model)`` -> ``(batch, n, vocab_size)``: the final LayerNorm, then the output layer."""
        h = self.norm(h)
        if self.head is None:
            return ops.matmul(h, ops.transpose(ops.cast(self.token_embed.embeddings, h.dtype)))
        return self.head(h)

    def call(self, ids, training=None):
        """ids ``(batch, length)`` -> logits ``(batch, length, vocab_size)``; position ``i`` sees tokens ``0..i``."""
        ids = as_ids(ids)
        self._check(ids)
        x = self._embed(ids, 0, training)
        mask = causal_mask(ops.shape(ids)[1])  # (1, 1, length, length)
        for block in self.blocks:
            x = block(x, mask=mask, training=training)
        return self._logits(x)

    def forward_cached(self, ids, cache=None):
        """The logits of the positions of ``ids`` that ``cache`` does not hold yet, and the grown cache.

        Args:
            ids: ``(batch, length)``: the whole sequence so far. Its first ``cache_length(cache)`` tokens must be
                the ones the cache was built from; only the others are computed.
            cache: one ``(k, v)`` per block, each ``(batch, num_heads, cached_len, d_head)``; None to start.

        Returns:
            logits ``(batch, length - cached_len, vocab_size)`` (equal to ``model(ids)[:, cached_len:]``) and the
            cache of all ``length`` positions. Runs in inference mode (no dropout).
        """
        ids = as_ids(ids)
        if not self.built:
            self.build(tuple(ids.shape))
        past = cache_length(cache)
        self._check(ids, past)
        if cache is not None and (len(cache) != self.num_layers or cache[0][0].shape[0] != ids.shape[0]):
            raise ValueError(
                f"cache must hold one (k, v) per block ({self.num_layers}) for a batch of {ids.shape[0]}; got "
                f"{len(cache)} pairs for a batch of {cache[0][0].shape[0] if cache else 0}"
            )
        length = ids.shape[1]
        x = self._embed(ids[:, past:], past, training=False)
        # A new position may see every cached one and the new ones up to itself: rows past.. of the causal mask.
        # A single new position sees everything, so it needs no mask.
        mask = causal_mask(length)[:, :, past:] if length - past > 1 else None
        grown = []
        for index, block in enumerate(self.blocks):
            x, kv = block.forward_cached(x, None if cache is None else cache[index], mask)
            grown.append(kv)
        return self._logits(x), grown

    def get_config(self):
        return {**super().get_config(), **self.config}


def generate(
    model: GPT,
    ids,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    use_cache: bool = True,
):
    """Continue each prompt of ``ids`` ``(batch, length)`` by ``max_new_tokens`` tokens, one at a time.

    Each step feeds the sequence so far, takes the logits of its last position and picks the next token with
    ``companion.sampling.sample_next`` (temperature, then top-k, then top-p; ``temperature=0`` is greedy).
    ``seed`` makes the draws reproducible: the same model, prompt and seed give the same tokens here and in
    ``companion.torch.gpt.generate``. With ``use_cache`` each step computes only the new position (see
    :meth:`GPT.forward_cached`); without it every step runs the whole sequence. Both give the same tokens.

    Returns:
        int32 tensor ``(batch, length + max_new_tokens)``: the prompt followed by the new tokens. The whole result
        must fit in the model: ``length + max_new_tokens <= max_len``.
    """
    check_sampling_args(temperature, top_k, top_p)
    ids = as_ids(ids)
    check_ids(ids, model.vocab_size, "ids")
    ids = ops.cast(ids, "int32")
    if max_new_tokens < 0 or not 1 <= ids.shape[1] <= model.max_len - max_new_tokens:
        raise ValueError(
            f"ids (batch, length) plus max_new_tokens must fit in max_len={model.max_len} with length >= 1 and "
            f"max_new_tokens >= 0; got length {ids.shape[1]} and max_new_tokens {max_new_tokens}"
        )
    rng = make_rng(seed)
    cache = None
    for _ in range(max_new_tokens):
        if use_cache:
            logits, cache = model.forward_cached(ids, cache)
        else:
            logits = model(ids, training=False)
        last = ops.convert_to_numpy(ops.cast(logits[:, -1], "float32"))  # (batch, vocab_size)
        next_ids = ops.convert_to_tensor(sample_next(last, temperature, top_k, top_p, rng).astype("int32"))
        ids = ops.concatenate([ids, next_ids[:, None]], axis=1)
    return ids
