"""TokenEmbedding: PyTorch and Keras agree with each other and with one-hot @ table * sqrt(d_model)."""

import numpy as np
import pytest
import torch

from companion import text
from companion.keras import TokenEmbedding as KerasTokenEmbedding
from companion.torch import TokenEmbedding as TorchTokenEmbedding


@pytest.mark.parametrize("scale", [True, False])
def test_frameworks_match_one_hot_product(scale):
    rng = np.random.default_rng(0)
    vocab_size, d_model = 12, 8
    table = rng.standard_normal((vocab_size, d_model)).astype(np.float32)
    ids = rng.integers(0, vocab_size, size=(3, 5))
    expected = text.one_hot(ids, vocab_size) @ table * (np.sqrt(d_model) if scale else 1.0)

    torch_layer = TorchTokenEmbedding(vocab_size, d_model, scale=scale)
    with torch.no_grad():
        torch_layer.embedding.weight.copy_(torch.from_numpy(table))
    keras_layer = KerasTokenEmbedding(vocab_size, d_model, scale=scale)
    keras_layer.build(ids.shape)
    keras_layer.embedding.embeddings.assign(table)

    out_torch = torch_layer(torch.from_numpy(ids)).detach().numpy()
    out_keras = np.asarray(keras_layer(ids))
    assert out_torch.shape == out_keras.shape == (3, 5, d_model)
    np.testing.assert_allclose(out_torch, expected, atol=1e-5)
    np.testing.assert_allclose(out_keras, expected, atol=1e-5)


@pytest.mark.parametrize("make", [TorchTokenEmbedding, KerasTokenEmbedding])
def test_bad_ids_raise_value_error_naming_the_argument(make):
    layer = make(5, 4)
    as_input = (lambda a: torch.as_tensor(a)) if make is TorchTokenEmbedding else np.asarray
    with pytest.raises(ValueError, match=r"ids must lie in \[0, vocab_size=5\)"):
        layer(as_input(np.array([[1, 5]])))
    with pytest.raises(ValueError, match=r"ids must have shape \(batch, seq_len\)"):
        layer(as_input(np.array([1, 2])))
    with pytest.raises(ValueError, match="integer"):
        layer(as_input(np.array([[1.0, 2.0]], dtype=np.float32)))


def test_keras_config_round_trip():
    layer = KerasTokenEmbedding(7, 4, scale=False, name="emb")
    clone = KerasTokenEmbedding.from_config(layer.get_config())
    assert (clone.vocab_size, clone.d_model, clone.scale, clone.name) == (7, 4, False, "emb")
