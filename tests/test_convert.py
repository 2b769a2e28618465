"""copy_weights: torch <-> Keras by attribute name, for MultiHeadAttention and any layer built the same way."""

import keras
import numpy as np
import pytest
import torch
from keras import ops
from torch import nn

from companion.convert import copy_weights, dense_numpy, params_numpy
from companion.keras import MultiHeadAttention as KerasMHA
from companion.torch import MultiHeadAttention as TorchMHA

ATOL = 1e-5


def random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


# A small stand-in for the course's layers: nested attributes, a list, a Sequential, a LayerNorm, an Embedding, a bare
# parameter, and children without weights (dropout, activation) on one side only.


class TorchBlock(nn.Module):
    def __init__(self, d_model=8, vocab=11, eps=1e-5, extra=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.attn = TorchMHA(d_model, 2)
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(2)])
        self.ffn = nn.Sequential(nn.Linear(d_model, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, d_model))
        self.scale = nn.Parameter(torch.randn(d_model))
        self.dropout = nn.Dropout(0.1)
        if extra:
            self.extra = nn.Linear(d_model, d_model)

    def forward(self, ids):
        x = self.embed(ids) * self.scale
        x = self.norm(x + self.attn(x, x, x))
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.ffn(x)


class KerasBlock(keras.layers.Layer):
    def __init__(self, d_model=8, vocab=11, eps=1e-5, ffn_width=16, norm="layer", extra=False, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Embedding(vocab, d_model)
        self.attn = KerasMHA(d_model, 2)
        self.norm = keras.layers.LayerNormalization(epsilon=eps) if norm == "layer" else keras.layers.Dense(d_model)
        self.layers = [keras.layers.Dense(d_model, activation="relu") for _ in range(2)]
        self.ffn = keras.Sequential([keras.layers.Dense(ffn_width, activation="relu"), keras.layers.Dense(d_model)])
        self.extra = keras.layers.Dense(d_model) if extra else None
        self.d_model = d_model

    def build(self, ids_shape):
        self.scale = self.add_weight(shape=(self.d_model,), name="scale")
        self.embed.build(ids_shape)
        shape = (*ids_shape, self.d_model)
        self.attn.build(shape, shape, shape)
        self.norm.build(shape)
        for layer in self.layers:
            layer.build(shape)
        self.ffn.build(shape)
        if self.extra is not None:
            self.extra.build(shape)

    def call(self, ids):
        x = self.embed(ids) * self.scale
        x = self.norm(x + self.attn(x, x, x))
        for layer in self.layers:
            x = layer(x)
        return self.ffn(x)


IDS = np.array([[1, 2, 3, 4], [5, 6, 7, 0]])


def built_keras_block(**kwargs):
    block = KerasBlock(**kwargs)
    block(IDS)
    return block


# --- MultiHeadAttention ---------------------------------------------------------------------------------------------


def test_mha_torch_to_keras_and_back():
    torch.manual_seed(0)
    source = TorchMHA(8, 2)
    keras_mha = KerasMHA(8, 2)
    x = random(2, 3, 8)
    keras_mha(x, x, x)
    copy_weights(source, keras_mha)
    np.testing.assert_allclose(
        ops.convert_to_numpy(keras_mha(x, x, x)), source(*[torch.from_numpy(x)] * 3).detach().numpy(), atol=ATOL
    )
    target = TorchMHA(8, 2)
    copy_weights(keras_mha, target)
    for name, value in source.state_dict().items():
        torch.testing.assert_close(target.state_dict()[name], value, rtol=0, atol=0)


def test_params_numpy_is_the_same_from_both_frameworks():
    torch_mha, keras_mha = TorchMHA(8, 2), KerasMHA(8, 2)
    keras_mha.build((None, None, 8))
    copy_weights(torch_mha, keras_mha)
    from_torch, from_keras = params_numpy(torch_mha), params_numpy(keras_mha)
    assert sorted(from_torch) == ["bk", "bo", "bq", "bv", "wk", "wo", "wq", "wv"]
    for name in from_torch:
        np.testing.assert_array_equal(from_torch[name], from_keras[name])
    # x @ w + b convention: w is (d_in, d_out), the transpose of torch's weight.
    np.testing.assert_array_equal(from_torch["wq"], torch_mha.wq.weight.detach().numpy().T)


def test_dense_numpy_without_bias():
    w, b = dense_numpy(nn.Linear(3, 5, bias=False))
    assert w.shape == (3, 5) and b is None
    dense = keras.layers.Dense(5, use_bias=False)
    dense.build((None, 3))
    w, b = dense_numpy(dense)
    assert w.shape == (3, 5) and b is None
    with pytest.raises(TypeError, match="nn.Linear or a keras.layers.Dense"):
        dense_numpy(nn.ReLU())


# --- a nested layer -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["torch_to_keras", "keras_to_torch"])
def test_nested_layer_round_trip(direction):
    torch.manual_seed(1)
    torch_block, keras_block = TorchBlock().eval(), built_keras_block()
    if direction == "torch_to_keras":
        copy_weights(torch_block, keras_block)
    else:
        copy_weights(keras_block, torch_block)
    expected = torch_block(torch.from_numpy(IDS)).detach().numpy()
    np.testing.assert_allclose(ops.convert_to_numpy(keras_block(IDS)), expected, atol=ATOL)
    np.testing.assert_array_equal(ops.convert_to_numpy(keras_block.scale), torch_block.scale.detach().numpy())
    np.testing.assert_array_equal(
        ops.convert_to_numpy(keras_block.layers[1].kernel), torch_block.layers[1].weight.detach().numpy().T
    )


def test_float64_torch_and_bfloat16_keras_convert():
    torch_mha = TorchMHA(8, 2).double()
    keras_mha = KerasMHA(8, 2, dtype="bfloat16")
    keras_mha.build((None, None, 8))
    copy_weights(torch_mha, keras_mha)
    copy_weights(keras_mha, torch_mha)  # bfloat16 -> float64 has no NumPy twin on the way: must still work
    assert torch_mha.wq.weight.dtype == torch.float64
    np.testing.assert_allclose(params_numpy(torch_mha)["wq"], params_numpy(keras_mha)["wq"], atol=0)


# --- errors name the path -------------------------------------------------------------------------------------------


def test_missing_attribute_names_the_path():
    with pytest.raises(ValueError, match=r"TorchBlock\.extra: the Keras layer KerasBlock has no attribute 'extra'"):
        copy_weights(TorchBlock(extra=True), built_keras_block())


def test_shape_mismatch_names_the_path():
    with pytest.raises(ValueError, match=r"TorchBlock\.ffn\[0\]\.weight: shape mismatch, torch \(16, 8\)"):
        copy_weights(TorchBlock(), built_keras_block(ffn_width=12))


def test_unbuilt_keras_layer_says_to_call_it_first():
    with pytest.raises(ValueError, match=r"MultiHeadAttention: .* is not built yet; call it once"):
        copy_weights(TorchMHA(8, 2), KerasMHA(8, 2))


def test_epsilon_mismatch_is_reported():
    with pytest.raises(ValueError, match=r"TorchBlock\.norm: epsilon differs, torch 1e-05 vs Keras 0\.001"):
        copy_weights(TorchBlock(), built_keras_block(eps=1e-3))


def test_keras_weight_without_torch_counterpart_is_reported():
    with pytest.raises(ValueError, match=r"TorchBlock: Keras weights with no torch counterpart: .*kernel"):
        copy_weights(TorchBlock(), built_keras_block(extra=True))


def test_layer_type_mismatch_is_reported():
    with pytest.raises(ValueError, match=r"TorchBlock\.norm: expected a keras.layers.LayerNormalization, found Dense"):
        copy_weights(TorchBlock(), built_keras_block(norm="dense"))


def test_bias_on_one_side_only_is_reported():
    dense = keras.layers.Dense(4, use_bias=False)
    dense.build((None, 3))
    with pytest.raises(ValueError, match=r"Linear\.bias: present in torch only"):
        copy_weights(nn.Linear(3, 4), dense)


def test_list_length_mismatch_is_reported():
    torch_block, keras_block = TorchBlock(), built_keras_block()
    torch_block.layers.append(nn.Linear(8, 8))
    with pytest.raises(ValueError, match=r"TorchBlock\.layers: 3 torch layers with weights vs 2 in Keras"):
        copy_weights(torch_block, keras_block)


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError, match="a torch.nn.Module and a keras.layers.Layer"):
        copy_weights(TorchMHA(8, 2), TorchMHA(8, 2))


# --- the course's full model, when present --------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_round_trip(norm_first):
    torch_model = pytest.importorskip("companion.torch.model")
    keras_model = pytest.importorskip("companion.keras.model")
    kwargs = dict(d_model=16, num_heads=4, num_layers=2, d_ff=32, max_len=16, dropout=0.0, norm_first=norm_first)
    src, tgt = np.array([[3, 4, 5, 0], [6, 7, 8, 9]]), np.array([[1, 2, 3], [1, 5, 0]])
    torch.manual_seed(2)
    source = torch_model.Transformer(11, 13, **kwargs).eval()
    target = keras_model.Transformer(11, 13, **kwargs)
    target(src, tgt)
    copy_weights(source, target)
    expected = source(torch.from_numpy(src), torch.from_numpy(tgt)).detach().numpy()
    np.testing.assert_allclose(ops.convert_to_numpy(target(src, tgt)), expected, atol=1e-4)
    back = torch_model.Transformer(11, 13, **kwargs).eval()
    copy_weights(target, back)
    torch.testing.assert_close(back(torch.from_numpy(src), torch.from_numpy(tgt)), torch.from_numpy(expected))


def test_transformer_with_shared_embeddings_round_trip():
    torch_model = pytest.importorskip("companion.torch.model")
    keras_model = pytest.importorskip("companion.keras.model")
    kwargs = dict(d_model=16, num_heads=4, num_layers=1, d_ff=32, max_len=16, dropout=0.0, shared_embeddings=True)
    src, tgt = np.array([[3, 4, 5, 0], [6, 7, 8, 9]]), np.array([[1, 2, 3], [1, 5, 0]])
    torch.manual_seed(3)
    source = torch_model.Transformer(12, 12, **kwargs).eval()
    with torch.no_grad():
        source.generator.bias.uniform_(-1, 1)
    target = keras_model.Transformer(12, 12, **kwargs)
    target(src, tgt)
    copy_weights(source, target)  # the one table is written once per name that reaches it; all agree
    expected = source(torch.from_numpy(src), torch.from_numpy(tgt)).detach().numpy()
    np.testing.assert_allclose(ops.convert_to_numpy(target(src, tgt)), expected, atol=1e-4)
    back = torch_model.Transformer(12, 12, **kwargs).eval()
    copy_weights(target, back)
    assert back.generator.embedding.weight is back.src_embed.embedding.weight  # still shared after the copy
    torch.testing.assert_close(back(torch.from_numpy(src), torch.from_numpy(tgt)), torch.from_numpy(expected))
    untied = keras_model.Transformer(12, 12, **{**kwargs, "shared_embeddings": False})
    untied(src, tgt)
    with pytest.raises(ValueError, match="generator"):  # a tied model and an untied one do not pair up
        copy_weights(source, untied)
