"""Sinusoidal positional encoding: the formula, its properties, and PyTorch = Keras = NumPy."""

import math

import numpy as np
import pytest
import torch

from companion import reference
from companion.keras import PositionalEncoding as KerasPositionalEncoding
from companion.keras import sinusoidal_positional_encoding as keras_pe
from companion.torch import PositionalEncoding as TorchPositionalEncoding
from companion.torch import sinusoidal_positional_encoding as torch_pe

TABLES = {"reference": reference.sinusoidal_positional_encoding, "torch": torch_pe, "keras": keras_pe}
LAYERS = {"torch": TorchPositionalEncoding, "keras": KerasPositionalEncoding}


def as_numpy(x) -> np.ndarray:
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def run(framework: str, layer, x: np.ndarray, training: bool = False) -> np.ndarray:
    if framework == "torch":
        layer.train(training)
        return layer(torch.from_numpy(x)).detach().numpy()
    return np.asarray(layer(x, training=training))


def test_reference_follows_the_formula_entry_by_entry():
    max_len, d_model = 7, 6
    pe = reference.sinusoidal_positional_encoding(max_len, d_model)
    assert pe.shape == (max_len, d_model) and pe.dtype == np.float32
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert pe[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-7)
            assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-7)


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_frameworks_match_reference_at_full_size(framework):
    # 512 x 512: late positions are where a float32 angle computation would drift (about 3e-5).
    expected = reference.sinusoidal_positional_encoding(512, 512)
    actual = as_numpy(TABLES[framework](512, 512))
    assert actual.shape == (512, 512) and actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, atol=1e-6)


def test_wavelengths_form_a_geometric_progression_from_2pi_to_10000_2pi():
    # Read each pair's frequency off the table (PE[1, 2i] = sin(w_i), with w_i <= 1) and turn it into a wavelength.
    d_model = 16
    pe = reference.sinusoidal_positional_encoding(2, d_model).astype(np.float64)
    wavelengths = 2 * np.pi / np.arcsin(pe[1, 0::2])
    assert wavelengths[0] == pytest.approx(2 * np.pi)
    assert wavelengths[-1] == pytest.approx(2 * np.pi * 10000 ** ((d_model - 2) / d_model), rel=1e-4)
    np.testing.assert_allclose(wavelengths[1:] / wavelengths[:-1], 10000 ** (2 / d_model), rtol=1e-4)


def test_relative_position_is_a_fixed_rotation_of_each_frequency_pair():
    # For every frequency w, (sin w(p+k), cos w(p+k)) is a rotation of (sin wp, cos wp) by the angle wk, whatever p:
    # the model can attend by relative position with a linear map.
    max_len, d_model, k = 40, 16, 5
    pe = reference.sinusoidal_positional_encoding(max_len, d_model).astype(np.float64)
    for i in range(d_model // 2):
        w = 1 / 10000 ** (2 * i / d_model)
        rotation = np.array([[math.cos(w * k), -math.sin(w * k)], [math.sin(w * k), math.cos(w * k)]])
        pairs = pe[:, 2 * i : 2 * i + 2]  # (max_len, 2): (sin, cos)
        np.testing.assert_allclose(pairs[:-k] @ rotation, pairs[k:], atol=1e-6)


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_layer_adds_the_table_prefix(framework):
    x = np.random.default_rng(0).normal(size=(2, 9, 10)).astype(np.float32)
    layer = LAYERS[framework](10, max_len=20)
    expected = x + reference.sinusoidal_positional_encoding(20, 10)[:9]
    np.testing.assert_allclose(run(framework, layer, x), expected, atol=1e-6)


def test_torch_table_is_a_buffer_outside_the_state_dict():
    layer = TorchPositionalEncoding(8, max_len=16)
    assert list(layer.parameters()) == []
    assert "pe" in dict(layer.named_buffers())
    assert "pe" not in layer.state_dict()  # persistent=False: recomputed, never saved or loaded


def test_keras_table_is_not_a_weight():
    layer = KerasPositionalEncoding(8, max_len=16)
    layer(np.zeros((1, 4, 8), dtype=np.float32))
    assert layer.weights == [] and layer.trainable_weights == []


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_dropout_only_in_training(framework):
    x = np.ones((2, 6, 8), dtype=np.float32)
    layer = LAYERS[framework](8, max_len=16, dropout=0.5)
    expected = x + reference.sinusoidal_positional_encoding(6, 8)
    np.testing.assert_allclose(run(framework, layer, x, training=False), expected, atol=1e-6)
    trained = run(framework, layer, x, training=True)
    assert (trained == 0).any(), "dropout should zero some entries in training"


@pytest.mark.parametrize("make", list(TABLES.values()), ids=list(TABLES))
def test_odd_d_model_raises(make):
    with pytest.raises(ValueError, match="d_model must be a positive even number"):
        make(10, 7)


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_bad_inputs_raise_value_error(framework):
    layer = LAYERS[framework](8, max_len=4)
    with pytest.raises(ValueError, match=r"seq_len=5 .* max_len=4.*max_len >= 5"):
        run(framework, layer, np.zeros((1, 5, 8), dtype=np.float32))
    with pytest.raises(ValueError, match=r"d_model=8"):
        run(framework, layer, np.zeros((1, 3, 6), dtype=np.float32))
    with pytest.raises(ValueError, match="d_model must be a positive even number"):
        LAYERS[framework](7)


def test_keras_config_round_trip():
    layer = KerasPositionalEncoding(6, max_len=30, dropout=0.2, name="pos")
    clone = KerasPositionalEncoding.from_config(layer.get_config())
    assert (clone.d_model, clone.max_len, clone.dropout.rate, clone.name) == (6, 30, 0.2, "pos")
