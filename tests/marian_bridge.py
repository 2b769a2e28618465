"""The course's PyTorch ``Transformer`` as a Hugging Face ``MarianMTModel``: same numbers, Hugging Face's code.

Used by ``tests/test_generate_reference.py`` to run ``generate`` on the course's model. Neither model's code is
touched: the configuration and the weights carry every difference.

=============================  ==========================================  =========================================
convention                     course (``companion.torch.Transformer``)    Marian, and how it is bridged
=============================  ==========================================  =========================================
layer order                    post-LN, no final LayerNorm per stack       post-LN, no final LayerNorm (as is)
feed-forward                   ReLU                                        ``activation_function="relu"``
embedding scale                ``* sqrt(d_model)``                         ``scale_embedding=True``
LayerNorm                      eps 1e-5, with gamma and beta               ``nn.LayerNorm`` default eps 1e-5 (as is)
projections                    ``nn.Linear`` with bias, ``wq wk wv wo``    ``q_proj k_proj v_proj out_proj`` with bias
sinusoidal table               sin and cos *interleaved* (columns 2i,      sin in the first half, cos in the second
                               2i + 1 share frequency i)                   (column i and d/2 + i share frequency i):
                                                                           every d_model axis is permuted, see below
embeddings, output layer       separate source, target and output tables   ``share_encoder_decoder_embeddings=False``,
                               (``shared_embeddings=False``)               ``tie_word_embeddings=False``
output bias                    ``generator.bias``                          ``lm_head`` has none: the bias goes into the
                                                                           buffer ``final_logits_bias``
special ids                    PAD, ``<s>``, ``</s>`` of the vocabulary    ``pad_token_id``, ``decoder_start_token_id``
                                                                           = ``<s>``, ``eos_token_id``;
                                                                           ``forced_eos_token_id=None`` (Marian's
                                                                           default 0 would force ``</s>`` at the
                                                                           last step), ``bos_token_id=None``
padding                        keys that are PAD are masked, in the        the encoder and the cross-attention mask
                               encoder, the cross-attention *and* the      what ``attention_mask`` masks (passed
                               decoder's self-attention                    explicitly); the decoder masks nothing.
                                                                           Equal as long as no prefix holds PAD,
                                                                           i.e. as long as PAD is never generated:
                                                                           the tests give PAD a -inf output bias
positions                      ``max_len`` rows                            ``max_position_embeddings=max_len``
dropout                        ``eval()``                                  ``eval()`` (and every rate 0)
=============================  ==========================================  =========================================

**The permutation.** Marian's table puts ``sin(pos * w_i)`` in column ``i`` and ``cos(pos * w_i)`` in column
``d/2 + i``; the course's puts them in columns ``2i`` and ``2i + 1``. So Marian's hidden coordinate ``m`` is the
course's coordinate ``perm[m]`` with ``perm = [0, 2, 4, ..., 1, 3, 5, ...]`` (:func:`halves_from_interleaved`).
Relabelling the residual stream's coordinates this way everywhere is exact: it selects the columns of every weight
that reads the stream (embedding tables, ``wq``, ``wk``, ``wv``, ``linear1``, the output layer) and the rows and
bias entries of every weight that writes it (``wo``, ``linear2``), and permutes LayerNorm's gamma and beta
(LayerNorm's mean and variance do not depend on the order of the coordinates). The attention heads' own axes and
the feed-forward's hidden axis are not part of the stream and keep their order.

With this, the two models' logits agree to float32 round-off (about 1e-5); ``test_generate_reference.py`` checks it.
"""

from __future__ import annotations

import torch
from torch import nn


def halves_from_interleaved(d_model: int) -> torch.Tensor:
    """``perm`` ``(d_model,)`` with Marian's coordinate ``m`` = the course's coordinate ``perm[m]``:
    ``[0, 2, ..., d_model - 2, 1, 3, ..., d_model - 1]`` (sines first, then cosines)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_config(model: nn.Module, pad_id: int, bos_id: int, eos_id: int):
    """A ``MarianConfig`` with the course model's sizes and conventions (see the table in the module docstring)."""
    import transformers

    d_model = model.src_embed.d_model
    layer = model.encoder.layers[0]
    if model.shared_embeddings or layer.addnorm1.norm_first:
        raise ValueError("the bridge covers the course's default Transformer: post-LN, separate embeddings")
    if model.pad_id != pad_id:
        raise ValueError(f"the model masks pad_id={model.pad_id}, not {pad_id}")
    return transformers.MarianConfig(
        vocab_size=model.src_vocab_size,
        decoder_vocab_size=model.tgt_vocab_size,
        d_model=d_model,
        encoder_layers=len(model.encoder.layers),
        decoder_layers=len(model.decoder.layers),
        encoder_attention_heads=layer.self_attn.num_heads,
        decoder_attention_heads=model.decoder.layers[0].self_attn.num_heads,
        encoder_ffn_dim=layer.ffn.linear1.out_features,
        decoder_ffn_dim=model.decoder.layers[0].ffn.linear1.out_features,
        max_position_embeddings=model.max_len,
        activation_function="relu",
        scale_embedding=True,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        decoder_start_token_id=bos_id,
        bos_token_id=None,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=False,
        tie_word_embeddings=False,
    )


@torch.no_grad()
def copy_to_marian(model: nn.Module, marian: nn.Module) -> list[str]:
    """Copy the course model's weights into ``marian`` (a ``MarianMTModel`` built from :func:`marian_config`),
    permuting the hidden coordinates. Returns the names of the Marian parameters and buffers it wrote."""
    perm = halves_from_interleaved(model.src_embed.d_model)
    written: list[str] = []
    targets = dict(marian.named_parameters()) | dict(marian.named_buffers())

    def put(name: str, value: torch.Tensor) -> None:
        targets[name].copy_(value)
        written.append(name)

    def reads_stream(prefix: str, linear: nn.Linear) -> None:  # input axis = the residual stream
        put(f"{prefix}.weight", linear.weight[:, perm])
        put(f"{prefix}.bias", linear.bias)

    def writes_stream(prefix: str, linear: nn.Linear) -> None:  # output axis = the residual stream
        put(f"{prefix}.weight", linear.weight[perm])
        put(f"{prefix}.bias", linear.bias[perm])

    def norm(prefix: str, layer_norm: nn.LayerNorm) -> None:
        put(f"{prefix}.weight", layer_norm.weight[perm])
        put(f"{prefix}.bias", layer_norm.bias[perm])

    def attention(prefix: str, mha: nn.Module) -> None:
        for ours, theirs in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj")):
            reads_stream(f"{prefix}.{theirs}", getattr(mha, ours))
        writes_stream(f"{prefix}.out_proj", mha.wo)

    def feed_forward(prefix: str, ffn: nn.Module) -> None:
        reads_stream(f"{prefix}.fc1", ffn.linear1)
        writes_stream(f"{prefix}.fc2", ffn.linear2)

    put("model.encoder.embed_tokens.weight", model.src_embed.embedding.weight[:, perm])
    put("model.decoder.embed_tokens.weight", model.tgt_embed.embedding.weight[:, perm])
    for i, layer in enumerate(model.encoder.layers):
        prefix = f"model.encoder.layers.{i}"
        attention(f"{prefix}.self_attn", layer.self_attn)
        norm(f"{prefix}.self_attn_layer_norm", layer.addnorm1.norm)
        feed_forward(prefix, layer.ffn)
        norm(f"{prefix}.final_layer_norm", layer.addnorm2.norm)
    for i, layer in enumerate(model.decoder.layers):
        prefix = f"model.decoder.layers.{i}"
        attention(f"{prefix}.self_attn", layer.self_attn)
        norm(f"{prefix}.self_attn_layer_norm", layer.addnorm1.norm)
        attention(f"{prefix}.encoder_attn", layer.cross_attn)
        norm(f"{prefix}.encoder_attn_layer_norm", layer.addnorm2.norm)
        feed_forward(prefix, layer.ffn)
        norm(f"{prefix}.final_layer_norm", layer.addnorm3.norm)
    put("lm_head.weight", model.generator.weight[:, perm])
    put("final_logits_bias", model.generator.bias[None])
    return written


def marian_twin(model: nn.Module, pad_id: int, bos_id: int, eos_id: int):
    """A ``MarianMTModel`` (random-initialised from :func:`marian_config`, then overwritten) that computes the same
    logits as the course's ``model``; in eval mode."""
    import transformers

    marian = transformers.MarianMTModel(marian_config(model, pad_id, bos_id, eos_id)).eval()
    copy_to_marian(model, marian)
    return marian
