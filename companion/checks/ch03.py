"""Checks for chapter 3, "Multi-head attention"."""

from __future__ import annotations

import numpy as np

from companion import reference
from companion.checks import CheckFailed, call, exercise, expect_close, rng, to_numpy
from companion.checks.tracks import (
    ATTENTION_SHORTCUTS,
    converter,
    expect_answer_dict,
    expect_answer_type,
    expect_differentiable,
    expect_type,
    output_pair,
    tolerance,
)

CHAPTER = "03_multihead_attention"

NO_TRANSPOSE = (
    "the text says: head i holds features i * d_head to (i + 1) * d_head - 1 of EVERY position; heads split without "
    "a transpose: reshape to (batch, seq_len, num_heads, d_head) first, then swap the seq_len "
    "and num_heads axes; a reshape straight to (batch, num_heads, seq_len, d_head) mixes positions across heads"
)


# ---------------------------------------------------------------------------------------------------------------
# Exercise 1 and 2: split and merge
# ---------------------------------------------------------------------------------------------------------------

SPLIT_SHAPES = [(2, 5, 12, 3), (1, 7, 8, 2), (3, 4, 16, 4)]  # (batch, seq_len, d_model, num_heads)


def split_reference(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(batch, seq_len, d_model) -> (batch, num_heads, seq_len, d_head): reshape, then transpose."""
    batch, seq_len, d_model = x.shape
    return x.reshape(batch, seq_len, num_heads, d_model // num_heads).transpose(0, 2, 1, 3)


def merge_reference(x: np.ndarray) -> np.ndarray:
    """(batch, num_heads, seq_len, d_head) -> (batch, seq_len, num_heads * d_head)."""
    batch, num_heads, seq_len, d_head = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch, seq_len, num_heads * d_head)


def _check_split(split_heads, track: str, name: str) -> None:
    generator = rng(30)
    for batch, seq_len, d_model, num_heads in SPLIT_SHAPES:
        d_head = d_model // num_heads
        x = generator.standard_normal((batch, seq_len, d_model)).astype(np.float32)
        answer = call(split_heads, *converter(track)(x), num_heads)
        expect_close(
            answer,
            split_reference(x, num_heads),
            f"{name}(x of shape {x.shape}, num_heads={num_heads})",
            mistakes={
                NO_TRANSPOSE: x.reshape(batch, num_heads, seq_len, d_head),
                "the text says: return (batch, num_heads, seq_len, d_head); the heads were folded into the batch "
                "axis, (batch * num_heads, seq_len, d_head), by a reshape alone; keep a separate head "
                "axis and transpose": x.reshape(
                    batch * num_heads, seq_len, d_head
                ),
                "the text says: head i holds features i * d_head to (i + 1) * d_head - 1; yours dealt the features "
                "out like cards (feature f to head f % num_heads): reshape to (batch, seq_len, num_heads, d_head)":
                    x.reshape(batch, seq_len, d_head, num_heads).transpose(0, 3, 1, 2),
                "the text says: return (batch, num_heads, seq_len, d_head); the last two axes are swapped":
                    split_reference(x, num_heads).swapaxes(-1, -2),
            },
        )
        expect_type(answer, track, f"the result of {name}", "float")


def _check_merge(merge_heads, track: str, name: str) -> None:
    generator = rng(31)
    for batch, seq_len, d_model, num_heads in SPLIT_SHAPES:
        d_head = d_model // num_heads
        x = generator.standard_normal((batch, num_heads, seq_len, d_head)).astype(np.float32)
        answer = call(merge_heads, *converter(track)(x))
        expect_close(
            answer,
            merge_reference(x),
            f"{name}(x of shape {x.shape})",
            mistakes={
                "the text says: merge_heads(split_heads(x, h)) gives back x; heads merged without transposing "
                "back: move the head axis behind seq_len, (batch, seq_len, num_heads, d_head), then reshape":
                    x.reshape(batch, seq_len, d_model),
                "the text says: merge_heads(split_heads(x, h)) gives back x; the heads' features were interleaved "
                "(feature j of every head side by side); transpose to (batch, seq_len, num_heads, d_head) so each "
                "head's features stay together": x.transpose(0, 2, 3, 1).reshape(
                    batch, seq_len, d_model
                ),
                "the text says: return (batch, seq_len, num_heads * d_head); the merge stops at (batch, seq_len, "
                "num_heads, d_head): finish with a reshape": x.transpose(0, 2, 1, 3),
            },
        )
        expect_type(answer, track, f"the result of {name}", "float")


@exercise(CHAPTER, "split_heads_torch", "(batch, seq, d_model) -> (batch, heads, seq, d_head), in PyTorch", "torch")
def check_split_heads_torch(split_heads_torch) -> None:
    _check_split(split_heads_torch, "torch", "split_heads_torch")


@exercise(CHAPTER, "split_heads_keras", "(batch, seq, d_model) -> (batch, heads, seq, d_head), in Keras", "keras")
def check_split_heads_keras(split_heads_keras) -> None:
    _check_split(split_heads_keras, "keras", "split_heads_keras")


@exercise(CHAPTER, "merge_heads_torch", "(batch, heads, seq, d_head) -> (batch, seq, d_model), in PyTorch", "torch")
def check_merge_heads_torch(merge_heads_torch) -> None:
    _check_merge(merge_heads_torch, "torch", "merge_heads_torch")


@exercise(CHAPTER, "merge_heads_keras", "(batch, heads, seq, d_head) -> (batch, seq, d_model), in Keras", "keras")
def check_merge_heads_keras(merge_heads_keras) -> None:
    _check_merge(merge_heads_keras, "keras", "merge_heads_keras")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 3: multi-head attention as a function
# ---------------------------------------------------------------------------------------------------------------


def mha_variant(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    params: dict[str, np.ndarray],
    num_heads: int,
    mask: np.ndarray | None = None,
    scale: str = "head",
    transpose: bool = True,
    output_projection: bool = True,
    axis: int = -1,
    fill: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention with switches for the typical mistakes; the defaults give the right answer."""
    batch, query_len, d_model = query.shape
    d_head = d_model // num_heads

    def split(x: np.ndarray) -> np.ndarray:
        if transpose:
            return split_reference(x, num_heads)
        return x.reshape(x.shape[0], num_heads, x.shape[1], d_head)

    q = split(query @ params["wq"] + params["bq"])
    k = split(key @ params["wk"] + params["bk"])
    v = split(value @ params["wv"] + params["bv"])
    scores = q @ np.swapaxes(k, -1, -2)
    scores = scores / {"head": np.sqrt(d_head), "model": np.sqrt(d_model), "none": 1.0}[scale]
    if mask is not None:
        scores = np.where(mask, scores, np.finfo(scores.dtype).min if fill is None else fill)
    weights = reference.softmax(scores, axis=axis)
    heads = weights @ v
    merged = merge_reference(heads) if transpose else heads.reshape(batch, query_len, d_model)
    out = merged @ params["wo"] + params["bo"] if output_projection else merged
    return out, weights


MHA_CASES = [  # (batch, query_len, key_len, d_model, num_heads, mask kind)
    (2, 5, 5, 16, 4, None),
    (2, 3, 6, 12, 3, "padding"),
    (1, 4, 4, 8, 2, "causal"),
    (2, 4, 5, 8, 2, "empty row"),  # a query whose keys are all blocked
    (1, 2, 4, 8, 2, "very low scores"),  # real scores near -32768 beside a blocked key
]
FIXED_FILL = ("the text says: blocked scores get the dtype's most negative value; a fixed fill such as -1e4 lies "
              "above real scores as low as these (about -32768), so the blocked key took the weight")
#: The torch track also runs in float16, where -1e9 and float32's lowest value do not fit.
HALF_CASE = (2, 3, 4, 8, 2, "padding")
MASK_FILL_HINT = ("the text says: blocked scores get the dtype's most negative value (torch.finfo(scores.dtype).min, "
                  "or numpy's finfo of the Keras dtype): a query whose keys are all blocked then gets uniform weights "
                  "and a finite output; -inf gives NaN there, and -1e9 or float32's lowest value do not fit in "
                  "float16")


def mha_case(generator: np.random.Generator, batch, query_len, key_len, d_model, num_heads, mask_kind):
    """Seeded inputs of one case: query, key, value, params (x @ w + b convention) and a mask or None."""
    query = generator.standard_normal((batch, query_len, d_model)).astype(np.float32)
    if query_len == key_len:  # self-attention
        key = query
    else:  # cross-attention: keys and values from another sequence
        key = generator.standard_normal((batch, key_len, d_model)).astype(np.float32)
    # The values differ from the keys (as they do after a layer), so an answer that mixes them up shows.
    value = (key + generator.standard_normal(key.shape).astype(np.float32)).astype(np.float32)
    params = {}
    for name in "qkvo":
        params[f"w{name}"] = (generator.standard_normal((d_model, d_model)) * 1.5 / np.sqrt(d_model)).astype(
            np.float32
        )
        params[f"b{name}"] = (generator.standard_normal(d_model) * 0.1).astype(np.float32)
    mask = None
    if mask_kind == "padding":
        lengths = generator.integers(1, key_len + 1, size=batch)
        lengths[0] = key_len - 2
        mask = (np.arange(key_len)[None, :] < lengths[:, None])[:, None, None, :]
    elif mask_kind == "causal":
        mask = np.tril(np.ones((query_len, key_len), dtype=bool))[None, None]
    elif mask_kind == "empty row":
        mask = np.ones((batch, 1, query_len, key_len), dtype=bool)
        mask[0, 0, 1, :] = False  # query 1 of sentence 0 may attend to nothing
        mask[-1, 0, 2, :2] = False
    elif mask_kind == "very low scores":  # identity projections and numbers whose scores are exact in float32
        d_head = d_model // num_heads
        query = np.full((batch, query_len, d_model), 256.0, dtype=np.float32)
        key = np.full((batch, key_len, d_model), -64.0, dtype=np.float32)
        for head in range(num_heads):  # head h scores key j at -32768 + (j or key_len - 1 - j) / 2
            offsets = np.arange(key_len) if head % 2 == 0 else np.arange(key_len)[::-1]
            key[:, :, head * d_head] += offsets / 256
        for name in "qk":
            params[f"w{name}"] = np.eye(d_model, dtype=np.float32)
            params[f"b{name}"] = np.zeros(d_model, dtype=np.float32)
        mask = np.ones((batch, 1, query_len, key_len), dtype=bool)
        mask[..., 1] = False
    return query, key, value, params, mask


def _check_mha(multi_head_attention, track: str, name: str) -> None:
    generator = rng(32)
    to_framework = converter(track)
    half_case = [(HALF_CASE, np.float16)] if track == "torch" else []
    for case, dtype in [(c, np.float32) for c in MHA_CASES] + half_case:
        batch, query_len, key_len, d_model, num_heads, mask_kind = case
        query, key, value, params, mask = mha_case(generator, *case)
        half = dtype == np.float16
        if half:
            query, key, value = (a.astype(dtype) for a in (query, key, value))
            params = {n: p.astype(dtype) for n, p in params.items()}
        as64 = [a.astype(np.float64) for a in (query, key, value)]
        params64 = {n: p.astype(np.float64) for n, p in params.items()}

        def variant(**switches):
            return mha_variant(*as64, params64, num_heads, mask, **switches)  # noqa: B023 (used at once)

        framework_params = dict(zip(params, to_framework(*params.values()), strict=True))
        framework_mask = None if mask is None else to_framework(mask)[0]
        what = (f"{name}(query {query.shape}, key {key.shape}, num_heads={num_heads}, mask={mask_kind}"
                + (", float16)" if half else ")"))
        try:
            answer = call(
                multi_head_attention, *to_framework(query, key, value), framework_params, num_heads, framework_mask
            )
        except CheckFailed as failure:
            if "overflow" in str(failure):
                raise CheckFailed(f"{failure}. Likely: {MASK_FILL_HINT}") from None
            raise
        out, weights = output_pair(answer, what)
        if not (np.isfinite(out.astype(np.float64)).all() and np.isfinite(weights.astype(np.float64)).all()):
            raise CheckFailed(f"{what} contains NaN or infinity. Likely: {MASK_FILL_HINT}")
        limits = {"atol": 2e-2, "rtol": 2e-2} if half else tolerance(track)
        mistakes = {
            NO_TRANSPOSE: variant(transpose=False),
            "the text says: each head's scores are divided by sqrt(d_head), d_head = d_model // num_heads; the scores "
            "were divided by sqrt(d_model)": variant(scale="model"),
            "the text says: each head's scores are divided by sqrt(d_head); the scale is missing":
                variant(scale="none"),
            "the text says: softmax over the keys; softmax over the wrong axis (take the last axis)": variant(axis=-2),
            "the text says: the merged heads go through wo and bo; the output projection is missing":
                variant(output_projection=False),
            "the text says: key and value are separate arguments; the values were projected from `key`: "
            "project `value` with wv and bv": mha_variant(
                as64[0], as64[1], as64[1], params64, num_heads, mask),
        }
        if mask_kind == "very low scores":
            mistakes = {FIXED_FILL: variant(fill=-1e4), **mistakes}
        right_out, right_weights = variant()
        expect_close(
            weights,
            right_weights,
            f"the weights of {what}",
            mistakes={m: w for m, (_, w) in mistakes.items()},
            **limits,
        )
        out_mistakes = {m: o for m, (o, _) in mistakes.items()}
        expect_close(out, right_out, f"the output of {what}", mistakes=out_mistakes, **limits)
        expect_type(answer[0], track, f"the output of {what}", "float")
        expect_type(answer[1], track, f"the weights of {what}", "float")
        if track in ("torch", "keras") and not half:
            expect_differentiable(multi_head_attention, (*to_framework(query, key, value), framework_params, num_heads,
                                                         framework_mask), what, (0, 1, 2), 0, track=track)


@exercise(CHAPTER, "multi_head_attention_torch", "project, split, attend, merge, project back, in PyTorch", "torch",
          ATTENTION_SHORTCUTS)
def check_multi_head_attention_torch(multi_head_attention_torch) -> None:
    _check_mha(multi_head_attention_torch, "torch", "multi_head_attention_torch")


@exercise(CHAPTER, "multi_head_attention_keras", "project, split, attend, merge, project back, in Keras", "keras",
          ATTENTION_SHORTCUTS)
def check_multi_head_attention_keras(multi_head_attention_keras) -> None:
    _check_mha(multi_head_attention_keras, "keras", "multi_head_attention_keras")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 4: heads summed instead of concatenated
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "summed_heads", "num_heads full-width heads whose outputs are added, not concatenated")
def check_summed_heads(summed_heads) -> None:
    generator = rng(33)
    for seq_len, d_in, d_out, num_heads in [(7, 16, 8, 4), (5, 6, 6, 2), (3, 10, 4, 8)]:
        x = generator.standard_normal((seq_len, d_in))
        heads = [
            {name: generator.standard_normal((d_in, d_out)) * 1.5 / np.sqrt(d_in) for name in ("wq", "wk", "wv")}
            for _ in range(num_heads)
        ]
        outputs = []
        for scale in (np.sqrt(d_out), np.sqrt(d_out / num_heads)):
            per_head = [
                reference.softmax((x @ h["wq"]) @ (x @ h["wk"]).T / scale) @ (x @ h["wv"]) for h in heads
            ]
            outputs.append(per_head)
        right, wrong_scale = outputs
        given = [{name: w.copy() for name, w in h.items()} for h in heads]
        answer = to_numpy(call(summed_heads, x.copy(), given))
        expect_close(
            answer,
            np.sum(right, axis=0),
            f"summed_heads(x of shape {x.shape}, {num_heads} heads of width {d_out})",
            mistakes={
                "the text says: return the SUM of the heads' outputs, of shape (seq_len, d_out); you concatenated "
                "them": np.concatenate(right, axis=-1),
                "the text says: return the SUM of the heads' outputs; you averaged them (divided by their number)":
                    np.mean(right, axis=0),
                "the text says: each head's scores are divided by sqrt(d_out), the width of its queries; not "
                "1/sqrt(d_out / num_heads)": np.sum(wrong_scale, axis=0),
                "the text says: the sum has shape (seq_len, d_out); the heads were stacked on a new axis": np.stack(
                    right),
            },
        )


# ---------------------------------------------------------------------------------------------------------------
# Find-the-bug, a graded question, a stretch
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "fixed_multi_head_attention_torch", "find the bug: multi-head attention, PyTorch", "torch",
          ATTENTION_SHORTCUTS)
def check_fixed_multi_head_attention_torch(fixed_multi_head_attention_torch) -> None:
    _check_mha(fixed_multi_head_attention_torch, "torch", "fixed_multi_head_attention_torch")


@exercise(CHAPTER, "fixed_multi_head_attention_keras", "find the bug: multi-head attention, Keras", "keras",
          ATTENTION_SHORTCUTS)
def check_fixed_multi_head_attention_keras(fixed_multi_head_attention_keras) -> None:
    _check_mha(fixed_multi_head_attention_keras, "keras", "fixed_multi_head_attention_keras")


@exercise(CHAPTER, "head_parameter_counts", "projection parameters of concatenated and summed heads, 512 wide")
def check_head_parameter_counts(head_parameter_counts) -> None:
    from companion.checks import expect_equal

    keys = ("concatenated", "with_output_projection", "summed", "summed_output_width")
    answer = expect_answer_dict(call(head_parameter_counts), keys, "head_parameter_counts()")
    expect_equal(answer["concatenated"], 786_432, "concatenated (the text says: (a), 8 heads of width 64, no bias)",
                 mistakes={"the text says: count the projection parameters; each head has three, Q, K and V":
                           8 * 512 * 64,
                           "the text says: heads of width 64, so 512 x 64 per matrix, not 512 x 512":
                           8 * 3 * 512 * 512})
    expect_equal(answer["with_output_projection"], 1_048_576, "with_output_projection (the text says: (a) plus W_O)",
                 mistakes={"the text says: no bias; 4 x 512 is the biases": 1_048_576 + 4 * 512,
                           "the text says: the same (a) plus W_O; W_O alone is 512 x 512": 512 * 512})
    expect_equal(answer["summed"], 6_291_456, "summed (the text says: (c), 8 heads of width 512)",
                 mistakes={"the text says: 8 heads of width 512, each with Q, K and V: 8 x 3 x 512 x 512":
                           3 * 512 * 512})
    expect_equal(answer["summed_output_width"], 512, "summed_output_width",
                 mistakes={"the text says: the outputs of (c) are ADDED; summing keeps the width of one head, only "
                           "concatenation multiplies it": 8 * 512})
    for key in keys:
        expect_answer_type(answer[key], "int", f"{key} (a dict of Python ints)")


GQA_CASES = [(2, 4, 2, 3, 5, 4), (1, 6, 3, 4, 4, 2), (2, 4, 1, 2, 3, 8), (1, 2, 2, 3, 3, 4)]  # b, H, G, n, m, d


@exercise(CHAPTER, "grouped_query_attention", "stretch: grouped-query attention, several query heads per key head")
def check_grouped_query_attention(grouped_query_attention) -> None:
    generator = rng(33)
    for batch, heads, groups, n, m, d in GQA_CASES:
        q = generator.standard_normal((batch, heads, n, d)) * 1.5
        k = generator.standard_normal((batch, groups, m, d)) * 1.5
        v = generator.standard_normal((batch, groups, m, d))

        def attend(q, k_full, v_full, scale):
            weights = reference.softmax(q @ np.swapaxes(k_full, -1, -2) / scale)
            return weights @ v_full, weights

        per = heads // groups
        right = attend(q, np.repeat(k, per, axis=1), np.repeat(v, per, axis=1), np.sqrt(d))
        tiled = attend(q, np.tile(k, (1, per, 1, 1)), np.tile(v, (1, per, 1, 1)), np.sqrt(d))
        unscaled = attend(q, np.repeat(k, per, axis=1), np.repeat(v, per, axis=1), 1.0)
        what = f"grouped_query_attention(q {q.shape}, k {k.shape}, v {v.shape})"
        answer = call(grouped_query_attention, q.copy(), k.copy(), v.copy())
        out, weights = output_pair(answer, what)
        mistakes = {
            "the text says: query heads 0..per-1 share key head 0, the next per share key head 1 (np.repeat along "
            "the head axis), not heads 0, G, 2G, ... (np.tile)": tiled,
            "the text says: each head's scores are divided by sqrt(d_head)": unscaled,
        }
        expect_close(weights, right[1], f"the weights of {what}", mistakes={k_: w for k_, (_, w) in mistakes.items()})
        expect_close(out, right[0], f"the output of {what}", mistakes={k_: o for k_, (o, _) in mistakes.items()})
        expect_type(answer[0], "numpy", f"the output of {what} (the text says: NumPy arrays)", "float")
