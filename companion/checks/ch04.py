"""Checks for chapter 4, "Masking"."""

from __future__ import annotations

from typing import Any

import numpy as np

from companion import reference
from companion.checks import CheckFailed, call, exercise, expect_close, expect_equal, part, rng, to_numpy
from companion.checks.tracks import (
    ATTENTION_SHORTCUTS,
    converter,
    expect_answer_dict,
    expect_answer_type,
    expect_differentiable,
    expect_number,
    expect_type,
    output_pair,
    tolerance,
)

CHAPTER = "04_masking"

INVERTED = ("the text says: boolean, True = may attend; the mask is inverted: True must mark what may be attended "
            "to, False what is blocked")


def _expect_bool(answer: Any, what: str) -> np.ndarray:
    array = to_numpy(answer)
    if array.dtype != np.bool_:
        raise CheckFailed(f"the text says: a boolean mask, True = may attend; {what} has dtype {array.dtype}")
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
                "the text says: return a tensor of shape (batch, 1, 1, key_len); yours is (batch, key_len): add "
                "the two singleton axes so it broadcasts over the heads and the queries": expected[:, 0, 0],
                "the text says: shape (batch, 1, 1, key_len); the padding mask blocks key columns, so key_len goes "
                "on the last axis, not (batch, 1, key_len, 1)": expected.reshape(batch, 1, length, 1),
                "the text says: every position holding pad_id is blocked; you compared with 0": reference.padding_mask(
                    ids, 0),
            },
        )
        _expect_bool(answer, what)
        expect_type(answer, track, what, "bool")
    _check_padding_mask_tuple(padding_mask, track, name)


def _check_padding_mask_tuple(padding_mask, track: str, name: str) -> None:
    """A variant: ``pad_id`` may be a tuple of ids, all of which are blocked."""
    generator = rng(43)
    for batch, length, pad_ids in [(3, 6, (0, 3)), (2, 5, (7,)), (2, 4, (1, 2, 5))]:
        ids = generator.integers(0, 9, size=(batch, length))
        ids[:, 0] = 8  # every row keeps a real token
        expected = ~np.isin(ids, pad_ids)[:, None, None, :]
        answer = call(padding_mask, *converter(track)(ids), pad_id=pad_ids)
        what = f"{name}(ids {ids.tolist()}, pad_id={pad_ids})"
        expect_equal(to_numpy(answer), expected, what, mistakes={
            "the text says: when pad_id is a tuple, every id in it is blocked, not only the first":
                (ids != pad_ids[0])[:, None, None, :],
            INVERTED: ~expected,
        })
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
                "the text says: query i may attend to keys 0 to i, ITSELF included; off by one on the diagonal: "
                "keep it (tril with diagonal=0, or query >= key)": np.tril(square, -1)[None, None],
                "the text says: query i (row) may attend to keys 0 to i (columns); the mask is transposed: keep "
                "the lower triangle": np.triu(square)[None, None],
                "the text says: shape (1, 1, query_len, query_len); yours is (length, length): add the two singleton "
                "axes so it broadcasts over the batch and the heads": expected[0, 0],
            },
        )
        _expect_bool(answer, what)
        expect_type(answer, track, what, "bool")
    for query_len, key_len in [(1, 5), (2, 6), (3, 3), (4, 7)]:  # a variant: cached decoding
        offset = key_len - query_len
        expected = np.tril(np.ones((query_len, key_len), dtype=bool), offset)[None, None]
        answer = call(causal_mask, query_len, key_len)
        what = f"{name}({query_len}, {key_len})"
        expect_equal(to_numpy(answer), expected, what, mistakes={
            "the text says: the queries are the LAST query_len positions, so query i sits at position "
            f"key_len - query_len + i = {offset} + i and may attend to keys 0..{offset} + i":
                np.tril(np.ones((query_len, key_len), dtype=bool))[None, None],
            INVERTED: ~expected,
            "the text says: the mask has shape (1, 1, query_len, key_len)": expected[0, 0],
        })
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
    "the text says: a query whose keys are all blocked gets uniform weights and a finite output; it gave NaN: fill "
    "blocked scores with the dtype's most negative finite value "
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
        ((1, 1), 2, 4, 4, "very low scores", np.float32),
    ]:
        q, k, v = (generator.standard_normal((*lead, length, d)) for length in (n, m, m))
        if kind == "very low scores":  # real scores near -32768 beside blocked ones (exact in float32)
            q = np.full((*lead, n, d), 256.0)
            k = np.full((*lead, m, d), -64.0)
            k[..., :, 0] += np.arange(m) / 256  # scores -32768 + j / 2 for key j
            mask = np.ones((1, 1, n, m), dtype=bool)
            mask[..., 3] = False
            mask[..., 1, 0] = False
            cases.append((q.astype(dtype), k.astype(dtype), v.astype(dtype), mask, kind))
            continue
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


FIXED_FILL = ("the text says: blocked keys get weight 0; a fixed fill such as -1e4 lies above real scores as low as "
              "these (about -32768), so the blocked keys took the weight: fill with the dtype's most negative finite "
              "value")


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
        "the text says: blocked keys get weight 0 and each row of weights sums to 1; the mask was applied after "
        "the softmax, so rows no longer sum to 1: block the scores before the softmax": pair(after),
        **({FIXED_FILL: pair(reference.softmax(np.where(mask, scores, -1e4)))} if scores.max() < -1e4 else {}),
        "the text says: blocked keys get weight 0; their scores were set to 0, which still gets weight exp(0) = 1: "
        "fill them with a very negative number": pair(reference.softmax(np.where(mask, scores, 0.0))),
        "the text says: scaled dot-product attention; the scale is missing: divide the scores by sqrt(d_k) "
        "before masking": pair(
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
            raise CheckFailed(f"the text says: float16 inputs give a float16 output; {what} returned "
                              f"{to_numpy(answer[0]).dtype}")


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


def _real_tokens(lengths: np.ndarray, padded_len: int, side: str) -> np.ndarray:
    """(batch, padded_len): True at the real tokens of sentences padded on ``side``."""
    positions = np.arange(padded_len)[None, :]
    return positions >= padded_len - lengths[:, None] if side == "left" else positions < lengths[:, None]


def _length_masks(src_lengths: np.ndarray, tgt_lengths: np.ndarray, src_len: int, tgt_len: int, side: str,
                  extra: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Source and target padding masks, (batch, 1, 1, len); ``extra`` counts padding positions as real (a mistake)."""
    return (_real_tokens(src_lengths + extra, src_len, side)[:, None, None, :],
            _real_tokens(tgt_lengths + extra, tgt_len, side)[:, None, None, :])


@exercise(CHAPTER, "transformer_masks", "encoder, decoder self- and cross-attention masks from sentence lengths")
def check_transformer_masks(transformer_masks) -> None:
    generator = rng(42)
    for batch, src_len, tgt_len, side in [(2, 6, 4, "right"), (3, 5, 5, "right"), (2, 3, 7, "left"),
                                          (3, 5, 5, "left")]:
        src_lengths = generator.integers(1, src_len + 1, size=batch)
        tgt_lengths = generator.integers(1, tgt_len + 1, size=batch)
        src_lengths[0], tgt_lengths[-1] = src_len, tgt_len  # a row without padding on each side
        src_lengths[-1] = min(src_lengths[-1], src_len - 2)  # and one with two or more padding positions
        tgt_lengths[0] = min(tgt_lengths[0], tgt_len - 2)

        lengths = (src_lengths, tgt_lengths, src_len, tgt_len)
        src_pad, tgt_pad = _length_masks(*lengths, side)
        src_flip, tgt_flip = _length_masks(*lengths, "right" if side == "left" else "left")
        src_off, tgt_off = _length_masks(*lengths, side, extra=1)
        causal = reference.causal_mask(tgt_len)
        what = (f"transformer_masks(src_lengths {src_lengths.tolist()}, tgt_lengths {tgt_lengths.tolist()}, "
                f"src_len={src_len}, tgt_len={tgt_len}, padding_side={side!r})")
        answer = call(transformer_masks, src_lengths.copy(), tgt_lengths.copy(), src_len, tgt_len, padding_side=side)
        if not isinstance(answer, tuple | list) or len(answer) != 3:
            raise CheckFailed(f"the text says: {what} returns a tuple of three masks (encoder, decoder "
                              "self-attention, cross-attention)")
        encoder, decoder_self, cross = (to_numpy(a) for a in answer)
        where = "first, so the real tokens are the LAST" if side == "left" else "last, so the real tokens are the FIRST"
        sides = f"the text says: with padding_side={side!r} the padding comes {where} length positions"
        counting = ("the text says: the lengths count the real tokens, so a sentence of length n has exactly n "
                    "True positions (compare positions with <, not <=)")
        expect_equal(encoder, src_pad, f"the encoder mask of {what}", mistakes={
            sides: src_flip,
            counting: src_off,
            "the encoder may look at the whole source: its mask is the source padding mask, with no causal "
            "part": np.logical_and(src_pad, reference.causal_mask(src_len)),
            INVERTED: ~src_pad,
            "the encoder's keys are source positions: build its mask from src_lengths": tgt_pad,
        })
        expect_equal(decoder_self, np.logical_and(tgt_pad, causal), f"the decoder self-attention mask of {what}",
                     mistakes={
            sides: np.logical_and(tgt_flip, causal),
            counting: np.logical_and(tgt_off, causal),
            "the text says: a query may not attend to a key that comes after it; combine the target padding mask "
            "with the causal mask": tgt_pad,
            "the text says: a query may attend only to REAL tokens; combine the causal mask with the target padding "
            "mask": np.broadcast_to(causal, (batch, 1, tgt_len, tgt_len)),
            "the text says: a key must be real AND not after the query; you combined the two conditions with "
            "OR": np.logical_or(tgt_pad, causal),
        })
        expect_equal(cross, src_pad, f"the cross-attention mask of {what}", mistakes={
            "cross-attention's keys are the encoder's outputs, one per source position: use the source padding "
            "mask, not the target's": tgt_pad,
            "cross-attention needs no causal part (the whole source is known), and its keys are source "
            "positions: use the source padding mask": np.logical_and(tgt_pad, causal),
            sides: src_flip,
        })
        for mask, role in ((encoder, "encoder"), (decoder_self, "decoder self-attention"), (cross, "cross-attention")):
            _expect_bool(mask, f"the {role} mask of {what}")
        expect_answer_type(answer, "tuple", f"the result of {what} (a tuple of three boolean masks)")


# ---------------------------------------------------------------------------------------------------------------
# Find-the-bug, graded answers, a variant in torch.nn's convention, a stretch
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "fixed_masked_attention_torch", "find the bug: masked attention that breaks in float16, PyTorch",
          "torch", ATTENTION_SHORTCUTS)
def check_fixed_masked_attention_torch(fixed_masked_attention_torch) -> None:
    _check_masked_attention(fixed_masked_attention_torch, "torch", "fixed_masked_attention_torch")


@exercise(CHAPTER, "fixed_masked_attention_keras", "find the bug: masked attention whose rows do not sum to 1, Keras",
          "keras", ATTENTION_SHORTCUTS)
def check_fixed_masked_attention_keras(fixed_masked_attention_keras) -> None:
    _check_masked_attention(fixed_masked_attention_keras, "keras", "fixed_masked_attention_keras")


@exercise(CHAPTER, "masking_answers", "graded answers: the cross-attention mask, float16 limits, a zero fill")
def check_masking_answers(masking_answers) -> None:
    answer = expect_answer_dict(call(masking_answers), ("cross_mask_from", "lowest_float16", "minus_1e9_in_float16",
                                                         "weight_on_zero_filled_key"), "masking_answers()")
    with part("cross_mask_from"):  # each answer is a part: partial credit where the instructor allows it
        expect_equal(answer["cross_mask_from"], "source", "cross_mask_from (the text says: 'source' or 'target')",
                     mistakes={"cross-attention's keys are the encoder's outputs, one per source position, so its "
                               "padding mask comes from the source": "target"})
    for key, expected, mistakes in [
        ("lowest_float16", -65504.0, {"that is float32's lowest value; float16 stops at -65504":
                                      float(np.finfo(np.float32).min), "the text asks for the most NEGATIVE finite "
                                      "value, not the largest": 65504.0}),
        ("minus_1e9_in_float16", -np.inf, {"-1e9 lies beyond float16's range (-65504): it rounds to -inf, not to "
                                           "the lowest finite value": -65504.0, "-1e9 does not fit in float16": -1e9}),
        ("weight_on_zero_filled_key", 0.25, {"a score of 0 is not blocked: exp(0) = 1, like the three other keys, "
                                             "so it gets a quarter of the weight": 0.0}),
    ]:
        with part(key):
            expect_number(answer[key], expected, key, mistakes)
            if key != "weight_on_zero_filled_key":
                expect_answer_type(answer[key], "float", f"{key} (a Python float)")


@exercise(CHAPTER, "torch_style_masks", "a Transformer's masks in torch.nn.Transformer's convention (True = blocked)")
def check_torch_style_masks(torch_style_masks) -> None:
    generator = rng(44)
    for batch, src_len, tgt_len, pad_id in [(2, 5, 5, 0), (3, 6, 4, 0), (2, 3, 6, 1)]:
        src = _ids_batch(generator, batch, src_len, pad_id)
        tgt = _ids_batch(generator, batch, tgt_len, pad_id)
        what = f"torch_style_masks(src_ids {src.shape}, tgt_ids {tgt.shape}, pad_id={pad_id})"
        answer = call(torch_style_masks, src.copy(), tgt.copy(), pad_id=pad_id)
        keys = ("src_key_padding_mask", "tgt_key_padding_mask", "memory_key_padding_mask", "tgt_mask")
        if not isinstance(answer, dict) or set(keys) - set(answer):
            raise CheckFailed(f"the text says: {what} returns a dict with the keys {', '.join(keys)}")
        src_blocked, tgt_blocked = src == pad_id, tgt == pad_id
        future = np.triu(np.ones((tgt_len, tgt_len), dtype=bool), 1)
        flip = "the text says: torch.nn.Transformer marks BLOCKED positions with True, the opposite of the course"
        for key, expected, extra in [
            ("src_key_padding_mask", src_blocked, {"the text says: (batch, src_len), without singleton axes":
                                                   src_blocked[:, None, None, :]}),
            ("tgt_key_padding_mask", tgt_blocked, {"the text says: (batch, tgt_len), without singleton axes":
                                                   tgt_blocked[:, None, None, :]}),
            ("memory_key_padding_mask", src_blocked, {"the memory is the encoder's output, one key per SOURCE "
                                                      "position: take the source padding, not the target's":
                                                      tgt_blocked}),
            ("tgt_mask", future, {"the text says: (tgt_len, tgt_len), shared by the batch": future[None, None],
                                  "a position may attend to itself: block only the keys after it (the diagonal "
                                  "stays False)": np.triu(np.ones((tgt_len, tgt_len), dtype=bool))}),
        ]:
            mistakes = {flip: ~expected, **extra}
            expect_equal(to_numpy(answer[key]), expected, f"{key} of {what}", mistakes=mistakes)
            array = to_numpy(answer[key])
            if array.dtype != np.bool_:
                raise CheckFailed(f"the text says: boolean masks; {key} of {what} has dtype {array.dtype}")


def _segments(generator: np.random.Generator, batch: int, length: int) -> np.ndarray:
    """Packed rows: segments 1, 2, ... of random lengths, then padding (0) at the end of some rows."""
    rows = []
    for row in range(batch):
        used = length if row == 0 else int(generator.integers(1, length + 1))
        cuts = np.sort(generator.choice(np.arange(1, used), size=min(2, used - 1), replace=False)) if used > 1 else []
        segment = np.zeros(length, dtype=np.int64)
        segment[:used] = 1 + np.searchsorted(cuts, np.arange(used), side="right")
        rows.append(segment)
    return np.stack(rows)


@exercise(CHAPTER, "packed_causal_mask", "stretch: causal mask for several sentences packed into one row")
def check_packed_causal_mask(packed_causal_mask) -> None:
    generator = rng(45)
    for batch, length in [(2, 7), (3, 5), (1, 1), (2, 9)]:
        segments = _segments(generator, batch, length)
        same = segments[:, :, None] == segments[:, None, :]
        real = (segments != 0)[:, None, :]
        causal = np.tril(np.ones((length, length), dtype=bool))[None]
        expected = (same & real & causal)[:, None]
        what = f"packed_causal_mask(segment_ids {segments.tolist()})"
        answer = call(packed_causal_mask, segments.copy())
        own, later, pads = (real & causal)[:, None], (same & real)[:, None], (same & causal)[:, None]
        expect_equal(to_numpy(answer), expected, what, mistakes={
            "the text says: a token sees only earlier tokens of ITS OWN segment; combine the segment test with "
            "the causal mask": own,
            "the text says: no token sees a later one: AND the segment test with the causal mask": later,
            "the text says: padding (segment 0) is blocked as a key, even for padding queries": pads,
            INVERTED: ~expected,
            "the text says: the shape is (batch, 1, length, length), broadcasting over the heads": expected[:, 0],
        })
        _expect_bool(answer, what)
        expect_type(answer, "numpy", what, "bool")
