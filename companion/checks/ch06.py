"""Checks for chapter 6, "Add & Norm and the feed-forward sublayer"."""

from __future__ import annotations

import numpy as np

from companion.checks import CheckFailed, call, exercise, expect_close, expect_equal, rng, to_numpy
from companion.checks.tracks import (
    LAYER_NORM_SHORTCUTS,
    expect_answer_type,
    expect_type,
    keras_gradients,
    torch_gradients,
)
from companion.reference.addnorm import layer_norm as reference_layer_norm

CHAPTER = "06_add_and_norm"


def _normalised(x: np.ndarray, axis, ddof: int = 0, eps: float = 1e-5, eps_outside: bool = False) -> np.ndarray:
    centred = x - x.mean(axis=axis, keepdims=True)
    std = x.std(axis=axis, ddof=ddof, keepdims=True)
    return centred / (std + eps) if eps_outside else centred / np.sqrt(std**2 + eps)


def _layer_norm_mistakes(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> dict[str, np.ndarray]:
    last = -1
    return {
        "the text says: the biased variance (divide by d_model); yours is the unbiased one (divided by "
        "d_model - 1)": gamma * _normalised(x, last, ddof=1, eps=eps) + beta,
        "the text says: add eps to the variance inside the square root, sqrt(var + eps); in yours epsilon is added "
        "outside the square root (to the standard deviation)": gamma
        * _normalised(x, last, eps=eps, eps_outside=True)
        + beta,
        "the text says: the biased variance, eps inside the square root; yours has the unbiased standard deviation "
        "plus epsilon outside the root, as some tutorials write it": gamma
        * _normalised(x, last, ddof=1, eps=eps, eps_outside=True)
        + beta,
        "the text says: divide by sqrt(var + eps); in yours epsilon is missing": gamma * _normalised(
            x, last, eps=0.0
        ) + beta,
        "the text says: normalise every vector along the last axis (the d_model features of one position); yours "
        "took the statistics over the first (batch) axis, which is BatchNorm": gamma * _normalised(x, 0, eps=eps)
        + beta,
        "the text says: normalise every vector along the last axis only; yours took the statistics over the whole "
        "sequence (positions and features)": gamma * _normalised(x, (-2, -1), eps=eps) + beta,
        "the text says: scale by gamma, then shift by beta; in yours gamma and beta are swapped": beta
        * _normalised(x, last, eps=eps) + gamma,
        "the text says: then scale by gamma and shift by beta; in yours gamma and beta are not applied": _normalised(
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
                        f"the text says: eps=1e-5 by default, as in torch.nn.LayerNorm; the default epsilon of "
                        f"yours acts like {wrong}": (
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
                "the text says: return the pre-LN version, not the paper's norm(x + sublayer(x)); yours is post-LN "
                "(pre-LN is x + sublayer(norm(x)))": norm(x + sub(x)),
                "the text says: normalise only the input of the sublayer; in yours the normalisation went on the "
                "sublayer's output": x + norm(sub(x)),
                "the text says: add the original x to the sublayer's output; in yours the residual connection is "
                "missing": sub(norm(x)),
                "the text says: add the original, un-normalised x; yours adds the normalised x": norm(x)
                + sub(norm(x)),
                "the text says: normalise the input of the sublayer; in yours the normalisation is missing": x
                + sub(x),
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
        raise CheckFailed(f"the text says: gradients flow back to x along the residual path; x receives "
                          f"{'no' if grads[0] is None else 'the wrong'} gradient from {name}(x, sublayer, norm): the "
                          f"residual path must stay in the graph ({graph}, no NumPy round trip)"
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
        expect_answer_type(answer, "int", f"encoder_layer_parameters({d_model}, {d_ff}, {num_heads}) (as an int)")
        d, h, f = d_model, num_heads, d_ff
        attention, ffn, norms = 4 * d * d + 4 * d, 2 * d * f + f + d, 4 * d
        expect_equal(
            int(to_numpy(answer).item()),
            _encoder_layer_count(d_model, num_heads, d_ff),
            f"encoder_layer_parameters(d_model={d}, d_ff={f}, num_heads={h})",
            mistakes={
                "the text says: the projections and linear1, linear2 have biases; in yours the biases are missing "
                "(every Linear / Dense layer has one per output)": 4 * d * d + 2 * d * f + norms,
                "the text says: the two LayerNorms of the two Add & Norm steps count too; in yours the two "
                "LayerNorms are missing (each has gamma and beta, d_model numbers each)": attention + ffn,
                "the text says: the TWO LayerNorms of the two Add & Norm steps; yours counts 2 * d_model in total, "
                "but there are two of them, each with gamma and beta (4 * d_model)": attention + ffn + 2 * d,
                "the text says: the four projections wq, wk, wv, wo; in yours the attention count grew with "
                "num_heads, but the heads split d_model, so the four are d_model x d_model whatever the number of "
                "heads": h * attention + ffn + norms,
                "the text says: the four projections wq, wk, wv, wo; yours counted them as d_model x d_head, but the "
                "heads sit side by side, so each is d_model x d_model": 4 * d * (d // h) + 4 * (d // h) + ffn
                + norms,
                "the text says: the four projections wq, wk, wv, wo; in yours the output projection W_O is "
                "missing": 3 * d * d
                + 3 * d
                + ffn
                + norms,
                "the text says: linear1, linear2 with biases; in yours the feed-forward biases are off (b1 has d_ff "
                "entries and b2 has d_model)": attention
                + 2 * d * f
                + 2 * d
                + norms,
            },
        )


# ---------------------------------------------------------------------------------------------------------------
# Warm-up, find-the-bug, stretch and graded prediction
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "feed_forward", "max(0, x W1 + b1) W2 + b2 at every position, in NumPy",
          shortcuts=("torch.nn.Linear", "keras.layers.Dense"))
def check_feed_forward(feed_forward) -> None:
    generator = rng(61)
    for shape, d_ff in [((2, 5, 4), 16), ((3, 8), 6), ((1, 1, 6), 3), ((2, 3, 7, 8), 32)]:
        d_model = shape[-1]
        x = generator.standard_normal(shape)
        w1, b1 = generator.standard_normal((d_model, d_ff)), generator.standard_normal(d_ff)
        w2, b2 = generator.standard_normal((d_ff, d_model)), generator.standard_normal(d_model)
        answer = call(feed_forward, x.copy(), w1.copy(), b1.copy(), w2.copy(), b2.copy())
        hidden = x @ w1 + b1
        expect_close(
            answer,
            np.maximum(0, hidden) @ w2 + b2,
            f"feed_forward(x of shape {shape}, w1 of shape {w1.shape}, ...)",
            mistakes={
                "the text says: max(0, x W1 + b1) W2 + b2; in yours the ReLU is missing": hidden @ w2 + b2,
                "the text says: max(0, x W1 + b1), the bias inside; in yours the ReLU went before the bias": (
                    np.maximum(0, x @ w1) @ w2 + b1 @ w2 + b2
                ),
                "the text says: max(0, x W1 + b1) W2 + b2, a ReLU on the hidden layer only; yours applied one to "
                "the output too": np.maximum(0, np.maximum(0, hidden) @ w2 + b2),
                "the text says: ... W2 + b2; in yours the second bias b2 is missing": np.maximum(0, hidden) @ w2,
                "the text says: max(0, x W1 + b1); in yours the first bias b1 is missing": np.maximum(0, x @ w1) @ w2
                + b2,
            },
            atol=1e-8,
        )
        expect_type(answer, "numpy", "the result of feed_forward", "float")


def _check_layer_norm_framework(layer_norm_fw, track: str) -> None:
    """Find-the-bug of exercise 5: LayerNorm over the last axis (the bug normalises over the sequence axis)."""
    from companion.checks.tracks import converter, tolerance

    generator = rng(62)
    name = f"layer_norm_{track}"
    for (batch, seq_len, d_model), eps in [((2, 5, 8), None), ((3, 1, 4), None), ((1, 6, 16), 1e-3),
                                           ((4, 7, 6), None)]:
        x = (generator.standard_normal((batch, seq_len, d_model)) * 2 + 0.3).astype(np.float32)
        gamma = (generator.standard_normal(d_model) + 1).astype(np.float32)
        beta = generator.standard_normal(d_model).astype(np.float32)
        used = 1e-5 if eps is None else eps
        x64, g64, b64 = x.astype(np.float64), gamma.astype(np.float64), beta.astype(np.float64)
        args = converter(track)(x, gamma, beta)
        answer = call(layer_norm_fw, *args) if eps is None else call(layer_norm_fw, *args, eps=eps)
        expect_close(
            answer,
            reference_layer_norm(x64, g64, b64, eps=used),
            f"{name}(x of shape {x.shape}{'' if eps is None else f', eps={eps}'})",
            mistakes={
                "the text says: normalise the d_model numbers of every position (the last axis); in yours the "
                "statistics are still taken over axis 1, the sequence (the original bug)": g64
                * _normalised(x64, 1, eps=used) + b64,
                "the text says: normalise the d_model numbers of every position (the last axis); yours took the "
                "statistics over the batch axis": g64 * _normalised(x64, 0, eps=used) + b64,
                "the text says: biased variance; yours is the unbiased one (torch.var's default)": g64
                * _normalised(x64, -1, ddof=1, eps=used) + b64,
                "the text says: eps added to the variance inside the square root; in yours epsilon is added outside "
                "the square root": g64 * _normalised(x64, -1, eps=used, eps_outside=True) + b64,
            },
            **tolerance(track),
        )
        expect_type(answer, track, f"the result of {name}", "float")
    if track == "torch":
        x_tensor, gamma_tensor, beta_tensor = converter("torch")(x, gamma, beta)
        upstream = generator.standard_normal(x.shape).astype(np.float32)
        result, grads, why = torch_gradients(layer_norm_fw, (x_tensor, gamma_tensor, beta_tensor), upstream)
        if grads[0] is None or not np.abs(to_numpy(grads[0])).sum() > 0:
            raise CheckFailed(f"the text says: let gradients reach x; x receives no gradient from {name} (no "
                              ".detach(), no torch.no_grad(), no NumPy round trip)" + (f"; {why}" if why else ""))


@exercise(CHAPTER, "layer_norm_torch", "find the bug: LayerNorm by hand over the right axis, in PyTorch",
          track="torch", shortcuts=LAYER_NORM_SHORTCUTS)
def check_layer_norm_torch(layer_norm_torch) -> None:
    _check_layer_norm_framework(layer_norm_torch, "torch")


@exercise(CHAPTER, "layer_norm_keras", "find the bug: LayerNorm by hand over the right axis, in Keras",
          track="keras", shortcuts=LAYER_NORM_SHORTCUTS)
def check_layer_norm_keras(layer_norm_keras) -> None:
    _check_layer_norm_framework(layer_norm_keras, "keras")


@exercise(CHAPTER, "layer_norm_input_grad", "dL/dx through LayerNorm (biased variance, eps inside), in NumPy",
          shortcuts=("torch.autograd.grad", "torch.Tensor.backward", "torch.func.vjp", "torch.func.grad"))
def check_layer_norm_input_grad(layer_norm_input_grad) -> None:
    import torch

    generator = rng(63)
    for shape, eps in [((2, 3, 8), None), ((4, 5), 1e-2), ((1, 1, 16), None), ((3, 2, 4), 1e-3)]:
        x = generator.standard_normal(shape) * 0.5 + 1.0
        gamma = generator.standard_normal(shape[-1]) + 1
        upstream = generator.standard_normal(shape)
        used = 1e-5 if eps is None else eps
        args = (x.copy(), gamma.copy(), upstream.copy())
        answer = call(layer_norm_input_grad, *args) if eps is None else call(layer_norm_input_grad, *args, eps=eps)
        # The ground truth: PyTorch's autograd through the reference formula, in float64 (trusted process).
        xt = torch.tensor(x, requires_grad=True)
        y = torch.nn.functional.layer_norm(xt, (shape[-1],), torch.tensor(gamma), None, eps=used)
        (grad,) = torch.autograd.grad(y, xt, torch.tensor(upstream))
        mean = x.mean(-1, keepdims=True)
        inv_std = 1 / np.sqrt(x.var(-1, keepdims=True) + used)
        x_hat = (x - mean) * inv_std
        g = upstream * gamma
        expect_close(
            answer,
            grad.numpy(),
            f"layer_norm_input_grad(x of shape {shape}{'' if eps is None else f', eps={eps}'})",
            mistakes={
                "the text says: the result is (g - mean(g) - x_hat mean(g x_hat)) / sqrt(var + eps); yours treats "
                "the mean and variance as constants (gamma * upstream / std), but they depend on x too": g * inv_std,
                "the text says: ... - x_hat mean(g x_hat); in yours that term (the variance's dependence on x) is "
                "missing": inv_std * (g - g.mean(-1, keepdims=True)),
                "the text says: g - mean(g) - ...; in yours the term mean(g) (the mean's dependence on x) is "
                "missing": inv_std * (g - x_hat * (g * x_hat).mean(-1, keepdims=True)),
                "the text says: g = gamma * dL/dy; in yours gamma is missing": inv_std
                * (upstream - upstream.mean(-1, keepdims=True) - x_hat * (upstream * x_hat).mean(-1, keepdims=True)),
            },
            atol=1e-7,
            rtol=1e-5,
        )
        expect_type(answer, "numpy", "the result of layer_norm_input_grad", "float")


@exercise(CHAPTER, "dropout_hit_fraction", "predict: the fraction of entries dropped at least once in a deep stack")
def check_dropout_hit_fraction(dropout_hit_fraction) -> None:
    for rate, layers in [(0.1, 6), (0.5, 1), (0.1, 1), (0.3, 12), (0.0, 6), (0.2, 3)]:
        answer = call(dropout_hit_fraction, rate, layers)
        expect_answer_type(answer, "float", f"dropout_hit_fraction(rate={rate}, layers={layers}) (as a float)")
        expected = 1 - (1 - rate) ** layers
        expect_close(
            np.float64(answer),
            np.float64(expected),
            f"dropout_hit_fraction(rate={rate}, layers={layers})",
            mistakes={
                "the text says: each block draws its mask independently; rate * layers adds the probabilities as if "
                "no entry could be dropped twice (an entry survives every block with probability "
                "(1 - rate) ** layers)": np.float64(rate * layers),
                "the text says: the fraction zeroed at least once; this is the fraction that survives every "
                "block": np.float64((1 - rate) ** layers),
                "the text says: on their way through `layers` such blocks; this is the fraction dropped by one "
                "block": np.float64(rate),
                "the text says: zeroed at least once; rate ** layers is the fraction dropped by every block": (
                    np.float64(rate**layers)
                ),
            },
            atol=1e-9,
        )
