"""Typical wrong answers to the exercises of chapters 2-4 (attention, multi-head attention, masking).

Each wrong answer below is a mistake students make; its check must fail with a message that names it. The generic
"solution passes, stub fails" tests for these chapters live in tests/test_exercises.py.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import torch
from keras import ops
from torch import nn

from companion import plots
from companion.checks import CheckFailed, exercises_for, run_check


def _numpy(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, dict):
        return {name: _numpy(value) for name, value in x.items()}
    if x is None or isinstance(x, int | float):
        return x
    return ops.convert_to_numpy(x)


def via_numpy(fn):
    """Run a NumPy implementation on torch or Keras inputs (the checks accept NumPy results)."""

    def wrapped(*args, **kwargs):
        return fn(*(_numpy(a) for a in args), **{k: _numpy(v) for k, v in kwargs.items()})

    return wrapped


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# ---------------------------------------------------------------------------------------------------------------
# Chapter 2
# ---------------------------------------------------------------------------------------------------------------


def _scalar(scores_of="q k", axis=-1, softmax=True, transpose_p=False, blend_x=False):
    def scalar_self_attention(x, w_q, w_k, w_v):
        q, k, v = x * w_q, x * w_k, x * w_v
        scores = {"q k": np.outer(q, k), "q q": np.outer(q, q), "x x": np.outer(x, x)}[scores_of]
        p = _softmax(scores, axis) if softmax else scores
        h = (p.T if transpose_p else p) @ (x if blend_x else v)
        return h, p

    return scalar_self_attention


def _attention(scale="d_k", axis=-1, values=True):
    def attention(q, k, v):
        scores = q @ np.swapaxes(k, -1, -2)
        divisor = {"d_k": math.sqrt(q.shape[-1]), "none": 1.0, "d_k plain": q.shape[-1], "d_v": math.sqrt(v.shape[-1])}
        weights = _softmax(scores / divisor[scale], axis)
        return weights @ (v if values else k), weights

    return via_numpy(attention)


def _self_attention_torch(swap=False, bias=False, shared=False, scale="d_out"):
    class SelfAttention(nn.Module):
        def __init__(self, d_in, d_out):
            super().__init__()
            self.wq = nn.Linear(d_out, d_in, bias=bias) if swap else nn.Linear(d_in, d_out, bias=bias)
            self.wk = self.wq if shared else nn.Linear(d_in, d_out, bias=bias)
            self.wv = self.wq if shared else nn.Linear(d_in, d_out, bias=bias)
            self.d_in = d_in

        def forward(self, x):
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
            divisor = {"d_out": math.sqrt(q.shape[-1]), "d_in": math.sqrt(self.d_in), "none": 1.0}[scale]
            weights = (q @ k.transpose(-2, -1) / divisor).softmax(-1)
            return weights @ v, weights

    return SelfAttention


def _self_attention_keras(width="d_out", bias=False, shared=False, scale="d_out"):
    class SelfAttention(keras.layers.Layer):
        def __init__(self, d_in, d_out):
            super().__init__()
            units = d_out if width == "d_out" else d_in
            self.wq = keras.layers.Dense(units, use_bias=bias)
            self.wk = self.wq if shared else keras.layers.Dense(units, use_bias=bias)
            self.wv = self.wq if shared else keras.layers.Dense(units, use_bias=bias)
            self.d_in = d_in

        def call(self, x):
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
            divisor = {"d_out": math.sqrt(q.shape[-1]), "d_in": math.sqrt(self.d_in), "none": 1.0}[scale]
            weights = ops.softmax(ops.matmul(q, ops.swapaxes(k, -1, -2)) / divisor, axis=-1)
            return ops.matmul(weights, v), weights

    return SelfAttention


def _torch_attention(q, k, v):
    weights = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1)
    return weights @ v, weights


def _scalar_cross(kind):
    def scalar_self_attention(x, w_q, w_k, w_v, y=None):
        source = x if y is None or kind == "ignore y" else y
        q, k, v = x * w_q, (x if kind == "keys from x" else source) * w_k, source * w_v
        if kind == "values from x":
            v = x * w_v
        p = _softmax(np.outer(q, k))
        return p @ v, p

    return scalar_self_attention


def _scaled(kind):
    def attention(q, k, v, scale=None):
        scores = q @ np.swapaxes(k, -1, -2)
        default = 1 / math.sqrt(q.shape[-1])
        factor = {"divide": 1 / scale, "both": scale * default, "ignored": default, "right": scale}[kind] if scale \
            else default
        weights = _softmax(scores * factor)
        return weights @ v, weights

    return via_numpy(attention)


def _additive(axis=-1, tanh=True, scale=False, values=True, as_list=False):
    def additive_attention(q, k, v, w1, w2, a):
        hidden = (q @ w1)[:, None, :] + (k @ w2)[None]
        scores = (np.tanh(hidden) if tanh else hidden) @ a / (math.sqrt(a.shape[0]) if scale else 1.0)
        weights = _softmax(scores, axis)
        out = weights @ (v if values else k[:, : v.shape[1]])
        return (out.tolist() if as_list else out), weights

    return additive_attention


# Named (not lambdas) so the synthetic class can write each mistake into a notebook as source.
def _numbers_w_transposed():
    return {"w_shape": (512, 256), "parameters": 393216, "weights_shape": (1, 10, 10), "output_shape": (1, 10, 512)}


def _numbers_with_bias():
    return {"w_shape": [256, 512], "parameters": 3 * (256 * 512 + 512), "weights_shape": (1, 10, 10),
            "output_shape": (1, 10, 512)}


def _numbers_weights_per_feature():
    return {"w_shape": (256, 512), "parameters": 393216, "weights_shape": (1, 10, 512), "output_shape": (1, 10, 512)}


def _numbers_as_list():
    return [(256, 512), 393216]


def _scale_sqrt_d_k(variance, d_k):
    return math.sqrt(d_k)


def _scale_sqrt_variance_d_k(variance, d_k):
    return math.sqrt(variance * d_k)


def _scale_no_root(variance, d_k):
    return variance**2 * d_k


def _scale_as_text(variance, d_k):
    return str(variance * math.sqrt(d_k))


def _attention_detached(q, k, v):
    return tuple(t.detach() for t in _torch_attention(q, k, v))


def _attention_in_numpy(q, k, v):
    return _attention()(q, k, v)


CHAPTER_2 = [
    ("scalar_self_attention", _scalar(axis=0), "wrong axis"),
    ("scalar_self_attention", _scalar("q q"), "query by a query"),
    ("scalar_self_attention", _scalar(softmax=False), "not turned into probabilities"),
    ("scalar_self_attention", _scalar("x x"), "the scores use x directly"),
    ("scalar_self_attention", _scalar(transpose_p=True), r"not P\.T @ v"),
    ("scalar_self_attention", _scalar(blend_x=True), "blends the inputs x"),
    *[
        (f"attention_{track}", _attention(**kwargs), message)
        for track in ("torch", "keras")
        for kwargs, message in [
            ({"scale": "none"}, "scale is missing"),
            ({"scale": "d_k plain"}, "divided by d_k"),
            ({"axis": -2}, "wrong axis"),
            ({"scale": "d_v"}, "uses d_v"),
            ({"values": False}, "blends the keys"),
        ]
    ],
    ("SelfAttention_torch", _self_attention_torch(swap=True), r"nn\.Linear takes \(in_features, out_features\)"),
    ("SelfAttention_torch", _self_attention_torch(bias=True), "bias=False"),
    ("SelfAttention_torch", _self_attention_torch(shared=True), "same torch.nn.Linear"),
    ("SelfAttention_torch", _self_attention_torch(scale="none"), "scale is missing"),
    ("SelfAttention_torch", _self_attention_torch(scale="d_in"), r"sqrt\(d_in\)"),
    ("SelfAttention_keras", _self_attention_keras(width="d_in"), "outputs 256 features: Dense\\(512\\)"),
    ("SelfAttention_keras", _self_attention_keras(bias=True), "use_bias=False"),
    ("SelfAttention_keras", _self_attention_keras(shared=True), "same keras.layers.Dense"),
    ("SelfAttention_keras", _self_attention_keras(scale="d_in"), r"sqrt\(d_in\)"),
    # graded questions, find-the-bug, stretch
    ("self_attention_numbers", _numbers_w_transposed, r"\(out, in\)"),
    ("self_attention_numbers", _numbers_with_bias, "no bias"),
    ("self_attention_numbers", _numbers_weights_per_feature, "one column per key"),
    ("self_attention_numbers", _numbers_as_list, "return a dict"),
    ("scale_for_variance", _scale_sqrt_d_k, "not sqrt\\(d_k\\) alone"),
    ("scale_for_variance", _scale_sqrt_variance_d_k, r"variance\*\*2"),
    ("scale_for_variance", _scale_no_root, "standard deviation"),
    ("scale_for_variance", _scale_as_text, "is a float; got str"),
    *[
        (f"fixed_attention_{track}", wrong, message)
        for track in ("torch", "keras")
        for wrong, message in [
            (_attention(axis=-2), "wrong axis"),       # the bug as handed out (dim=1 on 3-D inputs)
            (_attention(scale="none"), "scale is missing"),
            (_attention(scale="d_v"), "uses d_v"),
            (_attention(values=False), "blends the keys"),
        ]
    ],
    ("fixed_attention_torch", _attention_detached, "no gradient reaches"),
    ("fixed_attention_keras", _attention_in_numpy, "Keras tensor"),
    ("additive_attention", _additive(axis=0), "over the keys"),
    ("additive_attention", _additive(tanh=False), "through tanh"),
    ("additive_attention", _additive(scale=True), "no scaling"),
    ("additive_attention", _additive(values=False), "blends the values"),
    ("additive_attention", _additive(as_list=True), "NumPy array"),
    # the variants of exercises 1 and 2 (cross-attention with y; an optional scale)
    ("scalar_self_attention", _scalar_cross("ignore y"), "keys come from y"),
    ("scalar_self_attention", _scalar_cross("keys from x"), "keys come from y"),
    ("scalar_self_attention", _scalar_cross("values from x"), "values come from y"),
    *[
        (f"attention_{track}", _scaled(kind), message)
        for track in ("torch", "keras")
        for kind, message in [("divide", "MULTIPLIES"), ("both", "do not apply both"), ("ignored", "ignored")]
    ],
]


# ---------------------------------------------------------------------------------------------------------------
# Chapter 3
# ---------------------------------------------------------------------------------------------------------------


def _split(kind):
    def split_heads(x, num_heads):
        batch, seq_len, d_model = x.shape
        d_head = d_model // num_heads
        if kind == "no transpose":
            return x.reshape(batch, num_heads, seq_len, d_head)
        if kind == "fold":
            return x.reshape(batch * num_heads, seq_len, d_head)
        if kind == "cards":
            return x.reshape(batch, seq_len, d_head, num_heads).transpose(0, 3, 1, 2)
        return x.reshape(batch, seq_len, num_heads, d_head).transpose(0, 2, 3, 1)  # (batch, heads, d_head, seq)

    return via_numpy(split_heads)


def _merge(kind):
    def merge_heads(x):
        batch, num_heads, seq_len, d_head = x.shape
        if kind == "no transpose":
            return x.reshape(batch, seq_len, num_heads * d_head)
        if kind == "interleaved":
            return x.transpose(0, 2, 3, 1).reshape(batch, seq_len, num_heads * d_head)
        return x.transpose(0, 2, 1, 3)

    return via_numpy(merge_heads)


def _mha(transpose=True, scale="d_head", output_projection=True, axis=-1):
    """A multi-head attention written for this test, independently of the checker, with one mistake switched on."""

    def multi_head_attention(query, key, value, params, num_heads, mask=None):
        d_model = query.shape[-1]
        d_head = d_model // num_heads

        def split(x):
            if transpose:
                return x.reshape(x.shape[0], x.shape[1], num_heads, d_head).transpose(0, 2, 1, 3)
            return x.reshape(x.shape[0], num_heads, x.shape[1], d_head)

        q = split(query @ params["wq"] + params["bq"])
        k = split(key @ params["wk"] + params["bk"])
        v = split(value @ params["wv"] + params["bv"])
        scores = q @ k.transpose(0, 1, 3, 2) / {"d_head": math.sqrt(d_head), "d_model": math.sqrt(d_model),
                                                "none": 1.0}[scale]
        if mask is not None:
            scores = np.where(mask, scores, np.finfo(scores.dtype).min)
        weights = _softmax(scores, axis)
        heads = weights @ v
        if transpose:
            merged = heads.transpose(0, 2, 1, 3).reshape(query.shape[0], query.shape[1], d_model)
        else:
            merged = heads.reshape(query.shape[0], query.shape[1], d_model)
        return (merged @ params["wo"] + params["bo"] if output_projection else merged), weights

    return via_numpy(multi_head_attention)


def _summed(kind):
    def summed_heads(x, heads):
        outputs = []
        for head in heads:
            q, k, v = x @ head["wq"], x @ head["wk"], x @ head["wv"]
            d = q.shape[-1] / (len(heads) if kind == "scale" else 1)
            outputs.append(_softmax(q @ k.T / math.sqrt(d)) @ v)
        if kind == "concat":
            return np.concatenate(outputs, axis=-1)
        if kind == "mean":
            return np.mean(outputs, axis=0)
        return np.sum(outputs, axis=0)

    return summed_heads


def _counts(**changes):
    def head_parameter_counts():
        right = {"concatenated": 786_432, "with_output_projection": 1_048_576, "summed": 6_291_456,
                 "summed_output_width": 512}
        return {**right, **changes}

    return head_parameter_counts


def _gqa(kind):
    def grouped_query_attention(q, k, v):
        per = q.shape[1] // k.shape[1]
        if kind == "tile":
            k, v = np.tile(k, (1, per, 1, 1)), np.tile(v, (1, per, 1, 1))
        else:
            k, v = np.repeat(k, per, axis=1), np.repeat(v, per, axis=1)
        weights = _softmax(q @ np.swapaxes(k, -1, -2) / (1.0 if kind == "unscaled" else math.sqrt(q.shape[-1])))
        out = weights @ v
        return (out.tolist() if kind == "list" else out), weights

    return grouped_query_attention


def _counts_as_list():
    return [786_432, 1_048_576]


CHAPTER_3 = [
    *[
        (f"split_heads_{track}", _split(kind), message)
        for track in ("torch", "keras")
        for kind, message in [
            ("no transpose", "without a transpose"),
            ("fold", "folded into the batch axis"),
            ("cards", "like cards"),
            ("swapped", "last two axes are swapped"),
        ]
    ],
    *[
        (f"merge_heads_{track}", _merge(kind), message)
        for track in ("torch", "keras")
        for kind, message in [
            ("no transpose", "without transposing back"),
            ("interleaved", "interleaved"),
            ("no reshape", "finish with a reshape"),
        ]
    ],
    *[
        (f"multi_head_attention_{track}", _mha(**kwargs), message)
        for track in ("torch", "keras")
        for kwargs, message in [
            ({"transpose": False}, "without a transpose"),
            ({"scale": "d_model"}, r"sqrt\(d_model\)"),
            ({"scale": "none"}, "scale is missing"),
            ({"axis": -2}, "wrong axis"),
            ({"output_projection": False}, "output projection is missing"),
        ]
    ],
    ("summed_heads", _summed("concat"), "you concatenated them"),
    ("summed_heads", _summed("mean"), "you averaged them"),
    ("summed_heads", _summed("scale"), r"divided by sqrt\(d_out\)"),
    # find-the-bug, a graded question, a stretch
    *[
        (f"fixed_multi_head_attention_{track}", _mha(**kwargs), message)
        for track in ("torch", "keras")
        for kwargs, message in [
            ({"transpose": False}, "without a transpose"),   # the bug as handed out
            ({"scale": "d_model"}, r"sqrt\(d_model\)"),
            ({"output_projection": False}, "output projection is missing"),
            ({"axis": -2}, "wrong axis"),
        ]
    ],
    ("head_parameter_counts", _counts(concatenated=8 * 3 * 512 * 512), "heads of width 64"),
    ("head_parameter_counts", _counts(with_output_projection=1_048_576 + 4 * 512), "no bias"),
    ("head_parameter_counts", _counts(summed=3 * 512 * 512), "8 heads of width 512, each with Q, K and V"),
    ("head_parameter_counts", _counts(summed_output_width=4096), "keeps the width of one head"),
    ("head_parameter_counts", _counts_as_list, "return a dict"),
    ("grouped_query_attention", _gqa("tile"), r"np\.repeat"),
    ("grouped_query_attention", _gqa("unscaled"), r"sqrt\(d_head\)"),
    ("grouped_query_attention", _gqa("list"), "NumPy arrays"),
]


# ---------------------------------------------------------------------------------------------------------------
# Chapter 4
# ---------------------------------------------------------------------------------------------------------------


def _padding(kind):
    def padding_mask(ids, pad_id=0):
        if kind == "inverted":
            return (ids == pad_id)[:, None, None, :]
        if kind == "2d":
            return ids != pad_id
        if kind == "rows":
            return (ids != pad_id)[:, None, :, None]
        if kind == "zero":
            return (ids != 0)[:, None, None, :]
        return (ids != pad_id)[:, None, None, :].astype(np.int64)

    return via_numpy(padding_mask)


def _causal(kind):
    def causal_mask(length):
        square = np.ones((length, length), dtype=bool)
        if kind == "inverted":
            return np.triu(square, 1)[None, None]
        if kind == "strict":
            return np.tril(square, -1)[None, None]
        if kind == "transposed":
            return np.triu(square)[None, None]
        if kind == "2d":
            return np.tril(square)
        return np.tril(square)[None, None].astype(np.float32)

    return causal_mask


def _masked_torch(fill="lowest", where="before", scale=True, upcast=False):
    def masked_attention(q, k, v, mask):
        if upcast:  # computes in float32 whatever the inputs
            q, k, v = q.float(), k.float(), v.float()
        scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
        if where == "after":
            weights = scores.softmax(-1) * mask
            return weights @ v, weights
        blocked = mask if where == "inverted" else ~mask
        value = {"lowest": torch.finfo(scores.dtype).min, "-inf": float("-inf"), "-1e9": -1e9, "-1e4": -1e4,
                 "zero": 0.0}[fill]
        weights = scores.masked_fill(blocked, value).softmax(-1)
        return weights @ v, weights

    return masked_attention


def _masked_keras(fill="lowest", upcast=False):
    def masked_attention(q, k, v, mask):
        if upcast:  # computes in float32 whatever the inputs
            q, k, v = (ops.cast(t, "float32") for t in (q, k, v))
        scores = ops.matmul(q, ops.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])
        lowest = float(np.finfo(keras.backend.standardize_dtype(scores.dtype)).min)
        value = {"lowest": lowest, "-inf": float("-inf"), "-1e9": -1e9, "-1e4": -1e4}[fill]
        weights = ops.softmax(ops.where(mask, scores, ops.cast(value, scores.dtype)), axis=-1)
        return ops.matmul(weights, v), weights

    return masked_attention


def _masked_numpy(kind):
    def masked_attention(q, k, v, mask):
        dtype = q.dtype
        q, k, v = (a.astype(np.float64) for a in (q, k, v))
        scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
        if kind == "after":
            weights = _softmax(scores) * mask
        elif kind == "right":  # the right values, as NumPy arrays of the inputs' dtype
            weights = _softmax(np.where(mask, scores, np.finfo(np.float64).min))
            return (weights @ v).astype(dtype), weights.astype(dtype)
        else:
            weights = _softmax(np.where(mask, np.finfo(np.float64).min, scores))
        return weights @ v, weights

    return via_numpy(masked_attention)


def _three_masks(kind):
    def transformer_masks(src_lengths, tgt_lengths, src_len, tgt_len, padding_side="right"):
        side = ("left" if padding_side == "right" else "right") if kind == "side ignored" else padding_side
        side = "right" if kind == "right only" else side  # ignores padding_side
        extra = 1 if kind == "off by one" else 0

        def real(lengths, n):
            positions = np.arange(n)[None, :]
            counted = lengths[:, None] + extra
            return positions >= n - counted if side == "left" else positions < counted

        src, tgt = real(src_lengths, src_len)[:, None, None, :], real(tgt_lengths, tgt_len)[:, None, None, :]
        causal = np.tril(np.ones((tgt_len, tgt_len), dtype=bool))[None, None]
        encoder, decoder, cross = src, tgt & causal, src
        if kind == "cross from target":
            cross = tgt
        elif kind == "no causal":
            decoder = tgt
        elif kind == "no target padding":
            decoder = np.broadcast_to(causal, (len(tgt_lengths), 1, tgt_len, tgt_len))
        elif kind == "or":
            decoder = tgt | causal
        elif kind == "causal encoder":
            encoder = src & np.tril(np.ones((src_len, src_len), dtype=bool))[None, None]
        elif kind == "as list":
            return [encoder, decoder, cross]
        return encoder, decoder, cross

    return transformer_masks


def _padding_first_id(ids, pad_id=0):
    first = pad_id[0] if isinstance(pad_id, tuple) else pad_id
    return (_numpy(ids) != first)[:, None, None, :]


def _cached_causal(kind):
    def causal_mask(query_len, key_len=None):
        key_len = query_len if key_len is None else key_len
        offset = 0 if kind == "top left" else key_len - query_len
        mask = np.tril(np.ones((query_len, key_len), dtype=bool), offset)
        if kind == "inverted" and key_len != query_len:
            mask = ~mask
        return mask if kind == "2d" and key_len != query_len else mask[None, None]

    return causal_mask


def _answers(**changes):
    def masking_answers():
        right = {"cross_mask_from": "source", "lowest_float16": -65504.0, "minus_1e9_in_float16": float("-inf"),
                 "weight_on_zero_filled_key": 0.25}
        return {**right, **changes}

    return masking_answers


def _torch_style(kind):
    def torch_style_masks(src_ids, tgt_ids, pad_id=0):
        n = tgt_ids.shape[1]
        masks = {"src_key_padding_mask": src_ids == pad_id, "tgt_key_padding_mask": tgt_ids == pad_id,
                 "memory_key_padding_mask": (tgt_ids if kind == "memory from target" else src_ids) == pad_id,
                 "tgt_mask": np.triu(np.ones((n, n), dtype=bool), 0 if kind == "diagonal" else 1)}
        if kind == "course":
            masks = {key: ~value for key, value in masks.items()}
        elif kind == "4d":
            masks["src_key_padding_mask"] = masks["src_key_padding_mask"][:, None, None, :]
        elif kind == "int":
            masks["tgt_mask"] = masks["tgt_mask"].astype(np.int64)
        return masks

    return torch_style_masks


def _packed(kind):
    def packed_causal_mask(segment_ids):
        n = segment_ids.shape[1]
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        real = (segment_ids != 0)[:, None, :]
        causal = np.tril(np.ones((n, n), dtype=bool))[None]
        mask = {"no segments": real & causal, "no causal": same & real, "pad keys": same & causal}.get(
            kind, same & real & causal)
        if kind == "3d":
            return mask
        return mask[:, None].astype(np.float32) if kind == "float" else mask[:, None]

    return packed_causal_mask


def _masked_detached(q, k, v, m):
    return tuple(t.detach() for t in _masked_torch()(q, k, v, m))


def _masking_answers_as_tuple():
    return ("source", -65504.0)


CHAPTER_4 = [
    *[
        (f"padding_mask_{track}", _padding(kind), message)
        for track in ("torch", "keras")
        for kind, message in [
            ("inverted", "inverted"),
            ("2d", "singleton axes"),
            ("rows", "key columns"),
            ("zero", "you compared with 0"),
            ("int", "a boolean mask, True = may attend"),
        ]
    ],
    *[
        (f"causal_mask_{track}", _causal(kind), message)
        for track in ("torch", "keras")
        for kind, message in [
            ("inverted", "inverted"),
            ("strict", "off by one"),
            ("transposed", "transposed"),
            ("2d", "add the two singleton axes"),
            ("float", "a boolean mask, True = may attend"),
        ]
    ],
    ("masked_attention_torch", _masked_torch(fill="-inf"), "NaN"),
    ("masked_attention_torch", _masked_torch(fill="-1e9"), "most negative finite value"),
    ("masked_attention_torch", _masked_torch(where="inverted"), "inverted"),
    ("masked_attention_torch", _masked_torch(where="after"), "after the softmax"),
    ("masked_attention_torch", _masked_torch(fill="zero"), r"exp\(0\)"),
    ("masked_attention_torch", _masked_torch(scale=False), "scale is missing"),
    ("masked_attention_keras", _masked_keras(fill="-inf"), "NaN"),
    ("masked_attention_keras", _masked_keras(fill="-1e9"), "most negative finite value"),
    ("masked_attention_keras", _masked_numpy("inverted"), "inverted"),
    ("masked_attention_keras", _masked_numpy("after"), "after the softmax"),
    ("transformer_masks", _three_masks("cross from target"), "not the target's"),
    ("transformer_masks", _three_masks("no causal"), "comes after it"),
    ("transformer_masks", _three_masks("no target padding"), "only to REAL tokens"),
    ("transformer_masks", _three_masks("or"), "with OR"),
    ("transformer_masks", _three_masks("causal encoder"), "no causal"),
    ("transformer_masks", _three_masks("side ignored"), "the padding comes (first|last)"),
    ("transformer_masks", _three_masks("off by one"), "exactly n True positions"),
    ("transformer_masks", _three_masks("right only"), "LAST length positions"),
    # the variants of exercises 1 and 2, find-the-bug, graded answers, torch's convention, a stretch
    *[(f"padding_mask_{track}", _padding_first_id, "every id in it is blocked") for track in ("torch", "keras")],
    *[
        (f"causal_mask_{track}", _cached_causal(kind), message)
        for track in ("torch", "keras")
        for kind, message in [("top left", "LAST query_len positions"), ("2d", r"\(1, 1, query_len, key_len\)"),
                              ("inverted", "inverted")]
    ],
    ("fixed_masked_attention_torch", _masked_torch(fill="-1e9"), "most negative finite value"),   # the bug
    ("fixed_masked_attention_torch", _masked_torch(fill="-inf"), "NaN"),
    ("fixed_masked_attention_torch", _masked_torch(where="after"), "after the softmax"),
    ("fixed_masked_attention_torch", _masked_torch(scale=False), "scale is missing"),
    ("fixed_masked_attention_torch", _masked_detached, "no gradient reaches"),
    ("fixed_masked_attention_keras", _masked_numpy("after"), "after the softmax"),                 # the bug
    ("fixed_masked_attention_keras", _masked_keras(fill="-inf"), "NaN"),
    ("fixed_masked_attention_keras", _masked_keras(fill="-1e9"), "most negative finite value"),
    ("fixed_masked_attention_keras", _masked_numpy("inverted"), "inverted"),
    ("masking_answers", _answers(cross_mask_from="target"), "comes from the source"),
    ("masking_answers", _answers(lowest_float16=float(np.finfo(np.float32).min)), "float32's lowest"),
    ("masking_answers", _answers(minus_1e9_in_float16=-65504.0), "rounds to -inf"),
    ("masking_answers", _answers(weight_on_zero_filled_key=0.0), r"exp\(0\) = 1"),
    ("masking_answers", _answers(weight_on_zero_filled_key="0.25"), "is a number"),
    ("masking_answers", _masking_answers_as_tuple, "return a dict"),
    ("torch_style_masks", _torch_style("course"), "BLOCKED positions with True"),
    ("torch_style_masks", _torch_style("memory from target"), "not the target's"),
    ("torch_style_masks", _torch_style("diagonal"), "diagonal"),
    ("torch_style_masks", _torch_style("4d"), "without singleton axes"),
    ("torch_style_masks", _torch_style("int"), "boolean masks"),
    ("packed_causal_mask", _packed("no segments"), "ITS OWN segment"),
    ("packed_causal_mask", _packed("no causal"), "no token sees a later one"),
    ("packed_causal_mask", _packed("pad keys"), "padding"),
    ("packed_causal_mask", _packed("3d"), r"\(batch, 1, length, length\)"),
    ("packed_causal_mask", _packed("float"), "a boolean mask, True = may attend"),
]


# ---------------------------------------------------------------------------------------------------------------
# Mistakes that once passed: an input the text names was missing from the cases, or a type it states was not compared
# ---------------------------------------------------------------------------------------------------------------


class _SelfAttentionOfParameters(nn.Module):
    """Projections held as bare parameter matrices, not the torch.nn.Linear layers the text names."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Parameter(torch.randn(d_in, d_out)) for _ in range(3))

    def forward(self, x):
        q, k, v = x @ self.wq, x @ self.wk, x @ self.wv
        weights = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1)
        return weights @ v, weights


class _SelfAttentionOfWeights(keras.layers.Layer):
    """Projections held as bare weights, not the keras.layers.Dense layers the text names."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.wq, self.wk, self.wv = (self.add_weight(shape=(d_in, d_out)) for _ in range(3))

    def call(self, x):
        q, k, v = ops.matmul(x, self.wq), ops.matmul(x, self.wk), ops.matmul(x, self.wv)
        weights = ops.softmax(ops.matmul(q, ops.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1]), axis=-1)
        return ops.matmul(weights, v), weights


def _numbers_shapes_as_lists():
    return {"w_shape": [256, 512], "parameters": 393216, "weights_shape": [1, 10, 10], "output_shape": [1, 10, 512]}


def _numbers_parameters_as_float():
    return {"w_shape": (256, 512), "parameters": 393216.0, "weights_shape": (1, 10, 10), "output_shape": (1, 10, 512)}


def _scale_as_int(variance, d_k):
    return int(variance * math.sqrt(d_k))


def _mha_torch(fill):
    """Multi-head attention in torch whose blocked scores get a fixed fill instead of the dtype's lowest value."""

    def multi_head_attention(query, key, value, params, num_heads, mask=None):
        batch, d_model = query.shape[0], query.shape[-1]

        def split(x):
            return x.reshape(batch, x.shape[1], num_heads, d_model // num_heads).transpose(1, 2)

        q, k, v = (split(x @ params[f"w{n}"] + params[f"b{n}"]) for x, n in ((query, "q"), (key, "k"), (value, "v")))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_model // num_heads)
        if mask is not None:
            lowest = {"-inf": float("-inf"), "-1e9": -1e9, "-1e4": -1e4,
                      "float32": float(torch.finfo(torch.float32).min)}[fill]
            scores = scores.masked_fill(~mask, lowest)
        weights = scores.softmax(-1)
        merged = (weights @ v).transpose(1, 2).reshape(batch, query.shape[1], d_model)
        return merged @ params["wo"] + params["bo"], weights

    return multi_head_attention


def _mha_keras(fill):
    """Multi-head attention in Keras whose blocked scores get a fixed fill instead of the dtype's lowest value."""

    def multi_head_attention(query, key, value, params, num_heads, mask=None):
        batch, d_model = query.shape[0], query.shape[-1]

        def split(x):
            return ops.transpose(ops.reshape(x, (batch, x.shape[1], num_heads, d_model // num_heads)), (0, 2, 1, 3))

        q = split(ops.matmul(query, params["wq"]) + params["bq"])
        k = split(ops.matmul(key, params["wk"]) + params["bk"])
        v = split(ops.matmul(value, params["wv"]) + params["bv"])
        scores = ops.matmul(q, ops.swapaxes(k, -1, -2)) / math.sqrt(d_model // num_heads)
        if mask is not None:
            scores = ops.where(mask, scores, ops.cast(float(fill), scores.dtype))
        weights = ops.softmax(scores, axis=-1)
        merged = ops.reshape(ops.transpose(ops.matmul(weights, v), (0, 2, 1, 3)), (batch, query.shape[1], d_model))
        return ops.matmul(merged, params["wo"]) + params["bo"], weights

    return multi_head_attention


def _counts_as_floats():
    return {"concatenated": 786_432.0, "with_output_projection": 1_048_576.0, "summed": 6_291_456.0,
            "summed_output_width": 512.0}


NAMED_INPUTS = [
    *[(f"{prefix}multi_head_attention_keras", _mha_keras("-inf"), "NaN or infinity. Likely: the text says: "
       "blocked scores get the dtype's most negative value") for prefix in ("", "fixed_")],
    *[(f"{prefix}multi_head_attention_{track}", factory("-1e4"), "a fixed fill such as -1e4 lies above real scores")
      for prefix in ("", "fixed_") for track, factory in (("torch", _mha_torch), ("keras", _mha_keras))],
    *[(f"{prefix}multi_head_attention_torch", _mha_torch(fill), "float16.*(overflow|NaN).*Likely: the text says: "
       "blocked scores get the dtype's most negative value") for prefix in ("", "fixed_") for fill in ("-1e9",
                                                                                                  "float32")],
    *[(f"{prefix}multi_head_attention_torch", _mha_torch("-inf"), "NaN or infinity. Likely")
      for prefix in ("", "fixed_")],
    *[(f"{prefix}masked_attention_{track}", factory(fill="-1e4"), "a fixed fill such as -1e4 lies above real scores")
      for prefix in ("", "fixed_") for track, factory in (("torch", _masked_torch), ("keras", _masked_keras))],
]
STATED_TYPES = [
    ("attention_torch", _scaled("right"), "should be a torch.Tensor; got ndarray"),
    ("attention_keras", _scaled("right"), "should be a Keras tensor"),
    ("multi_head_attention_torch", _mha(), "should be a torch.Tensor; got ndarray"),
    ("multi_head_attention_keras", _mha(), "should be a Keras tensor"),
    ("fixed_multi_head_attention_torch", _mha(), "should be a torch.Tensor; got ndarray"),
    ("fixed_multi_head_attention_keras", _mha(), "should be a Keras tensor"),
    ("fixed_attention_torch", _scaled("right"), "should be a torch.Tensor; got ndarray"),
    ("masked_attention_torch", _masked_numpy("right"), "should be a torch.Tensor; got ndarray"),
    ("masked_attention_keras", _masked_numpy("right"), "should be a Keras tensor"),
    ("masked_attention_torch", _masked_torch(upcast=True), "float16 inputs give a float16 output"),
    ("transformer_masks", _three_masks("as list"), "is a tuple; got list"),
    ("fixed_masked_attention_torch", _masked_torch(upcast=True), "float16 inputs give a float16 output"),
    ("fixed_masked_attention_keras", _masked_keras(upcast=True), "float16 inputs give a float16 output"),
    ("SelfAttention_torch", _SelfAttentionOfParameters, "each a torch.nn.Linear; wq is missing or is not one"),
    ("SelfAttention_keras", _SelfAttentionOfWeights, "each a keras.layers.Dense; wq is missing or is not one"),
    ("self_attention_numbers", _numbers_shapes_as_lists, "w_shape is a tuple; got list"),
    ("self_attention_numbers", _numbers_parameters_as_float, "parameters is an int; got float"),
    ("scale_for_variance", _scale_as_int, r"\(a Python float\) is a float; got int"),
    ("head_parameter_counts", _counts_as_floats, "is an int; got float"),
    ("masking_answers", _answers(lowest_float16=-65504), r"lowest_float16 \(a Python float\) is a float; got int"),
]
TAGGED_TYPES = [case for case in CHAPTER_2 + CHAPTER_3 + CHAPTER_4 if (case[0], case[2]) in {
    ("fixed_attention_keras", "Keras tensor"), ("additive_attention", "NumPy array"),
    ("grouped_query_attention", "NumPy arrays"), ("padding_mask_torch", "a boolean mask, True = may attend"),
    ("padding_mask_keras", "a boolean mask, True = may attend"),
    ("causal_mask_torch", "a boolean mask, True = may attend"),
    ("causal_mask_keras", "a boolean mask, True = may attend"), ("torch_style_masks", "boolean masks"),
    ("packed_causal_mask", "a boolean mask, True = may attend"), ("masking_answers", "return a dict"),
    ("self_attention_numbers", "return a dict")}]
MISTAKE_CLASSES = {"an input the text names": NAMED_INPUTS, "a type the text states": STATED_TYPES + TAGGED_TYPES}


@pytest.mark.parametrize(
    "exercise_id, wrong, message",
    CHAPTER_2 + CHAPTER_3 + CHAPTER_4 + NAMED_INPUTS + STATED_TYPES,
    ids=lambda value: value if isinstance(value, str) and " " not in value else "",
)
def test_typical_mistakes_are_named(exercise_id, wrong, message):
    with pytest.raises(CheckFailed, match=message):
        run_check(exercise_id, wrong)


@pytest.mark.parametrize("chapter", ["02_attention", "03_multihead_attention", "04_masking"])
def test_every_exercise_has_at_least_three_named_mistakes(chapter):
    cases = CHAPTER_2 + CHAPTER_3 + CHAPTER_4
    exercises = exercises_for(chapter)
    assert len(exercises) >= 3
    for item in exercises:
        assert sum(case[0] == item.id for case in cases) >= 3, f"{item.id} has fewer than 3 typical mistakes"


def test_a_right_answer_in_the_other_layout_is_still_refused():
    """A mask that is right but for the wrong convention (True = blocked) must not pass."""

    def blocked_convention(length):
        return ~torch.ones(length, length, dtype=torch.bool).tril()[None, None]

    with pytest.raises(CheckFailed, match="inverted"):
        run_check("causal_mask_torch", blocked_convention)


# ---------------------------------------------------------------------------------------------------------------
# The plot helpers the chapters added to companion.plots
# ---------------------------------------------------------------------------------------------------------------


def test_attention_grid_draws_one_panel_per_head_and_checks_its_input():
    import matplotlib

    matplotlib.use("Agg")
    weights = np.full((3, 2, 4), 0.25)
    figure = plots.attention_grid(weights, ["a", "b"], ["w", "x", "y", "z"], ncols=2)
    panels = [ax for ax in figure.axes if ax.images]
    assert len(panels) == 3 and panels[0].get_ylabel() == "query (attending)"
    with pytest.raises(ValueError, match="num_heads, query_len, key_len"):
        plots.attention_grid(weights[0], ["a", "b"], ["w", "x", "y", "z"])
    with pytest.raises(ValueError, match=r"\(h, 2, 3\)"):
        plots.attention_grid(weights, ["a", "b"], ["w", "x", "y"])


def test_mask_heatmap_draws_allowed_cells_dark_and_checks_its_input():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mask = np.tril(np.ones((3, 3), dtype=bool))
    ax = plots.mask_heatmap(mask, query_tokens=["a", "b", "c"], key_tokens=["a", "b", "c"])
    assert np.array_equal(ax.images[0].get_array(), mask.astype(float))
    assert ax.get_xlabel() == "key (attended to)"
    plt.close("all")
    with pytest.raises(ValueError, match="2-D"):
        plots.mask_heatmap(mask[None])
