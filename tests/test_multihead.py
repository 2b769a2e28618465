"""MultiHeadAttention: oracle vs PyTorch vs Keras vs torch.nn / keras.layers, save/load, bad input, backends."""

import os
import subprocess
import sys
import warnings
from importlib.util import find_spec
from pathlib import Path

import keras
import keras_backends
import numpy as np
import pytest
import torch
from keras import ops
from keras_backends import keras_grad

from companion import reference
from companion.convert import copy_weights, params_numpy
from companion.keras import MultiHeadAttention as KerasMHA
from companion.keras.masking import to_keras_mha_mask
from companion.torch import MultiHeadAttention as TorchMHA
from companion.torch.masking import to_torch_mha_mask

ATOL = 1e-5
D_MODEL, HEADS = 16, 4
RIGHT_PADDED = np.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 0]])
LEFT_PADDED = np.array([[3, 4, 5, 0, 0], [0, 0, 6, 7, 8]])


def random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def make_pair(d_model=D_MODEL, num_heads=HEADS, seed=0):
    """A torch MHA, a Keras MHA with the same weights, and those weights as the oracle's float64 dict."""
    torch.manual_seed(seed)
    torch_mha = TorchMHA(d_model, num_heads)
    keras_mha = KerasMHA(d_model, num_heads)
    x = random(1, 2, d_model)
    keras_mha(x, x, x)  # build
    copy_weights(torch_mha, keras_mha)
    params = {name: value.astype("float64") for name, value in params_numpy(torch_mha).items()}
    return torch_mha, keras_mha, params


CASES = {
    # name: (key/value length, mask)
    "none": (5, None),
    "padding": (5, reference.padding_mask(RIGHT_PADDED)),
    "causal": (5, reference.causal_mask(5)),
    "combined": (5, reference.combine_masks(reference.padding_mask(RIGHT_PADDED), reference.causal_mask(5))),
    "fully_masked_rows": (5, reference.combine_masks(reference.padding_mask(LEFT_PADDED), reference.causal_mask(5))),
    "cross": (7, reference.padding_mask(np.array([[1, 2, 3, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]]))),
}


def inputs(case):
    key_len, mask = CASES[case]
    return random(2, 5, D_MODEL, seed=1), random(2, key_len, D_MODEL, seed=2), mask


# --- structure ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("d_model", "num_heads"), [(16, 4), (512, 8)])
def test_parameter_count(d_model, num_heads):
    torch_mha = TorchMHA(d_model, num_heads)
    keras_mha = KerasMHA(d_model, num_heads)
    keras_mha.build((None, None, d_model))
    expected = 4 * d_model**2 + 4 * d_model  # four d x d projections with bias, independent of num_heads
    assert sum(p.numel() for p in torch_mha.parameters()) == expected
    assert keras_mha.count_params() == expected
    assert [type(getattr(torch_mha, n)).__name__ for n in ("wq", "wk", "wv", "wo")] == ["Linear"] * 4
    assert [type(getattr(keras_mha, n)).__name__ for n in ("wq", "wk", "wv", "wo")] == ["Dense"] * 4


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_split_heads_slices_each_position_and_merge_inverts(framework):
    x = random(2, 3, D_MODEL)
    if framework == "torch":
        mha = TorchMHA(D_MODEL, HEADS)
        split = mha.split_heads(torch.from_numpy(x))
        merged = mha.merge_heads(split).numpy()
        split = split.numpy()
    else:
        mha = KerasMHA(D_MODEL, HEADS)
        split = mha.split_heads(x)
        merged = ops.convert_to_numpy(mha.merge_heads(split))
        split = ops.convert_to_numpy(split)
    assert split.shape == (2, HEADS, 3, D_MODEL // HEADS)
    # Head h at position t holds the h-th slice of position t's vector (no mixing of positions).
    d_head = D_MODEL // HEADS
    for h in range(HEADS):
        np.testing.assert_array_equal(split[:, h], x[:, :, h * d_head : (h + 1) * d_head])
    np.testing.assert_array_equal(merged, x)


# --- parity ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_torch_and_keras_match_reference(case):
    torch_mha, keras_mha, params = make_pair()
    x, kv, mask = inputs(case)
    ref_out, ref_weights = reference.multi_head_attention(
        x.astype("float64"), kv.astype("float64"), kv.astype("float64"), params, HEADS, mask
    )
    t = torch.from_numpy
    t_mask = None if mask is None else t(mask)
    with torch.no_grad():
        fused = torch_mha(t(x), t(kv), t(kv), t_mask).numpy()  # F.scaled_dot_product_attention path
        explicit, weights = (y.numpy() for y in torch_mha(t(x), t(kv), t(kv), t_mask, return_weights=True))
    keras_out, keras_weights = (ops.convert_to_numpy(y) for y in keras_mha(x, kv, kv, mask, return_weights=True))
    assert fused.shape == (2, 5, D_MODEL) and weights.shape == keras_weights.shape == (2, HEADS, 5, kv.shape[1])
    for name, out in {"torch fused": fused, "torch explicit": explicit, "keras": keras_out}.items():
        np.testing.assert_allclose(out, ref_out, atol=ATOL, err_msg=name)
    np.testing.assert_allclose(weights, ref_weights, atol=ATOL)
    np.testing.assert_allclose(keras_weights, ref_weights, atol=ATOL)
    np.testing.assert_allclose(ops.convert_to_numpy(keras_mha(x, kv, kv, mask)), ref_out, atol=ATOL)


@pytest.mark.parametrize("case", ["none", "combined", "fully_masked_rows", "cross"])
def test_gradients_agree_between_torch_and_keras(case):
    torch_mha, keras_mha, _ = make_pair()
    x, kv, mask = inputs(case)
    upstream = random(2, 5, D_MODEL, seed=3)
    tensors = [torch.tensor(y, requires_grad=True) for y in (x, kv, kv.copy())]
    out = torch_mha(*tensors, None if mask is None else torch.from_numpy(mask))
    (out * torch.from_numpy(upstream)).sum().backward()
    grads = keras_grad(lambda q, k, v: keras_mha(q, k, v, mask) * upstream, x, kv, kv.copy())
    for name, tensor, grad in zip(("query", "key", "value"), tensors, grads, strict=True):
        np.testing.assert_allclose(tensor.grad.numpy(), grad, atol=ATOL, err_msg=f"d/d{name}")


@pytest.mark.parametrize("return_weights", [False, True])
def test_torch_gradcheck(return_weights):
    torch.manual_seed(0)
    mha = TorchMHA(8, 2).double()
    x = torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True)
    # Position 0 is padding and, under the causal mask, sees only itself: a fully masked row, on both paths.
    mask = reference.combine_masks(reference.padding_mask(np.array([[0, 1, 2]])), reference.causal_mask(3))
    mask = torch.from_numpy(mask)

    def f(x):
        out = mha(x, x, x, mask, return_weights=return_weights)
        return out[0] if return_weights else out

    assert torch.autograd.gradcheck(f, (x,))


# --- against the libraries' own layers ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["none", "padding", "causal", "combined", "cross"])
def test_torch_matches_torch_nn_multihead_attention(case):
    torch_mha, _, _ = make_pair()
    x, kv, mask = inputs(case)
    library = torch.nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True)
    with torch.no_grad():  # torch packs the three input projections into one (3 d_model, d_model) matrix
        library.in_proj_weight.copy_(torch.cat([torch_mha.wq.weight, torch_mha.wk.weight, torch_mha.wv.weight]))
        library.in_proj_bias.copy_(torch.cat([torch_mha.wq.bias, torch_mha.wk.bias, torch_mha.wv.bias]))
        library.out_proj.weight.copy_(torch_mha.wo.weight)
        library.out_proj.bias.copy_(torch_mha.wo.bias)
    # Its masks mean the opposite (True = blocked) and have no head axis: (batch, key_len) and (query_len, key_len).
    kwargs = {}
    if mask is not None:
        blocked = to_torch_mha_mask(torch.from_numpy(mask))
        if mask.shape[2] == 1:
            kwargs["key_padding_mask"] = blocked[:, 0, 0]
        elif mask.shape[0] == 1:
            kwargs["attn_mask"] = blocked[0, 0]
        else:
            kwargs["attn_mask"] = blocked.expand(-1, HEADS, -1, -1).reshape(-1, *blocked.shape[2:])
    t = torch.from_numpy
    with torch.no_grad():
        expected, expected_weights = library(t(x), t(kv), t(kv), average_attn_weights=False, **kwargs)
        out, weights = torch_mha(t(x), t(kv), t(kv), None if mask is None else t(mask), return_weights=True)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", ["none", "padding", "causal", "combined", "cross"])
def test_keras_matches_keras_layers_multi_head_attention(case):
    _, keras_mha, _ = make_pair()
    x, kv, mask = inputs(case)
    d_head = D_MODEL // HEADS
    library = keras.layers.MultiHeadAttention(HEADS, key_dim=d_head)
    library(x, kv, kv)  # build
    # keras.layers.MultiHeadAttention keeps the heads as an axis of its kernels: (d_model, heads, d_head) in,
    # (heads, d_head, d_model) out. Same numbers, reshaped.
    for ours, theirs in (("wq", "query_dense"), ("wk", "key_dense"), ("wv", "value_dense")):
        dense = getattr(keras_mha, ours)
        getattr(library, f"_{theirs}").kernel.assign(ops.reshape(dense.kernel, (D_MODEL, HEADS, d_head)))
        getattr(library, f"_{theirs}").bias.assign(ops.reshape(dense.bias, (HEADS, d_head)))
    library._output_dense.kernel.assign(ops.reshape(keras_mha.wo.kernel, (HEADS, d_head, D_MODEL)))
    library._output_dense.bias.assign(keras_mha.wo.bias)
    attention_mask = None if mask is None else np.broadcast_to(to_keras_mha_mask(mask), (2, 5, kv.shape[1]))
    expected, expected_weights = library(x, kv, kv, attention_mask=attention_mask, return_attention_scores=True)
    out, weights = keras_mha(x, kv, kv, mask, return_weights=True)
    np.testing.assert_allclose(ops.convert_to_numpy(out), ops.convert_to_numpy(expected), atol=ATOL)
    np.testing.assert_allclose(ops.convert_to_numpy(weights), ops.convert_to_numpy(expected_weights), atol=ATOL)


# --- edge cases -----------------------------------------------------------------------------------------------------


def test_torch_fused_and_explicit_paths_agree_on_fully_masked_rows():
    torch_mha, _, _ = make_pair()
    x, kv, mask = inputs("fully_masked_rows")
    t = torch.from_numpy
    fused = torch_mha(t(x), t(kv), t(kv), t(mask))
    explicit, weights = torch_mha(t(x), t(kv), t(kv), t(mask), return_weights=True)
    assert fused.isfinite().all()
    torch.testing.assert_close(fused, explicit, atol=ATOL, rtol=0)
    torch.testing.assert_close(weights[1, :, 0], torch.full((HEADS, 5), 0.2))  # row 1, query 0 sees only padding


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_low_precision_is_finite_on_both_paths(dtype):
    torch_mha, _, params = make_pair()
    torch_mha.to(dtype)
    x, kv, mask = inputs("fully_masked_rows")
    t = lambda y: torch.from_numpy(y).to(dtype)  # noqa: E731
    with torch.no_grad():
        fused = torch_mha(t(x), t(kv), t(kv), torch.from_numpy(mask))
        explicit, weights = torch_mha(t(x), t(kv), t(kv), torch.from_numpy(mask), return_weights=True)
    assert fused.dtype == dtype and fused.isfinite().all() and explicit.isfinite().all()
    ref_out, _ = reference.multi_head_attention(
        x.astype("float64"), kv.astype("float64"), kv.astype("float64"), params, HEADS, mask
    )
    atol = 3e-2 if dtype == torch.float16 else 1e-1
    np.testing.assert_allclose(fused.double().numpy(), ref_out, atol=atol)
    np.testing.assert_allclose(explicit.double().numpy(), ref_out, atol=atol)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_keras_low_precision_is_finite(dtype):
    keras_mha = KerasMHA(D_MODEL, HEADS, dtype=dtype)
    x, kv, mask = inputs("fully_masked_rows")
    out, weights = keras_mha(x, kv, kv, mask, return_weights=True)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    assert np.isfinite(ops.convert_to_numpy(ops.cast(out, "float32"))).all()
    np.testing.assert_allclose(ops.convert_to_numpy(ops.cast(weights, "float32"))[1, :, 0], 0.2, atol=1e-2)


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_batch_one_length_one(framework):
    torch_mha, keras_mha, params = make_pair()
    x, memory = random(1, 1, D_MODEL, seed=4), random(1, 3, D_MODEL, seed=5)
    for kv in (x, memory):
        ref_out, _ = reference.multi_head_attention(
            x.astype("float64"), kv.astype("float64"), kv.astype("float64"), params, HEADS
        )
        if framework == "torch":
            out = torch_mha(torch.from_numpy(x), torch.from_numpy(kv), torch.from_numpy(kv)).detach().numpy()
        else:
            out = ops.convert_to_numpy(keras_mha(x, kv, kv))
        assert out.shape == (1, 1, D_MODEL)
        np.testing.assert_allclose(out, ref_out, atol=ATOL)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    torch_mha = TorchMHA(D_MODEL, HEADS, dropout=0.5)
    keras_mha = KerasMHA(D_MODEL, HEADS, dropout=0.5)
    x = random(2, 5, D_MODEL)
    keras_mha(x, x, x)
    copy_weights(torch_mha, keras_mha)
    t = torch.from_numpy(x)
    torch_mha.eval()
    torch_eval = torch_mha(t, t, t).detach().numpy()
    np.testing.assert_allclose(ops.convert_to_numpy(keras_mha(x, x, x, training=False)), torch_eval, atol=ATOL)
    torch_mha.train()
    for fused in (False, True):  # return_weights=True takes the explicit path, False the fused one
        out = torch_mha(t, t, t, return_weights=not fused)
        out = out[0] if not fused else out
        assert not np.allclose(out.detach().numpy(), torch_eval)
    assert not np.allclose(ops.convert_to_numpy(keras_mha(x, x, x, training=True)), torch_eval)


def test_keras_does_not_attach_the_attention_mask_as_a_keras_mask():
    _, keras_mha, _ = make_pair()
    x, _, mask = inputs("combined")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Keras warns when a layer "destroys" a mask passed as mask=...
        out = keras_mha(x, x, x, mask=ops.convert_to_tensor(mask))
    assert getattr(out, "_keras_mask", None) is None  # a loss would otherwise read it as a per-token mask


def test_keras_works_in_a_functional_model_and_compiled_function():
    x = random(2, 5, D_MODEL)
    ids = RIGHT_PADDED
    queries = keras.Input((None, D_MODEL))
    mask = keras.Input((1, 1, None), dtype="bool")
    mha = KerasMHA(D_MODEL, HEADS)
    model = keras.Model([queries, mask], mha(queries, queries, queries, mask))
    expected = mha(x, x, x, reference.padding_mask(ids))
    out = model([ops.convert_to_tensor(x), ops.convert_to_tensor(reference.padding_mask(ids))])
    np.testing.assert_allclose(ops.convert_to_numpy(out), ops.convert_to_numpy(expected), atol=ATOL)


# --- bad input ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [TorchMHA, KerasMHA], ids=["torch", "keras"])
def test_heads_must_divide_d_model(cls):
    with pytest.raises(ValueError, match=r"d_model \(10\) must be divisible by num_heads \(4\)"):
        cls(10, 4)


BAD_CALLS = {
    "query rank 2": ((5, 16), (2, 5, 16), None, r"query must have shape \(batch, seq_len, d_model=16\)"),
    "query width": ((2, 5, 12), (2, 5, 16), None, r"query must have shape \(batch, seq_len, d_model=16\)"),
    "key width": ((2, 5, 16), (2, 5, 8), None, r"key must have shape \(batch, seq_len, d_model=16\)"),
    "mask key_len": ((2, 5, 16), (2, 7, 16), (2, 1, 1, 5), r"mask must be broadcastable to \(2, 4, 5, 7\)"),
    "mask heads": ((2, 5, 16), (2, 5, 16), (2, 3, 5, 5), r"mask must be broadcastable to \(2, 4, 5, 5\)"),
    "mask rank 5": ((2, 5, 16), (2, 5, 16), (1, 2, 1, 1, 5), r"mask must be broadcastable to \(2, 4, 5, 5\)"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_bad_calls_raise_value_error_naming_the_argument(framework, case):
    query_shape, key_shape, mask_shape, message = BAD_CALLS[case]
    query, key = np.zeros(query_shape, dtype="float32"), np.zeros(key_shape, dtype="float32")
    mask = None if mask_shape is None else np.ones(mask_shape, dtype=bool)
    with pytest.raises(ValueError, match=message):
        if framework == "torch":
            t = torch.from_numpy
            TorchMHA(16, 4)(t(query), t(key), t(key), None if mask is None else t(mask))
        else:
            KerasMHA(16, 4)(query, key, key, mask)


def test_keras_does_not_build_on_a_bad_width():
    mha = KerasMHA(16, 4)
    with pytest.raises(ValueError, match="query must have shape"):
        mha(random(2, 5, 12), random(2, 5, 12), random(2, 5, 12))
    x = random(2, 5, 16)
    assert mha(x, x, x).shape == (2, 5, 16)  # the failed call left no wrongly shaped kernel behind


# --- save / load ----------------------------------------------------------------------------------------------------


def test_torch_state_dict_round_trip(tmp_path):
    torch_mha, _, _ = make_pair()
    torch.save(torch_mha.state_dict(), tmp_path / "mha.pt")
    restored = TorchMHA(D_MODEL, HEADS)
    restored.load_state_dict(torch.load(tmp_path / "mha.pt", weights_only=True))
    assert sorted(restored.state_dict()) == sorted(f"w{n}.{p}" for n in "qkvo" for p in ("weight", "bias"))
    x, kv, mask = inputs("cross")
    t = torch.from_numpy
    torch.testing.assert_close(restored(t(x), t(kv), t(kv), t(mask)), torch_mha(t(x), t(kv), t(kv), t(mask)))


def test_keras_file_round_trip(tmp_path):
    queries, memory = keras.Input((None, D_MODEL)), keras.Input((None, D_MODEL))
    mask = keras.Input((1, 1, None), dtype="bool")
    mha = KerasMHA(D_MODEL, HEADS, dropout=0.1, name="cross_attention")
    model = keras.Model([queries, memory, mask], mha(queries, memory, memory, mask))
    model.save(tmp_path / "mha.keras")
    restored = keras.saving.load_model(tmp_path / "mha.keras")
    layer = restored.get_layer("cross_attention")
    assert isinstance(layer, KerasMHA) and (layer.d_model, layer.num_heads, layer.dropout) == (D_MODEL, HEADS, 0.1)
    x, kv, m = inputs("cross")
    batch = [ops.convert_to_tensor(y) for y in (x, kv, m)]
    np.testing.assert_array_equal(ops.convert_to_numpy(restored(batch)), ops.convert_to_numpy(model(batch)))


def test_keras_config_round_trip():
    mha = KerasMHA(D_MODEL, HEADS, dropout=0.25)
    clone = KerasMHA.from_config(mha.get_config())
    assert (clone.d_model, clone.num_heads, clone.dropout) == (D_MODEL, HEADS, 0.25)


# --- other Keras backends -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("check", keras_backends.CHECKS, ids=lambda fn: fn.__name__)
def test_backend_checks_in_process(check):
    check()  # on this process's backend (TensorFlow unless KERAS_BACKEND says otherwise)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_keras_layers_on_another_backend(backend):
    if find_spec(backend) is None:
        # The dev extra installs torch and jax[cpu]: in CI a missing backend is a broken install, not a skip.
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{backend} is not installed (the dev extra installs it)", pytrace=False)
        pytest.skip(f"{backend} is not installed")
    if backend == keras.backend.backend():
        pytest.skip(f"this process already runs on {backend}")
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    script = Path(__file__).with_name("keras_backends.py")
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"backend: {backend}" in result.stdout, output
    assert f"{len(keras_backends.CHECKS)} passed, 0 failed" in result.stdout, output
