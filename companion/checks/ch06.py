"""Checks for chapter 6, "Add & Norm and the feed-forward sublayer"."""

from __future__ import annotations

import numpy as np

from companion.checks import CheckFailed, _short, call, exercise, expect_close, expect_equal, rng, to_numpy
from companion.checks.tracks import LAYER_NORM_SHORTCUTS, expect_type, keras_gradients, torch_gradients
from companion.reference.addnorm import layer_norm as reference_layer_norm

CHAPTER = "06_add_and_norm"


def _normalised(x: np.ndarray, axis, ddof: int = 0, eps: float = 1e-5, eps_outside: bool = False) -> np.ndarray:
    centred = x - x.mean(axis=axis, keepdims=True)
    std = x.std(axis=axis, ddof=ddof, keepdims=True)
    return centred / (std + eps) if eps_outside else centred / np.sqrt(std**2 + eps)


def _layer_norm_mistakes(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> dict[str, np.ndarray]:
    last = -1
    return {
        "the variance is the unbiased one (divided by d_model - 1); LayerNorm divides by d_model": gamma
        * _normalised(x, last, ddof=1, eps=eps)
        + beta,
        "epsilon is added outside the square root (to the standard deviation); add it to the variance: "
        "sqrt(var + eps)": gamma * _normalised(x, last, eps=eps, eps_outside=True) + beta,
        "unbiased standard deviation plus epsilon outside the root, as in seed 003; use sqrt(biased var + eps)": gamma
        * _normalised(x, last, ddof=1, eps=eps, eps_outside=True)
        + beta,
        "epsilon is missing: divide by sqrt(var + eps)": gamma * _normalised(x, last, eps=0.0) + beta,
        "the statistics were taken over the first (batch) axis, which is BatchNorm; LayerNorm takes them over the "
        "last axis, the d_model features of one position": gamma * _normalised(x, 0, eps=eps) + beta,
        "the statistics were taken over the whole sequence (positions and features); take them over the last axis "
        "only": gamma * _normalised(x, (-2, -1), eps=eps) + beta,
        "gamma and beta are swapped: scale by gamma, then shift by beta": beta * _normalised(x, last, eps=eps) + gamma,
        "gamma and beta are not applied: multiply by gamma and add beta after normalising": _normalised(
            x, last, eps=eps
        ),
    }


@exercise(CHAPTER, "layer_norm", "LayerNorm over the last axis: biased variance, epsilon inside the square root",
          shortcuts=LAYER_NORM_SHORTCUTS)
def check_layer_norm(layer_norm) -> None:
    generator = rng(7)
    # Small spreads make epsilon matter; small widths make the biased/unbiased difference visible.
    # The cases with a small spread come first, so that each mistake is told apart from the others.
    cases = [((4, 6), 0.05, 1e-2), ((3, 5, 4), 0.1, 1e-2), ((2, 4, 16), 0.01, None), ((2, 3, 8), 1.0, None)]
    for shape, scale, eps in cases:
        x = generator.standard_normal(shape) * scale + generator.standard_normal()
        gamma, beta = generator.standard_normal(shape[-1]), generator.standard_normal(shape[-1])
        args = (x.copy(), gamma.copy(), beta.copy())
        answer = call(layer_norm, *args) if eps is None else call(layer_norm, *args, eps=eps)
        used_eps = 1e-5 if eps is None else eps
        expect_close(
            answer,
            reference_layer_norm(x, gamma, beta, eps=used_eps),
            f"layer_norm(x of shape {shape}{'' if eps is None else f', eps={eps}'})",
            mistakes={
                **_layer_norm_mistakes(x, gamma, beta, used_eps),
                **(
                    {}
                    if eps is not None
                    else {
                        f"the default epsilon should be 1e-5, as in torch.nn.LayerNorm (yours acts like {wrong})": (
                            reference_layer_norm(x, gamma, beta, eps=wrong)
                        )
                        for wrong in (1e-6, 1e-3)
                    }
                ),
            },
            atol=1e-5,
        )


def _np_sublayer(weight: np.ndarray, bias: np.ndarray):
    return lambda h: np.tanh(h @ weight + bias)


def _pre_ln_cases():
    generator = rng(8)
    for batch, seq_len, d_model in [(2, 5, 8), (1, 3, 4), (3, 7, 16)]:
        x = generator.standard_normal((batch, seq_len, d_model)) * 2 + 0.5
        gamma, beta = generator.standard_normal(d_model) + 1, generator.standard_normal(d_model)
        weight, bias = generator.standard_normal((d_model, d_model)) / np.sqrt(d_model), generator.standard_normal(
            d_model
        )
        yield x, gamma, beta, weight, bias


def _check_pre_ln(pre_ln_sublayer, build, name: str) -> None:
    """``build(x, gamma, beta, weight, bias)`` -> the framework's (x, sublayer, norm)."""
    for x, gamma, beta, weight, bias in _pre_ln_cases():
        sub = _np_sublayer(weight, bias)

        def norm(h, gamma=gamma, beta=beta):
            return reference_layer_norm(h, gamma, beta)

        answer = call(pre_ln_sublayer, *build(x, gamma, beta, weight, bias))
        expect_close(
            answer,
            x + sub(norm(x)),
            f"{name}(x of shape {x.shape}, sublayer, norm)",
            mistakes={
                "this is post-LN, the paper's order: LayerNorm(x + sublayer(x)); pre-LN normalises the sublayer's "
                "input only: x + sublayer(norm(x))": norm(x + sub(x)),
                "the normalisation went on the sublayer's output; apply it to the sublayer's input: "
                "x + sublayer(norm(x))": x + norm(sub(x)),
                "the residual connection is missing: add x to the sublayer's output": sub(norm(x)),
                "the residual adds the normalised x; add the original x, so that the residual path stays "
                "un-normalised": norm(x) + sub(norm(x)),
                "the normalisation is missing: x + sublayer(norm(x))": x + sub(x),
            },
            atol=1e-4,
        )


def _check_residual_gradient(pre_ln_sublayer, x, zero_sublayer, norm, track: str, name: str) -> None:
    """The residual path carries the upstream gradient to x unchanged: with a sublayer that outputs zeros, the
    gradient of x is the upstream gradient itself (zero or missing when the residual is detached)."""
    upstream = np.random.default_rng(9).standard_normal(tuple(x.shape)).astype(to_numpy(x).dtype)
    result, grads, why = call(torch_gradients if track == "torch" else keras_gradients, pre_ln_sublayer,
                              (x, zero_sublayer, norm), upstream)
    expect_type(result, track, f"the result of {name}", "float")
    graph = "no .detach(), no torch.no_grad()" if track == "torch" else "no keras.ops.stop_gradient"
    if grads[0] is None or not np.allclose(to_numpy(grads[0]), upstream, atol=1e-4):
        raise CheckFailed(f"x receives {'no' if grads[0] is None else 'the wrong'} gradient from {name}(x, sublayer, "
                          f"norm): the residual path must stay in the graph ({graph}, no NumPy round trip)"
                          + (f"; {why}" if why else ""))


@exercise(CHAPTER, "pre_ln_sublayer_torch", "pre-LN residual: x + sublayer(norm(x)), in PyTorch", track="torch")
def check_pre_ln_sublayer_torch(pre_ln_sublayer_torch) -> None:
    import torch

    def build(x, gamma, beta, weight, bias):
        norm = torch.nn.LayerNorm(x.shape[-1], eps=1e-5).double()
        with torch.no_grad():
            norm.weight.copy_(torch.as_tensor(gamma))
            norm.bias.copy_(torch.as_tensor(beta))
        w, b = torch.as_tensor(weight), torch.as_tensor(bias)
        return torch.as_tensor(x), (lambda h: torch.tanh(h @ w + b)), norm

    with torch.no_grad():
        _check_pre_ln(pre_ln_sublayer_torch, build, "pre_ln_sublayer_torch")
    x, gamma, beta, weight, bias = next(iter(_pre_ln_cases()))
    x_tensor, _, norm = build(x, gamma, beta, weight, bias)
    _check_residual_gradient(pre_ln_sublayer_torch, x_tensor, torch.zeros_like, norm, "torch", "pre_ln_sublayer_torch")


@exercise(CHAPTER, "pre_ln_sublayer_keras", "pre-LN residual: x + sublayer(norm(x)), in Keras", track="keras")
def check_pre_ln_sublayer_keras(pre_ln_sublayer_keras) -> None:
    import keras
    from keras import ops

    def build(x, gamma, beta, weight, bias):
        x32 = x.astype(np.float32)
        norm = keras.layers.LayerNormalization(epsilon=1e-5)
        norm.build(x32.shape)
        norm.gamma.assign(gamma.astype(np.float32))
        norm.beta.assign(beta.astype(np.float32))
        w, b = ops.convert_to_tensor(weight.astype(np.float32)), ops.convert_to_tensor(bias.astype(np.float32))
        return ops.convert_to_tensor(x32), (lambda h: ops.tanh(ops.matmul(h, w) + b)), norm

    _check_pre_ln(pre_ln_sublayer_keras, build, "pre_ln_sublayer_keras")
    x, gamma, beta, weight, bias = next(iter(_pre_ln_cases()))
    x_tensor, _, norm = build(x, gamma, beta, weight, bias)
    _check_residual_gradient(pre_ln_sublayer_keras, x_tensor, ops.zeros_like, norm, "keras", "pre_ln_sublayer_keras")


def _encoder_layer_count(d_model: int, num_heads: int, d_ff: int) -> int:
    """Count the parameters of the companion's torch EncoderLayer (the ground truth, not a formula)."""
    from companion.torch import EncoderLayer

    return sum(p.numel() for p in EncoderLayer(d_model, num_heads, d_ff).parameters())


@exercise(CHAPTER, "encoder_layer_parameters", "parameters of one encoder layer as a function of d_model, d_ff, heads")
def check_encoder_layer_parameters(encoder_layer_parameters) -> None:
    for d_model, d_ff, num_heads in [(512, 2048, 8), (64, 256, 4), (32, 100, 2), (48, 96, 16), (8, 8, 1)]:
        answer = call(encoder_layer_parameters, d_model, d_ff, num_heads)
        if isinstance(answer, bool) or not isinstance(answer, int | np.integer):
            raise CheckFailed(f"encoder_layer_parameters should return a whole number (an int); got "
                              f"{type(answer).__name__} {_short(answer)}")
        d, h, f = d_model, num_heads, d_ff
        attention, ffn, norms = 4 * d * d + 4 * d, 2 * d * f + f + d, 4 * d
        expect_equal(
            int(to_numpy(answer).item()),
            _encoder_layer_count(d_model, num_heads, d_ff),
            f"encoder_layer_parameters(d_model={d}, d_ff={f}, num_heads={h})",
            mistakes={
                "the biases are missing: every Linear / Dense layer has one per output": 4 * d * d + 2 * d * f + norms,
                "the two LayerNorms are missing: each has gamma and beta, d_model numbers each": attention + ffn,
                "the LayerNorms count 2 * d_model in total; there are two of them, each with gamma and beta "
                "(4 * d_model)": attention + ffn + 2 * d,
                "the attention count grew with num_heads; the heads split d_model, so the four projections are "
                "d_model x d_model in total whatever the number of heads": h * attention + ffn + norms,
                "the projections were counted as d_model x d_head; the heads sit side by side, so each projection is "
                "d_model x d_model": 4 * d * (d // h) + 4 * (d // h) + ffn + norms,
                "the output projection W_O is missing from the attention (4 projections: wq, wk, wv, wo)": 3 * d * d
                + 3 * d
                + ffn
                + norms,
                "the feed-forward biases are off: b1 has d_ff entries and b2 has d_model": attention
                + 2 * d * f
                + 2 * d
                + norms,
            },
        )
