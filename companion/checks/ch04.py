"""Checks for chapter 4, "Masking"."""

from __future__ import annotations

from typing import Any

import numpy as np

from companion import reference
from companion.checks import CheckFailed, call, exercise, expect_close, expect_equal, rng, to_numpy
from companion.checks.tracks import (
    ATTENTION_SHORTCUTS,
    converter,
    expect_differentiable,
    expect_type,
    output_pair,
    tolerance,
)

CHAPTER = "04_masking"

INVERTED = "the mask is inverted: True must mark what may be attended to, False what is blocked"


def _expect_bool(answer: Any, what: str) -> np.ndarray:
    array = to_numpy(answer)
    if array.dtype != np.bool_:
        raise CheckFailed(f"{what} should be boolean (True = may attend); got dtype {array.dtype}")
    return array


def _ids_batch(generator: np.random.Generator, batch: int, length: int, pad_id: int) -> np.ndarray:
    """Ids padded on the right with pad_id; every row keeps at least one real token. Real ids avoid pad_id."""
    ids = generator.integers(0, 30, size=(batch, length))
    ids[ids == pad_id] = pad_id + 31  # a real token, never the pad id (0 stays a real token when pad_id != 0)
    lengths = generator.integers(1, length + 1, size=batch)
    lengths[0] = length  # one full row
    ids[np.arange(length)[None, :] >= lengths[:, None]] = pad_id
    return ids


# ---------------------------------------------------------------------------------------------------------------
# Exercise 1: padding mask
# ---------------------------------------------------------------------------------------------------------------


def _check_padding_mask(padding_mask, track: str, name: str) -> None:
    generator = rng(40)
    for batch, length, pad_id in [(3, 6, 0), (2, 4, 0), (4, 5, 1)]:
        ids = _ids_batch(generator, batch, length, pad_id)
        if pad_id != 0:
            ids[0, 0] = 0  # a real token with id 0
        expected = reference.padding_mask(ids, pad_id)
        answer = call(padding_mask, *converter(track)(ids), pad_id=pad_id)
        what = f"{name}(ids {ids.tolist()}, pad_id={pad_id})"
        expect_equal(
            to_numpy(answer),
            expected,
            what,
            mistakes={
                INVERTED: ~expected,
                "the mask has shape (batch, key_len); add the two singleton axes, (batch, 1, 1, key_len), so it "
                "broadcasts over the heads and the queries": expected[:, 0, 0],
                "the padding mask blocks key columns, so key_len goes on the last axis: (batch, 1, 1, key_len), not "
                "(batch, 1, key_len, 1)": expected.reshape(batch, 1, length, 1),
                "you compared with 0; compare with pad_id": reference.padding_mask(ids, 0),
            },
        )
        _expect_bool(answer, what)
        expect_type(answer, track, what, "bool")


@exercise(CHAPTER, "padding_mask_torch", "ids (batch, len) -> bool (batch, 1, 1, len), True = not padding", "torch")
def check_padding_mask_torch(padding_mask_torch) -> None:
    _check_padding_mask(padding_mask_torch, "torch", "padding_mask_torch")


@exercise(CHAPTER, "padding_mask_keras", "ids (batch, len) -> bool (batch, 1, 1, len), True = not padding", "keras")
def check_padding_mask_keras(padding_mask_keras) -> None:
    _check_padding_mask(padding_mask_keras, "keras", "padding_mask_keras")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 2: causal mask
# ---------------------------------------------------------------------------------------------------------------


def _check_causal_mask(causal_mask, name: str, track: str = "numpy") -> None:
    for length in (5, 1, 3, 8):
        expected = reference.causal_mask(length)
        square = np.ones((length, length), dtype=bool)
        answer = call(causal_mask, length)
        what = f"{name}({length})"
        expect_equal(
            to_numpy(answer),
            expected,
            what,
            mistakes={
                INVERTED: ~expected,
                "off by one on the diagonal: a position may attend to itself, so keep the diagonal (tril with "
                "diagonal=0, or query >= key)": np.tril(square, -1)[None, None],
                "the mask is transposed: query i (a row) may attend to keys 0..i (columns), the lower "
                "triangle": np.triu(square)[None, None],
                "the mask has shape (length, length); return (1, 1, length, length) so it broadcasts over the batch "
                "and the heads": expected[0, 0],
            },
        )
        _expect_bool(answer, what)
        expect_type(answer, track, what, "bool")


@exercise(CHAPTER, "causal_mask_torch", "bool (1, 1, n, n): query i may attend to keys 0..i, in PyTorch", "torch",
          ("torch.nn.Transformer.generate_square_subsequent_mask",))
def check_causal_mask_torch(causal_mask_torch) -> None:
    _check_causal_mask(causal_mask_torch, "causal_mask_torch", "torch")


@exercise(CHAPTER, "causal_mask_keras", "bool (1, 1, n, n): query i may attend to keys 0..i, in Keras", "keras")
def check_causal_mask_keras(causal_mask_keras) -> None:
    _check_causal_mask(causal_mask_keras, "causal_mask_keras", "keras")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 3: attention with a mask, safe for fully masked rows and float16
# ---------------------------------------------------------------------------------------------------------------

NAN_HINT = (
    "a row whose keys are all blocked gave NaN: fill blocked scores with the dtype's most negative finite value "
    "(torch.finfo(dtype).min, or numpy's finfo for Keras), not -inf; in float16 a fill of -1e9 also becomes -inf"
)


def _masked_cases(generator: np.random.Generator):
    """(q, k, v, mask, dtype name): padding, causal+padding, a fully masked row in float32 and in float16."""
    cases = []
    for lead, n, m, d, kind, dtype in [
        ((2, 1), 4, 6, 8, "padding", np.float32),
        ((2, 2), 5, 5, 4, "causal", np.float32),
        ((1, 1), 3, 4, 8, "empty row", np.float32),
        ((1, 1), 3, 4, 8, "empty row", np.float16),
    ]:
        q, k, v = (generator.standard_normal((*lead, length, d)) for length in (n, m, m))
        if kind == "padding":
            lengths = np.array([m, 2])
            mask = (np.arange(m)[None, :] < lengths[:, None])[:, None, None, :]
        elif kind == "causal":
            mask = np.tril(np.ones((n, m), dtype=bool))[None, None] & np.array([True] * 4 + [False])
        else:
            mask = np.ones((1, 1, n, m), dtype=bool)
            mask[..., 1, :] = False  # query 1 may attend to nothing
            mask[..., 2, 0] = False
        cases.append((q.astype(dtype), k.astype(dtype), v.astype(dtype), mask, kind))
    return cases


def _masked_variants(q, k, v, mask) -> dict:
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    lowest = np.finfo(np.float64).min

    def pair(weights):
        return weights @ v, weights

    right = reference.softmax(np.where(mask, scores, lowest))
    after = reference.softmax(scores) * mask
    return {
        None: pair(right),
        INVERTED: pair(reference.softmax(np.where(mask, lowest, scores))),
        "the mask was applied after the softmax: rows no longer sum to 1; block the scores before the "
        "softmax": pair(after),
        "blocked scores were set to 0, which still gets weight exp(0) = 1; fill them with a very negative "
        "number": pair(reference.softmax(np.where(mask, scores, 0.0))),
        "the scale is missing: divide the scores by sqrt(d_k) before masking": pair(
            reference.softmax(np.where(mask, scores * np.sqrt(q.shape[-1]), lowest))
        ),
    }


def _check_masked_attention(masked_attention, track: str, name: str) -> None:
    generator = rng(41)
    for q, k, v, mask, kind in _masked_cases(generator):
        half = q.dtype == np.float16
        what = f"{name}(q {q.shape}, k {k.shape}, v {v.shape}, {kind} mask, {q.dtype.name})"
        try:
            answer = call(masked_attention, *converter(track)(q, k, v, mask))
        except CheckFailed as failure:
            if "overflow" in str(failure) or "Half" in str(failure):
                raise CheckFailed(f"{failure}. Likely: {NAN_HINT}") from None
            raise
        out, weights = output_pair(answer, what)
        if not (np.isfinite(out.astype(np.float64)).all() and np.isfinite(weights.astype(np.float64)).all()):
            raise CheckFailed(f"{what} contains NaN or infinity. Likely: {NAN_HINT}")
        variants = _masked_variants(q, k, v, mask)
        limits = {"atol": 5e-3, "rtol": 5e-3} if half else tolerance(track)
        right_out, right_weights = variants[None]
        expect_close(
            weights.astype(np.float64),
            right_weights,
            f"the weights of {what}",
            mistakes={m: w for m, (_, w) in variants.items() if m is not None},
            **limits,
        )
        expect_close(
            out.astype(np.float64),
            right_out,
            f"the output of {what}",
            mistakes={m: o for m, (o, _) in variants.items() if m is not None},
            **limits,
        )
        expect_type(answer[0], track, f"the output of {what}", "float")
        expect_type(answer[1], track, f"the weights of {what}", "float")
        if track in ("torch", "keras") and not half:
            expect_differentiable(masked_attention, converter(track)(q, k, v, mask), what, (0, 1, 2), 0, track=track)
        if half and to_numpy(answer[0]).dtype != np.float16:
            raise CheckFailed(f"{what}: float16 inputs should give a float16 output; got {to_numpy(answer[0]).dtype}")


@exercise(CHAPTER, "masked_attention_torch", "scaled dot-product attention with a boolean mask, in PyTorch", "torch",
          ATTENTION_SHORTCUTS)
def check_masked_attention_torch(masked_attention_torch) -> None:
    _check_masked_attention(masked_attention_torch, "torch", "masked_attention_torch")


@exercise(CHAPTER, "masked_attention_keras", "scaled dot-product attention with a boolean mask, in Keras", "keras",
          ATTENTION_SHORTCUTS)
def check_masked_attention_keras(masked_attention_keras) -> None:
    _check_masked_attention(masked_attention_keras, "keras", "masked_attention_keras")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 4: the three masks of a Transformer
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "transformer_masks", "encoder, decoder self- and cross-attention masks from source and target ids")
def check_transformer_masks(transformer_masks) -> None:
    generator = rng(42)
    for batch, src_len, tgt_len, pad_id in [(2, 6, 4, 0), (3, 5, 5, 0), (2, 3, 7, 2)]:
        src = _ids_batch(generator, batch, src_len, pad_id)
        tgt = _ids_batch(generator, batch, tgt_len, pad_id)
        src_pad, tgt_pad = reference.padding_mask(src, pad_id), reference.padding_mask(tgt, pad_id)
        causal = reference.causal_mask(tgt_len)
        what = f"transformer_masks(src_ids {src.shape}, tgt_ids {tgt.shape}, pad_id={pad_id})"
        answer = call(transformer_masks, src.copy(), tgt.copy(), pad_id=pad_id)
        if not isinstance(answer, tuple | list) or len(answer) != 3:
            raise CheckFailed(f"{what} should return three masks (encoder, decoder_self, cross)")
        encoder, decoder_self, cross = (to_numpy(a) for a in answer)
        expect_equal(
            encoder,
            src_pad,
            f"the encoder mask of {what}",
            mistakes={
                "the encoder may look at the whole source: its mask is the source padding mask, with no causal "
                "part": np.logical_and(src_pad, reference.causal_mask(src_len)),
                INVERTED: ~src_pad,
                "the encoder's keys are source positions: use the source padding mask": tgt_pad,
            },
        )
        expect_equal(
            decoder_self,
            np.logical_and(tgt_pad, causal),
            f"the decoder self-attention mask of {what}",
            mistakes={
                "the decoder self-attention mask lacks the causal part: combine the target padding mask with "
                "causal_mask(tgt_len)": tgt_pad,
                "the decoder self-attention mask lacks the target padding mask: combine it with the causal "
                "mask": np.broadcast_to(causal, (batch, 1, tgt_len, tgt_len)),
                "the decoder self-attention mask was combined with OR; both conditions must hold (AND)": np.logical_or(
                    tgt_pad, causal
                ),
            },
        )
        expect_equal(
            cross,
            src_pad,
            f"the cross-attention mask of {what}",
            mistakes={
                "cross-attention's keys are the encoder's outputs, one per source position: use the source padding "
                "mask, not the target's": tgt_pad,
                "cross-attention needs no causal part (the whole source is known), and its keys are source "
                "positions: use the source padding mask": np.logical_and(tgt_pad, causal),
            },
        )
        for mask, role in ((encoder, "encoder"), (decoder_self, "decoder self-attention"), (cross, "cross-attention")):
            _expect_bool(mask, f"the {role} mask of {what}")
