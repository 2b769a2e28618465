"""Typical wrong answers to the exercises of chapters 5 and 6: each must be named in the check's message.

The generic tests in test_exercises.py already cover "the solution passes, the stub fails" for these chapters.
"""

import numpy as np
import pytest

from companion.checks import CheckFailed, exercises_for, run_check

# ---------------------------------------------------------------------------------------------------------------
# Chapter 5: positional encoding
# ---------------------------------------------------------------------------------------------------------------


def _angles(max_len, d_model, power):
    return np.arange(max_len)[:, None] / 10000.0 ** power


def _table(sines, cosines):
    table = np.empty((sines.shape[0], 2 * sines.shape[1]))
    table[:, 0::2], table[:, 1::2] = sines, cosines
    return table


def _pe_right(max_len, d_model):
    a = _angles(max_len, d_model, np.arange(0, d_model, 2) / d_model)
    return _table(np.sin(a), np.cos(a))


def _pe_swapped(max_len, d_model):
    a = _angles(max_len, d_model, np.arange(0, d_model, 2) / d_model)
    return _table(np.cos(a), np.sin(a))


def _pe_halves(max_len, d_model):
    a = _angles(max_len, d_model, np.arange(0, d_model, 2) / d_model)
    return np.concatenate([np.sin(a), np.cos(a)], axis=1)


def _pe_exponent_i(max_len, d_model):
    a = _angles(max_len, d_model, np.arange(d_model // 2) / d_model)
    return _table(np.sin(a), np.cos(a))


def _pe_per_column(max_len, d_model):
    a = _angles(max_len, d_model, np.arange(d_model) / d_model)
    return _table(np.sin(a[:, 0::2]), np.cos(a[:, 1::2]))


def _pe_from_one(max_len, d_model):
    return _pe_right(max_len + 1, d_model)[1:]


def _pe_transposed(max_len, d_model):
    return _pe_right(max_len, d_model).T


def _omega(d_model, power=2):
    return 10000.0 ** (-power * np.arange(d_model // 2) / d_model)


def _rotate(pe, k, omega):
    c, s = np.cos(omega * k), np.sin(omega * k)
    out = np.empty_like(pe)
    out[:, 0::2] = pe[:, 0::2] * c + pe[:, 1::2] * s
    out[:, 1::2] = pe[:, 1::2] * c - pe[:, 0::2] * s
    return out


def _shift_backwards(pe, k):
    return _rotate(pe, -k, _omega(pe.shape[-1]))


def _shift_cos_first(pe, k):  # treats column 2i as the cosine: turns the wrong way
    c, s = np.cos(_omega(pe.shape[-1]) * k), np.sin(_omega(pe.shape[-1]) * k)
    out = np.empty_like(pe)
    out[:, 0::2] = pe[:, 0::2] * c - pe[:, 1::2] * s
    out[:, 1::2] = pe[:, 1::2] * c + pe[:, 0::2] * s
    return out


def _pe_of_offset(k, d_model):
    angle = k * _omega(d_model)
    return _table(np.sin(angle)[None], np.cos(angle)[None])[0]


def _shift_add(pe, k):
    return pe + _pe_of_offset(k, pe.shape[-1])


def _shift_multiply(pe, k):
    return pe * _pe_of_offset(k, pe.shape[-1])


def _shift_wrong_frequency(pe, k):
    return _rotate(pe, k, _omega(pe.shape[-1], power=1))


def _shift_unchanged(pe, k):
    return pe


def _torch_input(scale_embedding=True, add_pe=True, scale_pe=False, start=0):
    import torch

    def encoder_input_torch(ids, table):
        seq_len, d_model = ids.shape[1], table.shape[1]
        pe = torch.as_tensor(_pe_right(seq_len + start, d_model)[start:], dtype=table.dtype)
        words = table[ids] * (d_model**0.5 if scale_embedding else 1.0)
        if not add_pe:
            return words
        return (table[ids] + pe) * d_model**0.5 if scale_pe else words + pe

    return encoder_input_torch


def _keras_input(scale_embedding=True, add_pe=True, start=0):
    from keras import ops

    def encoder_input_keras(ids, table):
        seq_len, d_model = ids.shape[1], table.shape[1]
        pe = ops.convert_to_tensor(_pe_right(seq_len + start, d_model)[start:], dtype=table.dtype)
        words = ops.take(table, ids, axis=0) * (d_model**0.5 if scale_embedding else 1.0)
        return words + pe if add_pe else words

    return encoder_input_keras


CH05_MISTAKES = [
    ("positional_encoding", lambda: _pe_swapped, "sine and cosine are swapped"),
    ("positional_encoding", lambda: _pe_halves, "two halves"),
    ("positional_encoding", lambda: _pe_exponent_i, "exponent is i / d_model"),
    ("positional_encoding", lambda: _pe_per_column, "its own frequency"),
    ("positional_encoding", lambda: _pe_from_one, "positions start at 1"),
    ("positional_encoding", lambda: _pe_transposed, "transposed"),
    ("shift_encoding", lambda: _shift_backwards, r"PE\[pos - k\]"),
    ("shift_encoding", lambda: _shift_cos_first, r"PE\[pos - k\]"),
    ("shift_encoding", lambda: _shift_add, "adding PE"),
    ("shift_encoding", lambda: _shift_multiply, "multiplying by PE"),
    ("shift_encoding", lambda: _shift_wrong_frequency, r"10000\*\*\(-i / d_model\)"),
    ("shift_encoding", lambda: _shift_unchanged, "unchanged"),
    ("encoder_input_torch", lambda: _torch_input(scale_embedding=False), "sqrt"),
    ("encoder_input_torch", lambda: _torch_input(add_pe=False), "positional encoding is missing"),
    ("encoder_input_torch", lambda: _torch_input(scale_pe=True), "scaled too"),
    ("encoder_input_torch", lambda: _torch_input(start=1), "positions start at 1"),
    ("encoder_input_keras", lambda: _keras_input(scale_embedding=False), "sqrt"),
    ("encoder_input_keras", lambda: _keras_input(add_pe=False), "positional encoding is missing"),
    ("encoder_input_keras", lambda: _keras_input(start=1), "positions start at 1"),
]

# ---------------------------------------------------------------------------------------------------------------
# Chapter 6: Add & Norm and the feed-forward sublayer
# ---------------------------------------------------------------------------------------------------------------


def _ln(axis=-1, ddof=0, eps_outside=False, use_eps=True, swap=False, affine=True):
    def layer_norm(x, gamma, beta, eps=1e-5):
        eps = eps if use_eps else 0.0
        centred = x - x.mean(axis=axis, keepdims=True)
        std = x.std(axis=axis, ddof=ddof, keepdims=True)
        normed = centred / (std + eps) if eps_outside else centred / np.sqrt(std**2 + eps)
        if not affine:
            return normed
        return beta * normed + gamma if swap else gamma * normed + beta

    return layer_norm


def _ln_eps_1e6(x, gamma, beta, eps=1e-6):  # a wrong default: the check calls it without eps on a small spread
    return _ln()(x, gamma, beta, eps)


def _pre_ln(kind, framework):
    def block(x, sublayer, norm):
        if kind == "post":
            return norm(x + sublayer(x))
        if kind == "norm_output":
            return x + norm(sublayer(x))
        if kind == "no_residual":
            return sublayer(norm(x))
        if kind == "normalised_residual":
            return norm(x) + sublayer(norm(x))
        raise ValueError(kind)

    return block


def _count(bias=True, norms=2, heads_multiply=False, per_head=False, w_o=True):
    def encoder_layer_parameters(d_model, d_ff, num_heads):
        d = d_model
        width = d // num_heads if per_head else d
        projections = 4 if w_o else 3
        attention = projections * (d * width + (width if bias else 0))
        if heads_multiply:
            attention *= num_heads
        ffn = 2 * d * d_ff + ((d_ff + d) if bias else 0)
        return attention + ffn + norms * 2 * d

    return encoder_layer_parameters


CH06_MISTAKES = [
    ("layer_norm", lambda: _ln(ddof=1), "unbiased"),
    ("layer_norm", lambda: _ln(eps_outside=True), "outside the square root"),
    ("layer_norm", lambda: _ln(ddof=1, eps_outside=True), "seed 003"),
    ("layer_norm", lambda: _ln(use_eps=False), "epsilon is missing"),
    ("layer_norm", lambda: _ln(axis=0), "BatchNorm"),
    ("layer_norm", lambda: _ln(axis=(-2, -1)), "whole sequence"),
    ("layer_norm", lambda: _ln(swap=True), "swapped"),
    ("layer_norm", lambda: _ln(affine=False), "not applied"),
    ("pre_ln_sublayer_torch", lambda: _pre_ln("post", "torch"), "post-LN"),
    ("pre_ln_sublayer_torch", lambda: _pre_ln("norm_output", "torch"), "sublayer's output"),
    ("pre_ln_sublayer_torch", lambda: _pre_ln("no_residual", "torch"), "residual connection is missing"),
    ("pre_ln_sublayer_torch", lambda: _pre_ln("normalised_residual", "torch"), "normalised x"),
    ("pre_ln_sublayer_keras", lambda: _pre_ln("post", "keras"), "post-LN"),
    ("pre_ln_sublayer_keras", lambda: _pre_ln("norm_output", "keras"), "sublayer's output"),
    ("pre_ln_sublayer_keras", lambda: _pre_ln("no_residual", "keras"), "residual connection is missing"),
    ("encoder_layer_parameters", lambda: _count(bias=False), "biases are missing"),
    ("encoder_layer_parameters", lambda: _count(norms=0), "LayerNorms are missing"),
    ("encoder_layer_parameters", lambda: _count(norms=1), "there are two of them"),
    ("encoder_layer_parameters", lambda: _count(heads_multiply=True), "grew with num_heads"),
    ("encoder_layer_parameters", lambda: _count(per_head=True), "d_model x d_head"),
    ("encoder_layer_parameters", lambda: _count(w_o=False), "W_O"),
]


@pytest.mark.parametrize(
    "exercise_id, make_wrong, message",
    CH05_MISTAKES + CH06_MISTAKES,
    ids=[f"{e}-{m}" for e, _, m in CH05_MISTAKES + CH06_MISTAKES],
)
def test_typical_mistakes_are_named(exercise_id, make_wrong, message):
    with pytest.raises(CheckFailed, match=message):
        run_check(exercise_id, make_wrong())


def test_each_exercise_has_at_least_three_named_mistakes():
    listed = [e for e, _, _ in CH05_MISTAKES + CH06_MISTAKES]
    for chapter in ("05_positional_encoding", "06_add_and_norm"):
        exercises = exercises_for(chapter)
        assert len(exercises) >= 3
        for item in exercises:
            assert listed.count(item.id) >= 3, f"{item.id} has fewer than 3 typical mistakes under test"


def test_wrong_default_epsilon_and_non_integer_counts_fail():
    with pytest.raises(CheckFailed, match="default epsilon"):
        run_check("layer_norm", _ln_eps_1e6)
    with pytest.raises(CheckFailed, match="whole number"):
        run_check("encoder_layer_parameters", lambda d, f, h: float(_count()(d, f, h)))


def test_hard_coded_answers_fail():
    table = _pe_right(10, 4)
    with pytest.raises(CheckFailed):
        run_check("positional_encoding", lambda max_len, d_model: table)
    with pytest.raises(CheckFailed):
        run_check("encoder_layer_parameters", lambda d, f, h: 3152384)
