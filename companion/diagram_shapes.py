"""The numbers behind ``companion.diagrams``: shapes and decoding steps computed by running the NumPy oracle.

Nothing here draws. Each function runs ``companion.reference`` on arrays of the requested sizes and returns the
shapes (or, for greedy decoding, the tokens and probabilities) that the diagrams print. Weights are zero arrays with
zero strides (:func:`_zeros`), so a run of the paper's base model allocates only its activations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from companion import reference
from companion.convert import dense_numpy
from companion.reference import model as ref_model

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Config:
    """Sizes of a Transformer; the defaults are the paper's base model (shared vocabulary of about 37000 tokens)."""

    src_vocab_size: int = 37000
    tgt_vocab_size: int = 37000
    d_model: int = 512
    num_heads: int = 8
    num_layers: int = 6
    d_ff: int = 2048
    norm_first: bool = False

    def __post_init__(self) -> None:
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")

    @classmethod
    def from_model(cls, model: Any) -> Config:
        """The sizes of a companion ``Transformer`` (torch or keras), read from its layers."""
        layer = model.encoder.layers[0]
        w1, _ = dense_numpy(layer.ffn.linear1)
        return cls(src_vocab_size=model.src_vocab_size, tgt_vocab_size=model.tgt_vocab_size,
                   d_model=layer.self_attn.d_model, num_heads=layer.self_attn.num_heads,
                   num_layers=len(model.encoder.layers), d_ff=w1.shape[1], norm_first=bool(layer.addnorm1.norm_first))


def shape_label(shape: Shape, names: str | None) -> str:
    """``(batch 2, src_len 6, d_model 512)`` from a shape and its axis names (space separated), or ``(2, 6, 512)``."""
    shape = tuple(int(n) for n in shape)
    if names is None:
        return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
    axes = names.split()
    if len(axes) != len(shape):
        raise ValueError(f"names must give one name per axis of shape {shape}; got {names!r}")
    if any(a == "1" and n != 1 for a, n in zip(axes, shape, strict=True)):
        raise ValueError(f"an axis named 1 has another size in {shape}")
    return "(" + ", ".join("1" if a == "1" else f"{a} {n}" for a, n in zip(axes, shape, strict=True)) + ")"


def _zeros(*shape: int) -> np.ndarray:
    """A read-only float64 zero array of ``shape`` that takes no memory (all strides 0)."""
    return np.broadcast_to(np.zeros((), dtype=np.float64), shape)


def _attention_params(d_model: int) -> dict[str, np.ndarray]:
    params = {f"w{n}": _zeros(d_model, d_model) for n in "qkvo"}
    params.update({f"b{n}": _zeros(d_model) for n in "qkvo"})
    return params


def _norm(d_model: int) -> dict[str, np.ndarray]:
    return {"gamma": _zeros(d_model), "beta": _zeros(d_model)}


def _stack_params(config: Config, decoder: bool) -> dict[str, Any]:
    d, f = config.d_model, config.d_ff
    layer: dict[str, Any] = {"self_attn": _attention_params(d), "ffn": {"w1": _zeros(d, f), "b1": _zeros(f),
                                                                       "w2": _zeros(f, d), "b2": _zeros(d)}}
    names = ("addnorm1", "addnorm2", "addnorm3") if decoder else ("addnorm1", "addnorm2")
    layer.update({name: _norm(d) for name in names})
    if decoder:
        layer["cross_attn"] = _attention_params(d)
    stack: dict[str, Any] = {"layers": [layer] * config.num_layers}
    if config.norm_first:
        stack["norm"] = _norm(d)
    return stack


def model_shapes(config: Config, batch: int, src_len: int, tgt_len: int) -> dict[str, Shape]:
    """Shapes along the whole model for a batch of ``batch`` sentences, from a run of the oracle."""
    src_ids = np.ones((batch, src_len), dtype=np.int64)  # 1: any id that is not PAD
    tgt_ids = np.ones((batch, tgt_len), dtype=np.int64)
    src_mask = reference.padding_mask(src_ids)
    tgt_mask = reference.combine_masks(reference.padding_mask(tgt_ids), reference.causal_mask(tgt_len))
    src_embedded = ref_model.embed(src_ids, _zeros(config.src_vocab_size, config.d_model))
    tgt_embedded = ref_model.embed(tgt_ids, _zeros(config.tgt_vocab_size, config.d_model))
    h = config.num_heads
    memory = ref_model.encoder(src_embedded, _stack_params(config, False), h, src_mask, config.norm_first)
    decoded = ref_model.decoder(tgt_embedded, memory, _stack_params(config, True), h, tgt_mask, src_mask,
                                config.norm_first)
    logits = decoded @ _zeros(config.d_model, config.tgt_vocab_size)
    found = dict(src_ids=src_ids, tgt_ids=tgt_ids, src_mask=src_mask, tgt_mask=tgt_mask, src_embedded=src_embedded,
                 tgt_embedded=tgt_embedded, memory=memory, decoded=decoded, logits=logits)
    return {name: tuple(array.shape) for name, array in found.items()}


def attention_shapes(d_model: int, d_k: int, d_v: int, batch: int, query_len: int, key_len: int) -> dict[str, Shape]:
    """Shapes through one scaled dot-product attention with its three projections."""
    queries_in, keys_in = _zeros(batch, query_len, d_model), _zeros(batch, key_len, d_model)
    q, k, v = queries_in @ _zeros(d_model, d_k), keys_in @ _zeros(d_model, d_k), keys_in @ _zeros(d_model, d_v)
    out, weights = reference.scaled_dot_product_attention(q, k, v)
    found = dict(queries_in=queries_in, keys_in=keys_in, q=q, k=k, v=v, weights=weights, out=out)
    return {name: tuple(array.shape) for name, array in found.items()}


def head_shapes(d_model: int, num_heads: int, batch: int, seq_len: int) -> dict[str, Shape]:
    """Shapes through multi-head attention's split and merge (the oracle's own reshapes), checked against it.

    Each key names the array after one step: ``input`` ``(batch, seq_len, d_model)``, ``projected`` (after
    ``W^Q``), ``reshaped`` ``(batch, seq_len, num_heads, d_head)``, ``split`` (transposed to ``(batch, num_heads,
    seq_len, d_head)``), ``weights`` ``(batch, num_heads, seq_len, seq_len)``, ``attended`` (the heads' outputs,
    ``(batch, num_heads, seq_len, d_head)``), ``transposed`` (back to ``(batch, seq_len, num_heads, d_head)``),
    ``merged`` (the heads concatenated, ``(batch, seq_len, d_model)``) and ``out`` (after ``W^O``).
    """
    if d_model % num_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
    d_head = d_model // num_heads
    x = _zeros(batch, seq_len, d_model)
    projected = x @ _zeros(d_model, d_model)
    reshaped = projected.reshape(batch, seq_len, num_heads, d_head)
    split = reshaped.transpose(0, 2, 1, 3)
    attended, weights = reference.scaled_dot_product_attention(split, split, split)
    transposed = attended.transpose(0, 2, 1, 3)
    merged = transposed.reshape(batch, seq_len, d_model)  # the heads concatenated, as merge_heads returns them
    out = merged @ _zeros(d_model, d_model)  # W^O
    oracle_out, oracle_weights = reference.multi_head_attention(x, x, x, _attention_params(d_model), num_heads)
    if oracle_out.shape != out.shape or oracle_weights.shape != weights.shape:  # the diagram must follow the oracle
        raise AssertionError(f"diagram shapes {out.shape}, {weights.shape} differ from the oracle's "
                             f"{oracle_out.shape}, {oracle_weights.shape}")
    found = dict(input=x, projected=projected, reshaped=reshaped, split=split, weights=weights, attended=attended,
                 transposed=transposed, merged=merged, out=out)
    return {name: tuple(array.shape) for name, array in found.items()}


def mask_shapes(src_lengths: Sequence[int], tgt_lengths: Sequence[int]) -> dict[str, tuple[np.ndarray, Shape]]:
    """For each attention of the model: its mask for sentence 1, broadcast to ``(query_len, key_len)``, and the
    shape in which the oracle builds it for the batch."""
    if len(src_lengths) != len(tgt_lengths) or not len(src_lengths):
        raise ValueError("src_lengths and tgt_lengths must give one length per sentence, the same number of each")
    src_ids = np.array([[1] * n + [0] * (max(src_lengths) - n) for n in src_lengths])
    tgt_ids = np.array([[1] * n + [0] * (max(tgt_lengths) - n) for n in tgt_lengths])
    src_mask = reference.padding_mask(src_ids)
    tgt_mask = reference.combine_masks(reference.padding_mask(tgt_ids), reference.causal_mask(tgt_ids.shape[1]))
    src_len, tgt_len = src_ids.shape[1], tgt_ids.shape[1]
    return {
        "enc": (np.broadcast_to(src_mask[0, 0], (src_len, src_len)), src_mask.shape),
        "dec_self": (np.broadcast_to(tgt_mask[0, 0], (tgt_len, tgt_len)), tgt_mask.shape),
        "cross": (np.broadcast_to(src_mask[0, 0], (tgt_len, src_len)), src_mask.shape),
    }


def residual_shapes(d_model: int, batch: int, seq_len: int) -> dict[str, Shape]:
    """Output shapes of Add & Norm, post-LN and pre-LN, around an identity sublayer."""
    x = np.ones((batch, seq_len, d_model))
    gamma, beta = np.ones(d_model), np.zeros(d_model)
    post = reference.add_norm(x, lambda h: h, gamma, beta, norm_first=False)
    pre = reference.add_norm(x, lambda h: h, gamma, beta, norm_first=True)
    return {"input": x.shape, "post": post.shape, "pre": pre.shape}


def decode_greedily(model: Any, source: str | Sequence[str], src_vocab: Any, tgt_vocab: Any,
                    max_steps: int) -> list[dict[str, Any]]:
    """Greedy decoding of one sentence with the oracle on ``model``'s weights, one dict per step."""
    config = Config.from_model(model)
    params = ref_model.transformer_params(model)
    pad = int(getattr(model, "pad_id", 0))
    src_ids = np.array([src_vocab.encode(source, add_bos=True, add_eos=True)])
    src_mask = reference.padding_mask(src_ids, pad)
    memory = ref_model.encoder(ref_model.embed(src_ids, params["src_embed"]), params["encoder"], config.num_heads,
                               src_mask, config.norm_first)
    source_tokens = [src_vocab.id_to_token(i) for i in src_ids[0]]
    prefix, steps = [tgt_vocab.bos_id], []
    for _ in range(max_steps):
        tgt_ids = np.array([prefix])
        tgt_mask = reference.combine_masks(reference.padding_mask(tgt_ids, pad),
                                           reference.causal_mask(tgt_ids.shape[1]))
        y = ref_model.decoder(ref_model.embed(tgt_ids, params["tgt_embed"]), memory, params["decoder"],
                              config.num_heads, tgt_mask, src_mask, config.norm_first)
        logits = y @ params["generator"]["w"] + params["generator"]["b"]
        last = logits[:, -1]
        probabilities = reference.softmax(last)
        best = int(np.argmax(last[0]))
        steps.append({"source": source_tokens, "memory": memory.shape, "prefix": [tgt_vocab.id_to_token(i)
                      for i in prefix], "logits": logits.shape, "last": last.shape,
                      "token": tgt_vocab.id_to_token(best), "id": best, "p": float(probabilities[0, best])})
        prefix.append(best)
        if best == tgt_vocab.eos_id:
            break
    return steps
