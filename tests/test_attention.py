"""Scaled dot-product attention: oracle vs PyTorch vs Keras vs the libraries' own kernels, plus edge cases."""

import keras
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from keras import ops
from keras_backends import keras_grad

from companion import reference
from companion.keras import default_device as keras_default_device
from companion.keras import scaled_dot_product_attention as keras_sdpa
from companion.torch import default_device as torch_default_device
from companion.torch import scaled_dot_product_attention as torch_sdpa

ATOL = 1e-5  # float32 frameworks against the float64 oracle
RIGHT_PADDED = np.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 0]])
LEFT_PADDED = np.array([[3, 4, 5, 0, 0], [0, 0, 6, 7, 8]])  # with a causal mask, queries 0 and 1 of row 1 see nothing


def masks() -> dict[str, np.ndarray | None]:
    causal = reference.causal_mask(5)
    return {
        "none": None,
        "padding": reference.padding_mask(RIGHT_PADDED),
        "causal": causal,
        "combined": reference.combine_masks(reference.padding_mask(RIGHT_PADDED), causal),
        "fully_masked_rows": reference.combine_masks(reference.padding_mask(LEFT_PADDED), causal),
        "all_masked": np.zeros((1, 1, 1, 5), dtype=bool),
    }


def random_qkv(batch=2, heads=3, query_len=5, key_len=5, d_k=8, d_v=4, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(batch, heads, query_len, d_k)).astype("float32"),
        rng.normal(size=(batch, heads, key_len, d_k)).astype("float32"),
        rng.normal(size=(batch, heads, key_len, d_v)).astype("float32"),
    )


def run_torch(q, k, v, mask, **kwargs):
    to = torch.from_numpy
    out, weights = torch_sdpa(to(q), to(k), to(v), None if mask is None else to(mask), return_weights=True, **kwargs)
    return out.numpy(), weights.numpy()


def run_keras(q, k, v, mask, **kwargs):
    out, weights = keras_sdpa(q, k, v, mask, return_weights=True, **kwargs)
    return ops.convert_to_numpy(out), ops.convert_to_numpy(weights)


def run_reference(q, k, v, mask):
    return reference.scaled_dot_product_attention(q.astype("float64"), k.astype("float64"), v.astype("float64"), mask)


# --- parity -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask_name", list(masks()))
@pytest.mark.parametrize("run", [run_torch, run_keras], ids=["torch", "keras"])
def test_matches_reference(run, mask_name):
    q, k, v = random_qkv()
    mask = masks()[mask_name]
    out, weights = run(q, k, v, mask)
    ref_out, ref_weights = run_reference(q, k, v, mask)
    assert out.shape == (2, 3, 5, 4) and weights.shape == (2, 3, 5, 5)
    np.testing.assert_allclose(out, ref_out, atol=ATOL)
    np.testing.assert_allclose(weights, ref_weights, atol=ATOL)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=ATOL)
    if mask is not None:
        assert (weights[~np.broadcast_to(mask, weights.shape) & mask.any(-1, keepdims=True)] == 0).all()


@pytest.mark.parametrize("run", [run_torch, run_keras], ids=["torch", "keras"])
def test_fully_masked_row_is_uniform_and_finite(run):
    q, k, v = random_qkv()
    out, weights = run(q, k, v, masks()["fully_masked_rows"])
    assert np.isfinite(out).all() and np.isfinite(weights).all()
    np.testing.assert_allclose(weights[1, :, 0], 1 / 5, atol=1e-7)  # every key masked: no preference
    np.testing.assert_allclose(out[1, :, 0], v[1].mean(axis=1), atol=ATOL)


@pytest.mark.parametrize("run", [run_torch, run_keras], ids=["torch", "keras"])
def test_cross_attention_lengths_and_batch_axes(run):
    # query_len != key_len, d_v != d_k, several leading axes, and a 2-D mask that broadcasts over them.
    q, k, v = random_qkv(batch=1, heads=2, query_len=3, key_len=7, d_k=6, d_v=2)
    mask = np.random.default_rng(1).random((3, 7)) > 0.3
    out, weights = run(q, k, v, mask)
    ref_out, ref_weights = run_reference(q, k, v, mask)
    assert out.shape == (1, 2, 3, 2) and weights.shape == (1, 2, 3, 7)
    np.testing.assert_allclose(out, ref_out, atol=ATOL)
    np.testing.assert_allclose(weights, ref_weights, atol=ATOL)


@pytest.mark.parametrize("run", [run_torch, run_keras], ids=["torch", "keras"])
def test_length_one_and_rank_two(run):
    q, k, v = (x[0, 0] for x in random_qkv(query_len=1, key_len=1))  # (1, d): a single position, no batch axes
    out, weights = run(q, k, v, np.ones((1, 1), dtype=bool))
    np.testing.assert_allclose(weights, [[1.0]])
    np.testing.assert_allclose(out, v, atol=ATOL)  # one key: the output is its value


def test_return_weights_false_returns_only_the_output():
    q, k, v = random_qkv()
    torch_out = torch_sdpa(*(torch.from_numpy(x) for x in (q, k, v)))
    keras_out = keras_sdpa(q, k, v)
    assert torch.is_tensor(torch_out) and ops.is_tensor(keras_out)
    np.testing.assert_allclose(torch_out.numpy(), ops.convert_to_numpy(keras_out), atol=ATOL)


@pytest.mark.parametrize("mask_name", ["none", "combined", "fully_masked_rows"])
def test_gradients_agree_between_torch_and_keras(mask_name):
    q, k, v = random_qkv()
    mask = masks()[mask_name]
    upstream = np.random.default_rng(2).normal(size=(2, 3, 5, 4)).astype("float32")  # a non-trivial d loss / d out
    tensors = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    out = torch_sdpa(*tensors, None if mask is None else torch.from_numpy(mask))
    (out * torch.from_numpy(upstream)).sum().backward()
    keras_grads = keras_grad(lambda *xs: keras_sdpa(*xs, mask) * upstream, q, k, v)
    for name, tensor, grad in zip("qkv", tensors, keras_grads, strict=True):
        np.testing.assert_allclose(tensor.grad.numpy(), grad, atol=ATOL, err_msg=f"d/d{name}")


@pytest.mark.parametrize("mask_name", ["none", "combined", "fully_masked_rows"])
def test_torch_gradients_pass_gradcheck(mask_name):
    # Finite differences in float64: the analytic gradient (and so the Keras one, equal above) is right.
    q, k, v = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in random_qkv(batch=1, heads=1))
    mask = masks()[mask_name]
    mask = None if mask is None else torch.from_numpy(mask[1:2] if mask.shape[0] == 2 else mask)
    assert torch.autograd.gradcheck(lambda q, k, v: torch_sdpa(q, k, v, mask), (q, k, v))


# --- against the libraries' own kernels -----------------------------------------------------------------------------


@pytest.mark.parametrize("mask_name", ["none", "padding", "causal", "combined"])
def test_torch_matches_torch_functional_sdpa(mask_name):
    q, k, v = (torch.from_numpy(x) for x in random_qkv())
    mask = masks()[mask_name]
    mask = None if mask is None else torch.from_numpy(mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # bool mask, True = may attend, like ours
    torch.testing.assert_close(torch_sdpa(q, k, v, mask), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("mask_name", ["none", "padding", "causal", "combined"])
def test_keras_matches_keras_ops_dot_product_attention(mask_name):
    q, k, v = random_qkv(d_v=8)  # keras.ops.dot_product_attention wants d_v == d_k
    mask = masks()[mask_name]
    # keras.ops puts the heads on axis 2: (batch, seq_len, num_heads, depth).
    swap = lambda x: np.swapaxes(x, 1, 2)  # noqa: E731
    full = None if mask is None else np.broadcast_to(mask, (2, 3, 5, 5))
    expected = swap(ops.convert_to_numpy(ops.dot_product_attention(swap(q), swap(k), swap(v), mask=full)))
    np.testing.assert_allclose(ops.convert_to_numpy(keras_sdpa(q, k, v, mask)), expected, atol=ATOL)


# --- low precision --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "atol"), [("float16", 5e-3), ("bfloat16", 3e-2)])
def test_torch_low_precision_fully_masked_row_is_finite(dtype, atol):
    q, k, v = (torch.from_numpy(x).to(getattr(torch, dtype)) for x in random_qkv())
    mask = torch.from_numpy(masks()["fully_masked_rows"])
    out, weights = torch_sdpa(q, k, v, mask, return_weights=True)
    assert out.dtype == weights.dtype == getattr(torch, dtype)
    assert out.isfinite().all() and weights.isfinite().all()
    ref_out, ref_weights = run_reference(*(x.double().numpy() for x in (q, k, v)), mask.numpy())
    np.testing.assert_allclose(out.double().numpy(), ref_out, atol=atol)
    np.testing.assert_allclose(weights.double().numpy(), ref_weights, atol=atol)


def test_torch_minus_inf_fill_would_give_nan():
    # What the package avoids (seed 003 fills with -inf): a fully masked row becomes 0/0.
    scores = torch.randn(1, 5).masked_fill(torch.zeros(1, 5, dtype=torch.bool).logical_not(), float("-inf"))
    assert scores.softmax(-1).isnan().all()


@pytest.mark.parametrize(("dtype", "atol"), [("float16", 5e-3), ("bfloat16", 3e-2)])
def test_keras_low_precision_fully_masked_row_is_finite(dtype, atol):
    q, k, v = (ops.cast(x, dtype) for x in random_qkv())
    mask = masks()["fully_masked_rows"]
    out, weights = keras_sdpa(q, k, v, mask, return_weights=True)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    out, weights = (ops.convert_to_numpy(ops.cast(x, "float64")) for x in (out, weights))
    assert np.isfinite(out).all() and np.isfinite(weights).all()
    ref_out, ref_weights = run_reference(*(ops.convert_to_numpy(ops.cast(x, "float64")) for x in (q, k, v)), mask)
    np.testing.assert_allclose(out, ref_out, atol=atol)
    np.testing.assert_allclose(weights, ref_weights, atol=atol)


# --- dropout --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("run", [run_torch, run_keras], ids=["torch", "keras"])
def test_dropout_only_when_training(run):
    q, k, v = random_qkv()
    plain_out, plain_weights = run(q, k, v, None)
    eval_out, _ = run(q, k, v, None, dropout=0.5, training=False)
    np.testing.assert_array_equal(eval_out, plain_out)
    train_out, train_weights = run(q, k, v, None, dropout=0.5, training=True)
    assert not np.allclose(train_out, plain_out)
    np.testing.assert_allclose(train_weights, plain_weights, atol=1e-6)  # returned weights are pre-dropout


# --- bad input ------------------------------------------------------------------------------------------------------

BAD_INPUTS = {
    "rank 1 q": ((8,), (5, 8), (5, 4), None, r"q must have shape \(\.\.\., seq_len, depth\)"),
    "d_k differs": ((5, 8), (5, 6), (5, 4), None, r"k must have shape \(\.\.\., key_len, d_k=8\)"),
    "key_len differs": ((5, 8), (5, 8), (4, 4), None, r"v must have shape \(\.\.\., key_len=5, d_v\)"),
    "mask too long": ((2, 5, 8), (2, 6, 8), (2, 6, 4), (2, 1, 7), r"mask must be broadcastable to \(2, 5, 6\)"),
    "mask extra axis": ((2, 5, 8), (2, 6, 8), (2, 6, 4), (2, 1, 1, 6), r"mask must be broadcastable to \(2, 5, 6\)"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_bad_shapes_raise_value_error_naming_the_argument(framework, case):
    q_shape, k_shape, v_shape, mask_shape, message = BAD_INPUTS[case]
    q, k, v = (np.zeros(s, dtype="float32") for s in (q_shape, k_shape, v_shape))
    mask = None if mask_shape is None else np.ones(mask_shape, dtype=bool)
    with pytest.raises(ValueError, match=message):
        if framework == "torch":
            torch_sdpa(*(torch.from_numpy(x) for x in (q, k, v)), None if mask is None else torch.from_numpy(mask))
        else:
            keras_sdpa(q, k, v, mask)


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_non_boolean_mask_is_rejected(framework):
    # An additive 0/1 mask (1 = blocked, as in seed 004) would silently mean the opposite: refuse it.
    q = np.zeros((5, 8), dtype="float32")
    mask = np.tril(np.ones((5, 5), dtype="float32"))
    with pytest.raises(ValueError, match="mask must be boolean"):
        if framework == "torch":
            torch_sdpa(torch.from_numpy(q), torch.from_numpy(q), torch.from_numpy(q), torch.from_numpy(mask))
        else:
            keras_sdpa(q, q, q, mask)


# --- device ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "torch_device", "keras_device"),
    [("cpu", "cpu", "cpu:0"), ("cuda", "cuda", "gpu:0"), ("cuda:1", "cuda:1", "gpu:1"), ("GPU:1", "cuda:1", "gpu:1")],
)
def test_default_device_honours_the_environment(monkeypatch, setting, torch_device, keras_device):
    monkeypatch.setenv("COMPANION_DEVICE", setting)
    assert torch_default_device() == torch.device(torch_device)
    assert keras_default_device() == keras_device


def test_default_device_without_setting(monkeypatch):
    monkeypatch.delenv("COMPANION_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert torch_default_device() == torch.device(expected)
    assert keras_default_device() == ("gpu:0" if keras.distribution.list_devices("gpu") else "cpu:0")
    with keras.device(keras_default_device()):  # the string is one keras.device accepts
        assert ops.convert_to_numpy(ops.ones(2)).sum() == 2


@pytest.mark.parametrize("setting", ["tpu", "cuda:x", "banana"])
def test_default_device_rejects_nonsense(monkeypatch, setting):
    monkeypatch.setenv("COMPANION_DEVICE", setting)
    with pytest.raises(ValueError, match="COMPANION_DEVICE"):
        keras_default_device()
    with pytest.raises(ValueError, match="COMPANION_DEVICE"):
        torch_default_device()
