"""Checks of the Keras layers against the NumPy oracle, runnable under any Keras backend.

Keras picks its backend once per process (``KERAS_BACKEND`` at the first import), so the main test process, on
TensorFlow, cannot test the other backends. ``tests/test_multihead.py`` runs this file in a subprocess::

    KERAS_BACKEND=torch python tests/keras_backends.py          # every check
    KERAS_BACKEND=torch python tests/keras_backends.py sdpa     # the checks whose name contains "sdpa"

and also runs every check in process, on TensorFlow. To add a check, write a function with no argument that
raises AssertionError on failure and decorate it with ``@check``. The file is not collected by pytest (no
``test_`` prefix); ``keras_grad`` is shared with the test files.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make `companion` importable

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

from companion import reference  # noqa: E402
from companion.keras import MultiHeadAttention, causal_mask, combine_masks, padding_mask  # noqa: E402
from companion.keras import scaled_dot_product_attention as keras_sdpa  # noqa: E402

CHECKS: list[Callable[[], None]] = []
ATOL = 1e-5  # float32 against the float64 oracle


def check(fn: Callable[[], None]) -> Callable[[], None]:
    """Register ``fn`` as a backend check."""
    CHECKS.append(fn)
    return fn


def to_numpy(x) -> np.ndarray:
    return ops.convert_to_numpy(x)


def keras_grad(fn: Callable, *inputs: np.ndarray) -> list[np.ndarray]:
    """Gradients of ``sum(fn(*inputs))`` with respect to each input, on whatever backend Keras runs.

    The layers use ``keras.ops`` only; taking a gradient is the one step each backend spells its own way.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        xs = [tf.constant(x) for x in inputs]
        with tf.GradientTape() as tape:
            tape.watch(xs)
            total = tf.reduce_sum(fn(*xs))
        return [g.numpy() for g in tape.gradient(total, xs)]
    if backend == "torch":
        import torch

        xs = [torch.tensor(x, requires_grad=True) for x in inputs]
        fn(*xs).sum().backward()
        return [x.grad.numpy() for x in xs]
    if backend == "jax":
        import jax

        grads = jax.grad(lambda *xs: fn(*xs).sum(), argnums=tuple(range(len(inputs))))(*inputs)
        return [np.asarray(g) for g in grads]
    raise NotImplementedError(f"no gradient helper for the {backend} backend")


def _random(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def _masks(batch: int = 2, length: int = 5) -> dict[str, np.ndarray]:
    """Reference masks. Row 1 is left padded, so 'combined' has fully masked rows (queries 0, 1 see only padding)."""
    ids = np.array([[3, 4, 5, 0, 0], [0, 0, 6, 7, 8]])[:batch, :length]
    return {
        "padding": reference.padding_mask(ids),
        "causal": reference.causal_mask(length),
        "combined": reference.combine_masks(reference.padding_mask(ids), reference.causal_mask(length)),
    }


def _mha_pair(d_model: int = 16, num_heads: int = 4, length: int = 5):
    """A built Keras MultiHeadAttention and its weights as the oracle's dict."""
    mha = MultiHeadAttention(d_model, num_heads)
    x = _random(2, length, d_model)
    mha(x, x, x)
    params = {}
    for name in "qkvo":
        dense = getattr(mha, f"w{name}")
        params[f"w{name}"], params[f"b{name}"] = to_numpy(dense.kernel), to_numpy(dense.bias)
    return mha, {k: v.astype("float64") for k, v in params.items()}


@check
def masks_match_reference() -> None:
    ids = np.array([[3, 4, 0], [5, 0, 0]])
    np.testing.assert_array_equal(to_numpy(padding_mask(ids)), reference.padding_mask(ids))
    np.testing.assert_array_equal(to_numpy(causal_mask(4)), reference.causal_mask(4))
    combined = combine_masks(padding_mask(ids), None, causal_mask(3))
    expected = reference.combine_masks(reference.padding_mask(ids), reference.causal_mask(3))
    np.testing.assert_array_equal(to_numpy(combined), expected)
    assert combine_masks(None, None) is None


@check
def sdpa_matches_reference() -> None:
    q, k, v = _random(2, 3, 5, 8, seed=1), _random(2, 3, 5, 8, seed=2), _random(2, 3, 5, 4, seed=3)
    for name, mask in {"none": None, **_masks()}.items():
        out, weights = keras_sdpa(q, k, v, mask, return_weights=True)
        ref_out, ref_weights = reference.scaled_dot_product_attention(*(x.astype("float64") for x in (q, k, v)), mask)
        np.testing.assert_allclose(to_numpy(out), ref_out, atol=ATOL, err_msg=f"mask={name}")
        np.testing.assert_allclose(to_numpy(weights), ref_weights, atol=ATOL, err_msg=f"mask={name}")


@check
def mha_matches_reference() -> None:
    mha, params = _mha_pair()
    x, memory = _random(2, 5, 16, seed=4), _random(2, 7, 16, seed=5)
    cases = {"none": (x, None), **{name: (x, mask) for name, mask in _masks().items()}}
    cases["cross"] = (memory, reference.padding_mask(np.array([[1, 2, 3, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]])))
    for name, (kv, mask) in cases.items():
        out, weights = mha(x, kv, kv, mask, return_weights=True)
        ref_out, ref_weights = reference.multi_head_attention(
            x.astype("float64"), kv.astype("float64"), kv.astype("float64"), params, 4, mask
        )
        np.testing.assert_allclose(to_numpy(out), ref_out, atol=ATOL, err_msg=f"case={name}")
        np.testing.assert_allclose(to_numpy(weights), ref_weights, atol=ATOL, err_msg=f"case={name}")


@check
def mha_gradient_matches_finite_differences() -> None:
    # A central difference on the float64 oracle checks the backend's gradient of sum(out) w.r.t. the query.
    mha, params = _mha_pair(d_model=8, num_heads=2, length=3)
    x = _random(1, 3, 8, seed=6)
    mask = reference.causal_mask(3)
    (grad,) = keras_grad(lambda q: mha(q, ops.convert_to_tensor(x), ops.convert_to_tensor(x), mask), x)
    numeric = np.zeros_like(grad, dtype="float64")
    step = 1e-6
    for index in np.ndindex(x.shape):
        plus, minus = x.astype("float64"), x.astype("float64")
        plus[index] += step
        minus[index] -= step
        f_plus = reference.multi_head_attention(plus, x, x, params, 2, mask)[0].sum()
        f_minus = reference.multi_head_attention(minus, x, x, params, 2, mask)[0].sum()
        numeric[index] = (f_plus - f_minus) / (2 * step)
    np.testing.assert_allclose(grad, numeric, atol=1e-4)


@check
def mha_keras_file_round_trip() -> None:
    inputs = keras.Input((None, 16))
    model = keras.Model(inputs, MultiHeadAttention(16, 4)(inputs, inputs, inputs))
    x = _random(2, 5, 16, seed=7)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "mha.keras")
        model.save(path)
        restored = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_numpy(restored(x)), to_numpy(model(x)))


# --- positional encoding, Add & Norm, encoder/decoder layers, the Transformer (companion.keras.{positional,
# addnorm,model}); the weights are read back with companion.reference.model's extractors.


@check
def positional_encoding_matches_reference() -> None:
    from companion.keras import PositionalEncoding, sinusoidal_positional_encoding

    np.testing.assert_allclose(
        to_numpy(sinusoidal_positional_encoding(64, 16)), reference.sinusoidal_positional_encoding(64, 16), atol=1e-6
    )
    x = _random(2, 5, 16, seed=20)
    out = PositionalEncoding(16, max_len=8)(x)
    np.testing.assert_allclose(to_numpy(out), x + reference.sinusoidal_positional_encoding(5, 16), atol=1e-6)


@check
def addnorm_and_feed_forward_match_reference() -> None:
    from companion.keras import AddNorm, PositionwiseFeedForward
    from companion.reference.model import feed_forward_params, norm_params

    x = _random(2, 5, 16, seed=21) * 0.1
    ffn = PositionwiseFeedForward(16, 32)
    ffn.build((None, None, 16))
    ffn_params = feed_forward_params(ffn)
    for norm_first in (False, True):
        addnorm = AddNorm(16, norm_first=norm_first)
        addnorm.build((None, None, 16))
        addnorm.norm.gamma.assign(1 + _random(16, seed=22))
        expected = reference.add_norm(
            x.astype("float64"),
            lambda h: reference.feed_forward(h, ffn_params),
            **norm_params(addnorm.norm),
            norm_first=norm_first,
        )
        np.testing.assert_allclose(to_numpy(addnorm(x, sublayer=ffn)), expected, atol=ATOL, err_msg=f"{norm_first=}")


@check
def encoder_and_decoder_layers_match_reference() -> None:
    from companion.keras import DecoderLayer, EncoderLayer
    from companion.reference.model import decoder_layer_params, encoder_layer_params

    x, memory = _random(2, 5, 16, seed=23), _random(2, 7, 16, seed=24)
    self_mask = _masks()["combined"]
    memory_mask = reference.padding_mask(np.array([[1, 2, 3, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]]))
    for norm_first in (False, True):
        encoder_layer = EncoderLayer(16, 4, 32, norm_first=norm_first)
        out = encoder_layer(memory, mask=memory_mask)
        expected = reference.encoder_layer(
            memory.astype("float64"), encoder_layer_params(encoder_layer), 4, memory_mask, norm_first
        )
        np.testing.assert_allclose(to_numpy(out), expected, atol=ATOL, err_msg=f"encoder {norm_first=}")
        decoder_layer = DecoderLayer(16, 4, 32, norm_first=norm_first)
        out = decoder_layer(x, memory, self_mask=self_mask, memory_mask=memory_mask)
        expected = reference.decoder_layer(
            x.astype("float64"), memory.astype("float64"), decoder_layer_params(decoder_layer), 4, self_mask,
            memory_mask, norm_first,
        )
        np.testing.assert_allclose(to_numpy(out), expected, atol=ATOL, err_msg=f"decoder {norm_first=}")


@check
def transformer_matches_reference_and_survives_a_keras_file() -> None:
    from companion.keras import Transformer

    src = np.array([[3, 4, 5, 0, 0, 0], [1, 2, 3, 4, 5, 6]])
    tgt = np.array([[1, 2, 0, 0], [4, 5, 6, 7]])
    model = Transformer(9, 10, d_model=16, num_heads=4, num_layers=1, d_ff=32, max_len=8, dropout=0.0)
    logits = to_numpy(model(src, tgt))
    expected = reference.transformer(src, tgt, reference.transformer_params(model), num_heads=4)
    np.testing.assert_allclose(logits, expected, atol=1e-4)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "transformer.keras")
        model.save(path)
        restored = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_numpy(restored(src, tgt)), logits)


def main(patterns: list[str]) -> int:
    """Run the checks whose name contains one of ``patterns`` (all when empty); return the number that failed."""
    print(f"keras {keras.__version__}, backend: {keras.backend.backend()}")
    selected = [fn for fn in CHECKS if not patterns or any(p in fn.__name__ for p in patterns)]
    failed = 0
    for fn in selected:
        try:
            fn()
            print(f"ok    {fn.__name__}")
        except Exception:
            failed += 1
            print(f"FAIL  {fn.__name__}\n{traceback.format_exc()}")
    print(f"{len(selected) - failed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1:]) else 0)
