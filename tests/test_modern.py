"""The blocks of chapter 9 (RMSNorm, RoPE, SwiGLU, grouped-query attention with its cache, the sliding-window mask,
online-softmax attention): PyTorch = Keras = NumPy oracle to 1e-5 with the same weights, gradients included, and
the properties the chapter relies on (RoPE sees only relative offsets; the interleaved layout is a permutation)."""

import keras
import numpy as np
import pytest
import torch
from keras import ops
from keras_backends import keras_grad
from model_helpers import as_numpy

import companion.keras as ck
import companion.torch as ct
from companion import reference
from companion.convert import copy_weights, dense_numpy
from companion.reference.model import _array

ATOL = 1e-5
FRAMEWORKS = pytest.mark.parametrize("framework", ["torch", "keras"])


def _random(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def _torch_and_keras(torch_layer, keras_layer, build_shape):
    """Build the Keras layer, give the torch layer's weights to it, return both."""
    keras_layer.build(build_shape)
    copy_weights(torch_layer, keras_layer)
    return torch_layer, keras_layer


# ---------------------------------------------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------------------------------------------


def _norm_pair(d_model=16, eps=1e-6, seed=0):
    torch.manual_seed(seed)
    net = ct.RMSNorm(d_model, eps)
    with torch.no_grad():
        net.weight.copy_(1 + 0.3 * torch.randn(d_model))  # not all ones: a missing gain must show
    return _torch_and_keras(net, ck.RMSNorm(d_model, eps), (None, None, d_model))


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_rms_norm_matches_the_oracle_with_gradients(eps):
    net, twin = _norm_pair(eps=eps)
    x = _random(2, 5, 16, seed=1) * 3
    expected = reference.rms_norm(x.astype("float64"), _array(net.weight), eps)
    np.testing.assert_allclose(as_numpy(net(torch.as_tensor(x))), expected, atol=ATOL)
    np.testing.assert_allclose(as_numpy(twin(x)), expected, atol=ATOL)
    upstream = _random(2, 5, 16, seed=2)
    xt = torch.tensor(x, requires_grad=True)
    (net(xt) * torch.as_tensor(upstream)).sum().backward()
    (grad,) = keras_grad(lambda h: twin(h) * upstream, x)
    np.testing.assert_allclose(xt.grad.numpy(), grad, atol=ATOL)
    x64 = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: net.double()(h), (x64[:1, :2],))


def test_rms_norm_removes_the_scale_but_not_the_mean():
    net, _ = _norm_pair()
    with torch.no_grad():
        net.weight.fill_(1.0)
        x = torch.randn(3, 16) + 5.0
        y = net(x)
    np.testing.assert_allclose(as_numpy(y.pow(2).mean(-1)), np.ones(3), atol=1e-4)  # unit mean square
    np.testing.assert_allclose(as_numpy(net(7 * x)), as_numpy(y), atol=1e-5)  # scale-invariant
    assert float(y.mean(-1).min()) > 0.5  # unlike LayerNorm, a shared offset survives


@FRAMEWORKS
def test_rms_norm_keeps_half_precision_inputs_in_their_dtype(framework):
    x = _random(2, 3, 16, seed=3) * 100
    net, twin = _norm_pair()
    if framework == "torch":
        out = net(torch.as_tensor(x, dtype=torch.float16))
        assert out.dtype == torch.float16 and torch.isfinite(out).all()
    else:
        # Keras casts a layer's inputs to its compute dtype: half precision is a dtype policy there.
        half = ck.RMSNorm(16, dtype="mixed_float16")
        half.build((None, None, 16))
        half.weight.assign(as_numpy(twin.weight))
        out = half(ops.cast(x, "float16"))
        assert keras.backend.standardize_dtype(out.dtype) == "float16" and np.isfinite(as_numpy(out)).all()
    expected = reference.rms_norm(x.astype("float64"), _array(net.weight))
    np.testing.assert_allclose(as_numpy(out).astype("float64"), expected, atol=1e-2, rtol=1e-2)


@FRAMEWORKS
def test_rms_norm_rejects_the_wrong_width(framework):
    net, twin = _norm_pair()
    with pytest.raises(ValueError, match=r"d_model=16"):
        (net(torch.zeros(2, 8)) if framework == "torch" else twin(np.zeros((2, 8), "float32")))


# ---------------------------------------------------------------------------------------------------------------
# Rotary position embedding
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 5])
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rotary_embedding_matches_the_oracle_at_any_offset(offset, base):
    x = _random(2, 3, 6, 8, seed=4)
    expected = reference.rotary_embedding(x.astype("float64"), offset, base)
    out_torch = ct.RotaryEmbedding(8, 16, base)(torch.as_tensor(x), offset)
    out_keras = ck.RotaryEmbedding(8, 16, base)(x, offset=offset)
    np.testing.assert_allclose(as_numpy(out_torch), expected, atol=ATOL)
    np.testing.assert_allclose(as_numpy(out_keras), expected, atol=ATOL)
    # A rotation keeps every pair's length.
    pairs = lambda y: y[..., :4] ** 2 + y[..., 4:] ** 2  # noqa: E731
    np.testing.assert_allclose(pairs(expected), pairs(x.astype("float64")), atol=1e-9)


def test_rotary_embedding_gradients_agree():
    x = _random(1, 2, 5, 8, seed=5)
    upstream = _random(1, 2, 5, 8, seed=6)
    xt = torch.tensor(x, requires_grad=True)
    (ct.RotaryEmbedding(8, 10)(xt, 3) * torch.as_tensor(upstream)).sum().backward()
    layer = ck.RotaryEmbedding(8, 10)
    (grad,) = keras_grad(lambda h: layer(h, offset=3) * upstream, x)
    np.testing.assert_allclose(xt.grad.numpy(), grad, atol=ATOL)
    # The map is a rotation R, so the gradient is R^T upstream: the rotation by minus the same angles.
    angles = reference.modern.rotary_angles(np.arange(3, 8), 8)
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))
    u = upstream.astype("float64")
    np.testing.assert_allclose(grad, u * cos - reference.rotate_half(u) * sin, atol=ATOL)


def test_a_rotary_score_depends_only_on_the_offset():
    rng = np.random.default_rng(7)
    q, k = rng.normal(size=(1, 1, 1, 16)), rng.normal(size=(1, 1, 1, 16))

    def score(m: int, n: int) -> float:
        qm = reference.rotary_embedding(q, m)
        kn = reference.rotary_embedding(k, n)
        return float((qm * kn).sum())

    for offset in (0, 3, 11):
        scores = [score(n + offset, n) for n in range(0, 40, 7)]
        np.testing.assert_allclose(scores, scores[0], atol=1e-9)
    assert abs(score(5, 0) - score(0, 0)) > 1e-3  # but it does depend on the offset


def test_the_interleaved_layout_is_the_same_rotation_up_to_a_permutation():
    x = np.random.default_rng(8).normal(size=(2, 3, 7, 12))
    perm = reference.interleave_permutation(12)
    np.testing.assert_allclose(reference.rotary_embedding_interleaved(x, 4)[..., perm],
                               reference.rotary_embedding(x[..., perm], 4), atol=1e-12)
    # So a checkpoint in one layout runs in the other once the columns of wq and wk are permuted within each
    # head: the scores are unchanged because q.k is a sum over coordinates, whatever their order.
    q, k = x[:, :, :, :], x[:, :, ::-1, :]
    interleaved = (reference.rotary_embedding_interleaved(q, 0) @ np.swapaxes(
        reference.rotary_embedding_interleaved(k, 0), -1, -2))
    half_split = reference.rotary_embedding(q[..., perm], 0) @ np.swapaxes(reference.rotary_embedding(k[..., perm], 0),
                                                                           -1, -2)
    np.testing.assert_allclose(half_split, interleaved, atol=1e-10)
    assert not np.allclose(reference.rotary_embedding(x, 4), reference.rotary_embedding_interleaved(x, 4))


@FRAMEWORKS
def test_rotary_embedding_rejects_bad_input(framework):
    make = ct.RotaryEmbedding if framework == "torch" else ck.RotaryEmbedding
    with pytest.raises(ValueError, match="even"):
        make(7, 10)
    layer = make(8, 10)

    def run(x, offset=0):
        return layer(torch.as_tensor(x), offset) if framework == "torch" else layer(x, offset=offset)

    with pytest.raises(ValueError, match=r"head_dim=8"):
        run(np.zeros((1, 2, 3, 6), "float32"))
    with pytest.raises(ValueError, match="max_len=10"):
        run(np.zeros((1, 2, 3, 8), "float32"), offset=8)


# ---------------------------------------------------------------------------------------------------------------
# SwiGLU
# ---------------------------------------------------------------------------------------------------------------


def test_swiglu_matches_the_oracle_with_gradients():
    torch.manual_seed(9)
    net, twin = _torch_and_keras(ct.SwiGLU(16, 24), ck.SwiGLU(16, 24), (None, None, 16))
    assert sum(p.numel() for p in net.parameters()) == 3 * 16 * 24 == twin.count_params()
    x = _random(2, 5, 16, seed=10)
    params = {f"w{n}": dense_numpy(getattr(net, f"w{n}"), np.float64)[0] for n in "123"}
    expected = reference.swiglu(x.astype("float64"), params)
    np.testing.assert_allclose(as_numpy(net(torch.as_tensor(x))), expected, atol=ATOL)
    np.testing.assert_allclose(as_numpy(twin(x)), expected, atol=ATOL)
    xt = torch.tensor(x, requires_grad=True)
    net(xt).sum().backward()
    (grad,) = keras_grad(twin, x)
    np.testing.assert_allclose(xt.grad.numpy(), grad, atol=ATOL)


# ---------------------------------------------------------------------------------------------------------------
# Sliding-window mask
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [1, 3, 20])
def test_sliding_window_mask_in_the_course_convention(window):
    expected = reference.sliding_window_mask(7, window)
    assert expected.shape == (1, 1, 7, 7) and expected.dtype == bool
    np.testing.assert_array_equal(as_numpy(ct.sliding_window_mask(7, window)), expected)
    np.testing.assert_array_equal(as_numpy(ck.sliding_window_mask(7, window)), expected)
    np.testing.assert_array_equal(expected.sum(-1)[0, 0], np.minimum(np.arange(1, 8), window))
    assert (expected <= reference.causal_mask(7)).all()  # never a future key
    if window >= 7:
        np.testing.assert_array_equal(expected, reference.causal_mask(7))
    with pytest.raises(ValueError, match="window"):
        ct.sliding_window_mask(7, 0)


def test_the_reach_of_stacked_windows_grows_by_window_minus_one_per_layer():
    """The chapter's statement: with the course's window of W positions (itself included), L layers reach
    L (W - 1) positions back."""
    length = 30
    for window in (2, 3, 5):
        one_layer = as_numpy(ct.sliding_window_mask(length, window))[0, 0].astype(np.int64)
        reach = np.eye(length, dtype=np.int64)
        for layers in range(1, 5):
            reach = np.minimum(one_layer @ reach, 1)
            assert length - 1 - reach[-1].nonzero()[0].min() == layers * (window - 1)


# ---------------------------------------------------------------------------------------------------------------
# Grouped-query attention and its cache
# ---------------------------------------------------------------------------------------------------------------


def _gqa_pair(num_heads=4, num_kv_heads=2, rope_base=10000.0, seed=11):
    torch.manual_seed(seed)
    net = ct.GroupedQueryAttention(16, num_heads, num_kv_heads, 12, rope_base).eval()
    twin = ck.GroupedQueryAttention(16, num_heads, num_kv_heads, 12, rope_base)
    return _torch_and_keras(net, twin, (None, None, 16))


def _gqa_params(layer):
    return {f"w{n}": dense_numpy(getattr(layer, f"w{n}"), np.float64)[0] for n in "qkvo"}


HEADS = pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])


@HEADS
@pytest.mark.parametrize("mask_kind", ["causal", "window"])
def test_grouped_query_attention_matches_the_oracle_with_gradients(num_kv_heads, mask_kind):
    net, twin = _gqa_pair(num_kv_heads=num_kv_heads)
    x = _random(2, 6, 16, seed=12)
    mask = reference.causal_mask(6) if mask_kind == "causal" else reference.sliding_window_mask(6, 3)
    expected = reference.grouped_query_attention(x.astype("float64"), _gqa_params(net), 4, num_kv_heads, mask)
    np.testing.assert_allclose(as_numpy(net(torch.as_tensor(x), torch.as_tensor(mask))), expected, atol=ATOL)
    np.testing.assert_allclose(as_numpy(twin(x, mask=mask)), expected, atol=ATOL)
    upstream = _random(2, 6, 16, seed=13)
    xt = torch.tensor(x, requires_grad=True)
    (net(xt, torch.as_tensor(mask)) * torch.as_tensor(upstream)).sum().backward()
    (grad,) = keras_grad(lambda h: twin(h, mask=mask) * upstream, x)
    np.testing.assert_allclose(xt.grad.numpy(), grad, atol=ATOL)
    assert sum(p.numel() for p in net.parameters()) == 2 * 16 * 16 + 2 * 16 * num_kv_heads * 4


def test_grouped_query_attention_without_rope_and_with_a_blind_row():
    net, twin = _gqa_pair(rope_base=None)
    x = _random(2, 5, 16, seed=14)
    mask = np.ones((2, 1, 5, 5), dtype=bool)
    mask[0, :, 2] = False  # query 2 of sentence 0 may see nothing: uniform weights, as in plain attention
    expected = reference.grouped_query_attention(x.astype("float64"), _gqa_params(net), 4, 2, mask, None)
    np.testing.assert_allclose(as_numpy(net(torch.as_tensor(x), torch.as_tensor(mask))), expected, atol=ATOL)
    np.testing.assert_allclose(as_numpy(twin(x, mask=mask)), expected, atol=ATOL)


@FRAMEWORKS
@HEADS
@pytest.mark.parametrize("window", [None, 2])
def test_the_cache_holds_only_the_kv_heads_and_changes_nothing(framework, num_kv_heads, window):
    net, twin = _gqa_pair(num_kv_heads=num_kv_heads)
    layer = net if framework == "torch" else twin
    x = _random(2, 7, 16, seed=15)
    full_mask = reference.causal_mask(7) if window is None else reference.sliding_window_mask(7, window)
    wrap = torch.as_tensor if framework == "torch" else (lambda a: a)
    full = as_numpy(layer(wrap(x), wrap(full_mask)) if framework == "torch" else layer(x, mask=full_mask))
    out, past = layer.forward_cached(wrap(x[:, :3]), None, wrap(full_mask[:, :, :3, :3]))
    outputs = [as_numpy(out)]
    for t in range(3, 7):
        out, past = layer.forward_cached(wrap(x[:, t : t + 1]), past, wrap(full_mask[:, :, t : t + 1, : t + 1]))
        outputs.append(as_numpy(out))
    assert tuple(past[0].shape) == tuple(past[1].shape) == (2, num_kv_heads, 7, 4)
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=ATOL)
    with pytest.raises(ValueError, match="num_kv_heads"):
        bad = (past[0][:, :1].repeat(1, 3, 1, 1) if framework == "torch" else ops.repeat(past[0][:, :1], 3, axis=1),
               past[1])
        layer.forward_cached(wrap(x[:, :1]), bad if num_kv_heads != 3 else None)


@FRAMEWORKS
def test_grouped_query_attention_rejects_bad_head_counts(framework):
    make = ct.GroupedQueryAttention if framework == "torch" else ck.GroupedQueryAttention
    with pytest.raises(ValueError, match="num_kv_heads"):
        make(16, 4, 3)
    with pytest.raises(ValueError, match="num_heads"):
        make(16, 3, 1)


# ---------------------------------------------------------------------------------------------------------------
# Online-softmax attention
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("block_size", [1, 7, 64])
def test_online_softmax_attention_equals_plain_attention(dtype, block_size):
    rng = np.random.default_rng(16)
    q, k, v = (rng.normal(size=s).astype(dtype) for s in [(2, 3, 19, 8), (2, 3, 23, 8), (2, 3, 23, 5)])
    q *= 4  # large scores: the running maximum has to move
    mask = rng.random((2, 1, 19, 23)) > 0.4
    mask[1, 0, 4] = False  # a fully masked row: uniform weights, like plain attention
    expected, _ = reference.scaled_dot_product_attention(q.astype("float64"), k, v, mask)
    tol = 1e-6
    np.testing.assert_allclose(reference.online_softmax_attention(q, k, v, mask, block_size), expected, atol=tol)
    out_torch = ct.online_softmax_attention(*map(torch.as_tensor, (q, k, v, mask)), block_size=block_size)
    out_keras = ck.online_softmax_attention(q, k, v, mask, block_size=block_size)
    np.testing.assert_allclose(as_numpy(out_torch), expected, atol=tol)
    np.testing.assert_allclose(as_numpy(out_keras), expected, atol=tol)


def test_online_softmax_attention_gradients_agree_with_plain_attention():
    rng = np.random.default_rng(17)
    q, k, v = (rng.normal(size=s).astype("float32") for s in [(1, 2, 9, 4), (1, 2, 11, 4), (1, 2, 11, 4)])
    mask = reference.causal_mask(11)[:, :, 2:]
    tensors = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    ct.online_softmax_attention(*tensors, torch.as_tensor(mask), block_size=4).sum().backward()
    plain = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    ct.scaled_dot_product_attention(*plain, torch.as_tensor(mask)).sum().backward()
    keras_grads = keras_grad(lambda a, b, c: ck.online_softmax_attention(a, b, c, mask, block_size=4), q, k, v)
    for name, online, reference_grad, keras_g in zip("qkv", tensors, plain, keras_grads, strict=True):
        np.testing.assert_allclose(online.grad.numpy(), reference_grad.grad.numpy(), atol=ATOL, err_msg=name)
        np.testing.assert_allclose(keras_g, reference_grad.grad.numpy(), atol=ATOL, err_msg=name)


@FRAMEWORKS
def test_online_softmax_attention_rejects_bad_input(framework):
    fn = ct.online_softmax_attention if framework == "torch" else ck.online_softmax_attention
    wrap = torch.as_tensor if framework == "torch" else (lambda a: a)
    q = wrap(np.zeros((1, 3, 4), "float32"))
    with pytest.raises(ValueError, match="block_size"):
        fn(q, q, q, block_size=0)
    with pytest.raises(ValueError, match="d_k=4"):
        fn(q, wrap(np.zeros((1, 3, 5), "float32")), q)


# ---------------------------------------------------------------------------------------------------------------
# The chapter's block diagram
# ---------------------------------------------------------------------------------------------------------------


def test_the_block_diagram_draws_each_residual_path_around_its_sublayer():
    from matplotlib.colors import same_color

    from companion.diagrams import RESIDUAL
    from companion.modern_diagrams import block_comparison

    ax = block_comparison().axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert "Chapter 8's GPT (GPT-2 layout)" in texts and "ReLU feed-forward, hidden 2048" in texts
    assert texts.count("+ (residual)") == 4  # one label for every addition, two per block
    bypasses = [line for line in ax.lines if same_color(line.get_color(), RESIDUAL) and len(line.get_xdata()) == 3]
    assert len(bypasses) == 4
    for line in bypasses:  # from the main path out to the left, then up: around a norm and a sublayer
        x, y = line.get_xdata(), line.get_ydata()
        assert x[0] > x[1] == x[2] and y[0] == y[1] < y[2] - 1.5
