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


def _torch_input(scale_embedding=True, add_pe=True, scale_pe=False, start=0, as_numpy=False):
    import torch

    def encoder_input_torch(ids, table):
        seq_len, d_model = ids.shape[1], table.shape[1]
        pe = torch.as_tensor(_pe_right(seq_len + start, d_model)[start:], dtype=table.dtype)
        words = table[ids] * (d_model**0.5 if scale_embedding else 1.0)
        if not add_pe:
            return words
        if as_numpy:
            return (words + pe).detach().numpy()
        return (table[ids] + pe) * d_model**0.5 if scale_pe else words + pe

    return encoder_input_torch


def _keras_input(scale_embedding=True, add_pe=True, start=0, as_numpy=False):
    from keras import ops

    def encoder_input_keras(ids, table):
        seq_len, d_model = ids.shape[1], table.shape[1]
        pe = ops.convert_to_tensor(_pe_right(seq_len + start, d_model)[start:], dtype=table.dtype)
        words = ops.take(table, ids, axis=0) * (d_model**0.5 if scale_embedding else 1.0)
        if as_numpy:
            return ops.convert_to_numpy(words + pe)
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


def _freq(power=2, sign=-1, per_column=False, wavelength=False, dtype=np.float64):
    def angular_frequencies(d_model):
        index = np.arange(d_model) // 2 if per_column else np.arange(d_model // 2)
        omega = 10000.0 ** (sign * power * index / d_model)
        return (2 * np.pi / omega if wavelength else omega).astype(dtype)

    return angular_frequencies


def _add_positions_torch(power=2, add=True, start=0, dtype=None):
    import torch

    def add_positions_torch(x):
        seq_len, d_model = x.shape[1], x.shape[2]
        angle = torch.arange(start, seq_len + start, dtype=torch.float64)[:, None] * 10000.0 ** (
            -power * torch.arange(d_model // 2, dtype=torch.float64) / d_model)
        pe = torch.zeros(seq_len, d_model, dtype=torch.float64)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
        out = x + pe if add else pe.expand_as(x)
        return out.double() if dtype == "double" else out.to(x.dtype)

    return add_positions_torch


def _add_positions_keras(power=2, start=0, as_numpy=False):
    from keras import ops

    def add_positions_keras(x):
        seq_len, d_model = x.shape[1], x.shape[2]
        angle = ops.arange(start, seq_len + start, dtype="float32")[:, None] * ops.power(
            10000.0, -power * ops.arange(d_model // 2, dtype="float32") / d_model)
        pe = ops.reshape(ops.stack([ops.sin(angle), ops.cos(angle)], axis=-1), (seq_len, d_model))
        out = x + pe
        return ops.convert_to_numpy(out) if as_numpy else out

    return add_positions_keras


def _offset_similarity(kind):
    def offset_similarity(d_model, offsets):
        k = np.asarray(offsets, dtype=np.float64)[:, None]
        power = 1 if kind == "exponent" else 2
        angle = k * 10000.0 ** (-power * np.arange(d_model // 2) / d_model)
        if kind == "sin":
            return np.sin(angle).sum(-1)
        if kind == "mean":
            return np.cos(angle).mean(-1)
        if kind == "int":
            return np.cos(angle).sum(-1).round().astype(np.int64)
        if kind == "list":
            return np.cos(angle).sum(-1).tolist()
        return np.cos(angle).sum(-1)

    return offset_similarity


def _outcome(kind):
    def learned_table_outcome(seq_len, trained_len, rows):
        if kind == "off_by_one_rows":
            return "error" if seq_len >= rows else ("untrained" if seq_len > trained_len else "trained")
        if kind == "off_by_one_trained":
            return "error" if seq_len > rows else ("untrained" if seq_len >= trained_len else "trained")
        if kind == "sinusoidal":  # answers as if the table were a formula
            return "trained"
        if kind == "bool":
            return seq_len <= rows
        raise ValueError(kind)

    return learned_table_outcome


def _freq_as_list():
    def angular_frequencies(d_model):
        return _freq()(d_model).tolist()

    return angular_frequencies


def _hits(kind):
    """A factory (the table holds factories) of a wrong dropout_hit_fraction."""

    def make_wrong():
        def dropout_hit_fraction(rate, layers):
            if kind == "sum":
                return rate * layers
            if kind == "survives":
                return (1 - rate) ** layers
            if kind == "one":
                return rate
            if kind == "text":
                return f"{1 - (1 - rate) ** layers:.2f}"
            if kind == "int when nothing drops":
                return 0 if rate == 0 else 1 - (1 - rate) ** layers
            return 0.47

        return dropout_hit_fraction

    return make_wrong


CH05_MISTAKES += [
    ("angular_frequencies", lambda: _freq(power=1), "i / d_model"),
    ("angular_frequencies", lambda: _freq(sign=1), "sign of the exponent is flipped"),
    ("angular_frequencies", lambda: _freq(per_column=True), "one per column"),
    ("angular_frequencies", lambda: _freq(wavelength=True), "wavelengths"),
    ("angular_frequencies", _freq_as_list, "NumPy array"),
    ("add_positions_torch", lambda: _add_positions_torch(power=1), "still i / d_model"),
    ("add_positions_torch", lambda: _add_positions_torch(add=False), "encoding replaced x"),
    ("add_positions_torch", lambda: _add_positions_torch(start=1), "positions start at 1"),
    ("add_positions_torch", lambda: _add_positions_torch(dtype="double"), "keep the dtype"),
    ("add_positions_keras", lambda: _add_positions_keras(power=1), "still i / d_model"),
    ("add_positions_keras", lambda: _add_positions_keras(start=1), "positions start at 1"),
    ("add_positions_keras", lambda: _add_positions_keras(as_numpy=True), "Keras tensor"),
    ("offset_similarity", lambda: _offset_similarity("exponent"), "i / d_model"),
    ("offset_similarity", lambda: _offset_similarity("sin"), "not sin"),
    ("offset_similarity", lambda: _offset_similarity("mean"), "mean over pairs"),
    ("offset_similarity", lambda: _offset_similarity("int"), "differs"),
    ("learned_table_outcome", lambda: _outcome("off_by_one_rows"), "seq_len == rows"),
    ("learned_table_outcome", lambda: _outcome("off_by_one_trained"), "trains positions 0"),
    ("learned_table_outcome", lambda: _outcome("sinusoidal"), "some rows never received"),
    ("learned_table_outcome", lambda: _outcome("bool"), "one of the strings"),
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
        if kind == "numpy":
            out = x + sublayer(norm(x))
            if framework == "torch":
                return out.detach().numpy()
            from keras import ops

            return ops.convert_to_numpy(out)
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
    ("layer_norm", lambda: _ln(ddof=1, eps_outside=True), "unbiased standard deviation"),
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


def _ffn(kind):
    def feed_forward(x, w1, b1, w2, b2):
        hidden = x @ w1 + (0 if kind == "no_b1" else b1)
        if kind == "relu_before_bias":
            hidden = np.maximum(0, x @ w1) + b1
        elif kind != "no_relu":
            hidden = np.maximum(0, hidden)
        out = hidden @ w2 + (0 if kind == "no_b2" else b2)
        if kind == "relu_out":
            out = np.maximum(0, out)
        if kind == "list":
            return out.tolist()
        return out

    return feed_forward


def _ln_torch(dim=-1, unbiased=False, detach=False, eps_outside=False, as_numpy=False):
    import torch

    def layer_norm_torch(x, gamma, beta, eps=1e-5):
        source = x.detach() if detach else x
        mean = source.mean(dim=dim, keepdim=True)
        var = source.var(dim=dim, keepdim=True, unbiased=unbiased)
        scale = var.sqrt() + eps if eps_outside else torch.sqrt(var + eps)
        out = gamma * (source - mean) / scale + beta
        return out.detach().numpy() if as_numpy else out

    return layer_norm_torch


def _ln_keras(axis=-1, unbiased=False, as_numpy=False):
    from keras import ops

    def layer_norm_keras(x, gamma, beta, eps=1e-5):
        mean = ops.mean(x, axis=axis, keepdims=True)
        var = ops.var(x, axis=axis, keepdims=True)
        if unbiased:
            n = x.shape[axis]
            var = var * n / (n - 1)
        out = gamma * (x - mean) / ops.sqrt(var + eps) + beta
        return ops.convert_to_numpy(out) if as_numpy else out

    return layer_norm_keras


def _ln_grad(kind):
    def layer_norm_input_grad(x, gamma, upstream, eps=1e-5):
        mean = x.mean(-1, keepdims=True)
        inv_std = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
        x_hat = (x - mean) * inv_std
        g = upstream if kind == "no_gamma" else upstream * gamma
        if kind == "constant_stats":
            return g * inv_std
        if kind == "no_variance_term":
            return inv_std * (g - g.mean(-1, keepdims=True))
        if kind == "no_mean_term":
            return inv_std * (g - x_hat * (g * x_hat).mean(-1, keepdims=True))
        if kind == "list":
            return (inv_std * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))).tolist()
        return inv_std * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))

    return layer_norm_input_grad


CH06_MISTAKES += [
    ("feed_forward", lambda: _ffn("no_relu"), "ReLU is missing"),
    ("feed_forward", lambda: _ffn("relu_before_bias"), "ReLU went before the bias"),
    ("feed_forward", lambda: _ffn("relu_out"), "output too"),
    ("feed_forward", lambda: _ffn("no_b2"), "b2 is missing"),
    ("feed_forward", lambda: _ffn("list"), "NumPy array"),
    ("layer_norm_torch", lambda: _ln_torch(dim=1), "still taken over axis 1"),
    ("layer_norm_torch", lambda: _ln_torch(dim=0), "batch axis"),
    ("layer_norm_torch", lambda: _ln_torch(unbiased=True), "unbiased"),
    ("layer_norm_torch", lambda: _ln_torch(eps_outside=True), "outside the square root"),
    ("layer_norm_torch", lambda: _ln_torch(detach=True), "no gradient"),
    ("layer_norm_keras", lambda: _ln_keras(axis=1), "still taken over axis 1"),
    ("layer_norm_keras", lambda: _ln_keras(unbiased=True), "unbiased"),
    ("layer_norm_keras", lambda: _ln_keras(as_numpy=True), "Keras tensor"),
    ("layer_norm_input_grad", lambda: _ln_grad("constant_stats"), "constants"),
    ("layer_norm_input_grad", lambda: _ln_grad("no_variance_term"), "variance's dependence"),
    ("layer_norm_input_grad", lambda: _ln_grad("no_mean_term"), "mean's dependence"),
    ("layer_norm_input_grad", lambda: _ln_grad("no_gamma"), "gamma is missing"),
    ("dropout_hit_fraction", _hits("sum"), "adds the probabilities"),
    ("dropout_hit_fraction", _hits("survives"), "survives every block"),
    ("dropout_hit_fraction", _hits("one"), "one block"),
    ("dropout_hit_fraction", _hits("text"), "is a float; got str"),
    ("dropout_hit_fraction", _hits("constant"), "differs|should be"),
]


def _pe_as_list(max_len, d_model):
    return _pe_right(max_len, d_model).tolist()


def _count_as_float(d_model, d_ff, num_heads):
    return float(_count()(d_model, d_ff, num_heads))


# The mistake classes of the catalogue (companion.instructor.synthetic.mistake_classes counts them).
NEW_TYPES = [
    ("encoder_input_torch", lambda: _torch_input(as_numpy=True), "should be a torch.Tensor; got ndarray"),
    ("encoder_input_keras", lambda: _keras_input(as_numpy=True), "should be a Keras tensor"),
    ("offset_similarity", lambda: _offset_similarity("list"), "should be a NumPy array; got list"),
    ("pre_ln_sublayer_torch", lambda: _pre_ln("numpy", "torch"), "residual path must stay in the graph.*NumPy"),
    ("pre_ln_sublayer_keras", lambda: _pre_ln("numpy", "keras"), "residual path must stay in the graph.*NumPy"),
    ("layer_norm_torch", lambda: _ln_torch(as_numpy=True), "no gradient.*no NumPy round trip"),
    ("layer_norm_input_grad", lambda: _ln_grad("list"), "should be a NumPy array; got list"),
    ("positional_encoding", lambda: _pe_as_list, "the text says: a NumPy array\\) should be a NumPy array; got list"),
    ("encoder_layer_parameters", lambda: _count_as_float, "\\(as an int\\) is an int; got float"),
    ("dropout_hit_fraction", _hits("int when nothing drops"), "\\(as a float\\) is a float; got int"),
]
STATED_TYPES = NEW_TYPES + [case for case in CH05_MISTAKES + CH06_MISTAKES if (case[0], case[2]) in {
    ("angular_frequencies", "NumPy array"), ("add_positions_torch", "keep the dtype"),
    ("add_positions_keras", "Keras tensor"), ("learned_table_outcome", "one of the strings"),
    ("feed_forward", "NumPy array"), ("layer_norm_keras", "Keras tensor")}]
MISTAKE_CLASSES = {"a type the text states": STATED_TYPES}


@pytest.mark.parametrize(
    "exercise_id, make_wrong, message",
    CH05_MISTAKES + CH06_MISTAKES + NEW_TYPES,
    ids=[f"{e}-{m}" for e, _, m in CH05_MISTAKES + CH06_MISTAKES + NEW_TYPES],
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
    with pytest.raises(CheckFailed, match="is an int; got float"):
        run_check("encoder_layer_parameters", lambda d, f, h: float(_count()(d, f, h)))


def test_hard_coded_answers_fail():
    table = _pe_right(10, 4)
    with pytest.raises(CheckFailed):
        run_check("positional_encoding", lambda max_len, d_model: table)
    with pytest.raises(CheckFailed):
        run_check("encoder_layer_parameters", lambda d, f, h: 3152384)


FIND_THE_BUG = {"05_positional_encoding": ("add_positions_torch", "add_positions_keras", "the colleague's bug"),
                "06_add_and_norm": ("layer_norm_torch", "layer_norm_keras", "the original bug")}


@pytest.mark.parametrize("chapter", sorted(FIND_THE_BUG))
def test_find_the_bug_stubs_run_and_their_bug_is_named(chapter):
    from pathlib import Path

    from companion.notebook_code import load_definitions

    *ids, message = FIND_THE_BUG[chapter]
    root = Path(__file__).resolve().parents[1]
    stubs = load_definitions(root / "exercises" / f"{chapter}.md")
    answers = load_definitions(root / "solutions" / f"{chapter}.md")
    for exercise_id in ids:
        run_check(exercise_id, answers[exercise_id])
        with pytest.raises(CheckFailed, match=message):
            run_check(exercise_id, stubs[exercise_id])
