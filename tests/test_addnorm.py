"""Feed-forward network and Add & Norm: PyTorch = Keras = NumPy, post-LN vs pre-LN, LayerNorm's epsilon."""

import numpy as np
import pytest
import torch

from companion.convert import copy_weights
from companion.keras import AddNorm as KerasAddNorm
from companion.keras import PositionwiseFeedForward as KerasFFN
from companion.reference import add_norm, feed_forward, layer_norm
from companion.reference.model import feed_forward_params, norm_params
from companion.torch import AddNorm as TorchAddNorm
from companion.torch import PositionwiseFeedForward as TorchFFN

D_MODEL, D_FF = 8, 16
ATOL = 1e-5


def as_numpy(x) -> np.ndarray:
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def random_x(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def ffn_triplet(seed: int = 0):
    """A torch FFN, its Keras twin with the same weights, and those weights for the oracle."""
    torch.manual_seed(seed)
    torch_ffn = TorchFFN(D_MODEL, D_FF)
    keras_ffn = KerasFFN(D_MODEL, D_FF)
    keras_ffn.build((None, None, D_MODEL))
    copy_weights(torch_ffn, keras_ffn)
    return torch_ffn, keras_ffn, feed_forward_params(torch_ffn)


def randomize_norm(norm: torch.nn.LayerNorm, seed: int) -> None:
    """Non-trivial gamma and beta, so a test cannot pass with the default ones by accident."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(norm.weight.shape, generator=generator))
        norm.bias.copy_(0.5 * torch.randn(norm.bias.shape, generator=generator))


def test_ffn_frameworks_match_reference():
    torch_ffn, keras_ffn, params = ffn_triplet()
    x = random_x(2, 5, D_MODEL)
    expected = feed_forward(x.astype(np.float64), params)
    np.testing.assert_allclose(torch_ffn(torch.from_numpy(x)).detach().numpy(), expected, atol=ATOL)
    np.testing.assert_allclose(np.asarray(keras_ffn(x)), expected, atol=ATOL)


def test_ffn_acts_on_each_position_separately():
    torch_ffn, _, _ = ffn_triplet()
    x = torch.from_numpy(random_x(1, 6, D_MODEL))
    order = torch.tensor([3, 0, 5, 1, 4, 2])
    torch.testing.assert_close(torch_ffn(x[:, order]), torch_ffn(x)[:, order])
    # Position 0 alone gives the same output as inside the sequence.
    torch.testing.assert_close(torch_ffn(x[:, :1]), torch_ffn(x)[:, :1])


def test_ffn_attribute_names_and_sizes():
    ffn = TorchFFN(D_MODEL, D_FF)
    assert (ffn.linear1.in_features, ffn.linear1.out_features) == (D_MODEL, D_FF)
    assert (ffn.linear2.in_features, ffn.linear2.out_features) == (D_FF, D_MODEL)
    keras_ffn = KerasFFN(D_MODEL, D_FF)
    keras_ffn.build((None, 3, D_MODEL))
    assert tuple(keras_ffn.linear1.kernel.shape) == (D_MODEL, D_FF)
    assert tuple(keras_ffn.linear2.kernel.shape) == (D_FF, D_MODEL)


def test_layer_norm_reference_matches_torch():
    norm = torch.nn.LayerNorm(D_MODEL)
    randomize_norm(norm, seed=1)
    x = random_x(3, 4, D_MODEL) * 5 + 2
    params = norm_params(norm)
    expected = layer_norm(x.astype(np.float64), params["gamma"], params["beta"])
    np.testing.assert_allclose(norm(torch.from_numpy(x)).detach().numpy(), expected, atol=ATOL)


def test_both_frameworks_use_epsilon_1e_5():
    # Keras' LayerNormalization defaults to 1e-3; on small-variance inputs that changes the output visibly.
    assert TorchAddNorm(D_MODEL).norm.eps == 1e-5
    assert KerasAddNorm(D_MODEL).norm.epsilon == 1e-5


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_addnorm_frameworks_match_reference(norm_first):
    torch_ffn, keras_ffn, ffn_params = ffn_triplet()
    torch_addnorm = TorchAddNorm(D_MODEL, norm_first=norm_first)
    randomize_norm(torch_addnorm.norm, seed=2)
    keras_addnorm = KerasAddNorm(D_MODEL, norm_first=norm_first)
    keras_addnorm.build((None, None, D_MODEL))
    copy_weights(torch_addnorm, keras_addnorm)

    # Small-variance inputs make the epsilon matter, so a wrong epsilon fails this test.
    x = random_x(2, 5, D_MODEL) * 0.01
    expected = add_norm(
        x.astype(np.float64),
        lambda h: feed_forward(h, ffn_params),
        **norm_params(torch_addnorm.norm),
        norm_first=norm_first,
    )
    out_torch = torch_addnorm(torch.from_numpy(x), sublayer=torch_ffn).detach().numpy()
    out_keras = np.asarray(keras_addnorm(x, sublayer=keras_ffn))
    np.testing.assert_allclose(out_torch, expected, atol=ATOL)
    np.testing.assert_allclose(out_keras, expected, atol=ATOL)


@pytest.mark.parametrize("make", [TorchAddNorm, KerasAddNorm], ids=["torch", "keras"])
def test_post_ln_normalizes_the_sum_and_pre_ln_keeps_the_residual(make):
    x = random_x(2, 4, D_MODEL) * 3 + 1
    zero = lambda h: h * 0  # noqa: E731 - a sublayer that contributes nothing
    inputs = torch.from_numpy(x) if make is TorchAddNorm else x

    post = as_numpy(make(D_MODEL, norm_first=False)(inputs, sublayer=zero))
    # gamma = 1, beta = 0: every position comes out with mean 0 and variance 1 (up to epsilon).
    np.testing.assert_allclose(post.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(post.var(-1), 1, atol=1e-3)

    pre = as_numpy(make(D_MODEL, norm_first=True)(inputs, sublayer=zero))
    np.testing.assert_allclose(pre, x, atol=1e-6)  # the residual path is untouched by the norm


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_dropout_hits_the_sublayer_not_the_residual(framework):
    x = random_x(2, 50, D_MODEL)
    zero = lambda h: h * 0  # noqa: E731
    if framework == "torch":
        layer = TorchAddNorm(D_MODEL, dropout=0.5, norm_first=True).train()
        out = layer(torch.from_numpy(x), sublayer=lambda h: h).detach().numpy()
        unchanged = layer(torch.from_numpy(x), sublayer=zero).detach().numpy()
    else:
        layer = KerasAddNorm(D_MODEL, dropout=0.5, norm_first=True)
        out = np.asarray(layer(x, sublayer=lambda h: h, training=True))
        unchanged = np.asarray(layer(x, sublayer=zero, training=True))
    np.testing.assert_allclose(unchanged, x, atol=1e-6)
    assert not np.allclose(out, x), "dropout in training should change the sublayer's contribution"


def test_keras_config_round_trips():
    addnorm = KerasAddNorm(6, dropout=0.3, norm_first=True, name="an")
    clone = KerasAddNorm.from_config(addnorm.get_config())
    assert (clone.d_model, clone.dropout.rate, clone.norm_first, clone.norm.epsilon) == (6, 0.3, True, 1e-5)
    ffn = KerasFFN(6, 10, dropout=0.1)
    clone = KerasFFN.from_config(ffn.get_config())
    assert (clone.d_model, clone.d_ff, clone.dropout.rate) == (6, 10, 0.1)
