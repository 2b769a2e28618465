"""The Llama-style ModernDecoder: PyTorch = Keras = NumPy oracle with the same weights (tied and untied, with and
without a sliding window), the parameter-count formula, causality, the key/value cache of the kv heads, generation
(the same tokens everywhere, with and without the cache), bad input and saving."""

import os
import tempfile

import keras
import numpy as np
import pytest
import torch
from model_helpers import as_numpy

from companion import reference
from companion.convert import copy_weights
from companion.keras import ModernDecoder as KerasModernDecoder
from companion.keras import generate as keras_generate
from companion.torch import ModernDecoder as TorchModernDecoder
from companion.torch import generate as torch_generate

VOCAB, D_MODEL, NUM_HEADS, NUM_KV_HEADS, NUM_LAYERS, D_FF, MAX_LEN = 23, 16, 4, 2, 2, 24, 16
CONFIG = dict(d_model=D_MODEL, num_heads=NUM_HEADS, num_kv_heads=NUM_KV_HEADS, num_layers=NUM_LAYERS, d_ff=D_FF,
              max_len=MAX_LEN)
ATOL = 1e-5
IDS = np.random.default_rng(0).integers(0, VOCAB, size=(3, 9))
VARIANTS = [dict(tie_weights=True), dict(tie_weights=False), dict(tie_weights=True, window=3),
            dict(tie_weights=False, num_kv_heads=1), dict(tie_weights=True, num_kv_heads=4)]
VARIANT_IDS = ["tied", "untied", "window3", "mqa", "mha"]


def decoder_pair(seed: int = 0, **options):
    """A torch ModernDecoder (token table scaled up so that logits are of order 1 and greedy choices are not decided
    by round-off, RMSNorm gains randomised so that a missing gain shows) and its Keras twin."""
    torch.manual_seed(seed)
    config = {**CONFIG, **options}
    net = TorchModernDecoder(VOCAB, **config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        net.token_embed.weight.mul_(20.0)
        for module in net.modules():
            if type(module).__name__ == "RMSNorm":
                module.weight.copy_(1 + 0.3 * torch.randn(module.weight.shape, generator=generator))
    twin = KerasModernDecoder(VOCAB, **config)
    twin(IDS)
    copy_weights(net, twin)
    return net, twin, config


@pytest.fixture(scope="module", params=VARIANTS, ids=VARIANT_IDS)
def pair(request):
    return decoder_pair(**request.param)


def torch_logits(net, ids) -> np.ndarray:
    with torch.no_grad():
        return as_numpy(net(torch.as_tensor(ids)))


def oracle_logits(net, config, ids) -> np.ndarray:
    params = reference.modern_decoder_params(net)
    return reference.modern_decoder_forward(ids, params, config["num_heads"], config["num_kv_heads"],
                                            config.get("window"))


def test_logits_match_the_oracle_in_both_frameworks(pair):
    net, twin, config = pair
    expected = oracle_logits(net, config, IDS)
    assert expected.shape == (3, 9, VOCAB) and np.abs(expected).max() > 1  # logits of order 1, not all near 0
    np.testing.assert_allclose(torch_logits(net, IDS), expected, atol=ATOL)
    np.testing.assert_allclose(as_numpy(twin(IDS)), expected, atol=ATOL)
    np.testing.assert_allclose(oracle_logits(twin, config, IDS), expected, atol=1e-12)  # every weight copied


def test_copy_weights_back_from_keras():
    net, twin, config = decoder_pair(seed=1, tie_weights=False)
    fresh = TorchModernDecoder(VOCAB, **config).eval()
    assert not np.allclose(torch_logits(fresh, IDS), torch_logits(net, IDS), atol=1e-3)
    copy_weights(twin, fresh)
    np.testing.assert_allclose(torch_logits(fresh, IDS), torch_logits(net, IDS), atol=1e-6)


@pytest.mark.parametrize("tie_weights", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (8, 1)], ids=["mha", "gqa", "mqa"])
def test_parameter_count_formula(tie_weights, heads):
    num_heads, num_kv_heads = heads
    config = {**CONFIG, "num_heads": num_heads, "num_kv_heads": num_kv_heads, "tie_weights": tie_weights}
    net, twin = TorchModernDecoder(VOCAB, **config), KerasModernDecoder(VOCAB, **config)
    twin(IDS)
    expected = reference.modern_decoder_parameter_count(VOCAB, D_MODEL, num_heads, num_kv_heads, NUM_LAYERS, D_FF,
                                                        tie_weights)
    assert sum(p.numel() for p in net.parameters()) == expected == twin.count_params()


def test_parameter_count_of_the_default_model():
    # 512 wide, 8 query heads of 64, 2 kv heads, 6 blocks, SwiGLU 1376: per block 2*512*512 + 2*512*128
    # + 3*512*1376 + 2*512 = 2,769,920; plus the token table and the final gain.
    assert reference.modern_decoder_parameter_count(1000) == 6 * 2_769_920 + 1000 * 512 + 512
    assert sum(p.numel() for p in TorchModernDecoder(1000).parameters()) == reference.modern_decoder_parameter_count(
        1000)


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_a_position_never_sees_later_tokens_nor_beyond_its_window(framework):
    net, twin, _ = decoder_pair(window=3)

    def run(ids):
        return torch_logits(net, ids) if framework == "torch" else as_numpy(twin(ids))

    before = run(IDS)
    later = IDS.copy()
    later[:, 5:] = (later[:, 5:] + 1) % VOCAB
    np.testing.assert_allclose(run(later)[:, :5], before[:, :5], atol=1e-6)
    assert not np.allclose(run(later)[:, 5:], before[:, 5:], atol=1e-3)
    # With 2 blocks and a window of 3, position 8 sees positions 4..8 at most (the windows chain): token 0 to 3
    # cannot reach it, token 4 can.
    early = IDS.copy()
    early[:, :4] = (early[:, :4] + 1) % VOCAB
    np.testing.assert_allclose(run(early)[:, 8], before[:, 8], atol=1e-6)
    reaching = IDS.copy()
    reaching[:, 4] = (reaching[:, 4] + 1) % VOCAB
    assert not np.allclose(run(reaching)[:, 8], before[:, 8], atol=1e-3)


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_cached_logits_equal_uncached_and_the_cache_holds_kv_heads_only(pair, framework):
    net, twin, config = pair
    model = net if framework == "torch" else twin
    wrap = torch.as_tensor if framework == "torch" else (lambda a: a)
    full = torch_logits(net, IDS) if framework == "torch" else as_numpy(twin(IDS))
    with torch.no_grad():
        logits, cache = model.forward_cached(wrap(IDS[:, :4]))
        steps = [as_numpy(logits)]
        for t in range(5, 10):
            logits, cache = model.forward_cached(wrap(IDS[:, :t]), cache)
            steps.append(as_numpy(logits))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=ATOL)
    head_dim = D_MODEL // config["num_heads"]
    assert len(cache) == NUM_LAYERS
    assert all(tuple(t.shape) == (3, config["num_kv_heads"], 9, head_dim) for kv in cache for t in kv)


SAMPLING = pytest.mark.parametrize(
    "options", [dict(temperature=0.0), dict(temperature=1.0, seed=3), dict(temperature=0.7, top_k=4, seed=4)],
    ids=["greedy", "plain", "top-k"],
)


@SAMPLING
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_generate_gives_the_same_tokens_in_torch_keras_and_the_oracle(pair, options, use_cache):
    net, twin, config = pair
    prompt = IDS[:, :3]
    expected = reference.modern_decoder_generate(prompt, reference.modern_decoder_params(net), config["num_heads"],
                                                 config["num_kv_heads"], 7, window=config.get("window"), **options)
    out_torch = torch_generate(net, torch.as_tensor(prompt), 7, use_cache=use_cache, **options)
    out_keras = keras_generate(twin, prompt, 7, use_cache=use_cache, **options)
    np.testing.assert_array_equal(as_numpy(out_torch), expected)
    np.testing.assert_array_equal(as_numpy(out_keras), expected)


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_bad_input_is_rejected(framework):
    make = TorchModernDecoder if framework == "torch" else KerasModernDecoder
    model = make(VOCAB, **CONFIG)

    def run(ids):
        return model(torch.as_tensor(ids)) if framework == "torch" else model(ids)

    with pytest.raises(ValueError, match="vocab_size"):
        run(np.array([[1, VOCAB]]))
    with pytest.raises(ValueError, match="max_len"):
        run(np.zeros((1, MAX_LEN + 1), dtype="int64"))
    with pytest.raises(ValueError, match=r"\(batch, "):
        run(np.zeros((2, 3, 4), dtype="int64"))
    with pytest.raises(ValueError, match="num_kv_heads"):
        make(VOCAB, **{**CONFIG, "num_kv_heads": 3})
    with pytest.raises(ValueError, match="window"):
        make(VOCAB, **CONFIG, window=0)
    with pytest.raises(ValueError, match="cache holds 4"):
        _, cache = model.forward_cached(torch.as_tensor(IDS[:, :4]) if framework == "torch" else IDS[:, :4])
        model.forward_cached(torch.as_tensor(IDS[:, :4]) if framework == "torch" else IDS[:, :4], cache)


def test_keras_modern_decoder_survives_a_keras_file():
    _, twin, _ = decoder_pair(tie_weights=False, window=4)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "modern.keras")
        twin.save(path)
        restored = keras.saving.load_model(path)
    np.testing.assert_array_equal(as_numpy(restored(IDS)), as_numpy(twin(IDS)))


def test_training_step_moves_every_weight():
    net, _, _ = decoder_pair(tie_weights=False)
    net.train()
    ids = torch.as_tensor(IDS)
    loss = torch.nn.functional.cross_entropy(net(ids[:, :-1]).reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    loss.backward()
    without_gradient = [name for name, p in net.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert without_gradient == []


BACKEND_SCRIPT = """
import json, sys
import numpy as np
from keras import ops
import companion.keras as ck
from companion import reference
ids = np.random.default_rng(0).integers(0, 30, (2, 7))
model = ck.ModernDecoder(30, d_model=16, num_heads=4, num_kv_heads=2, num_layers=2, d_ff=24, max_len=12, window=3,
                         tie_weights=False)
full = ops.convert_to_numpy(model(ids))
expected = reference.modern_decoder_forward(ids, reference.modern_decoder_params(model), 4, 2, 3)
logits, cache = model.forward_cached(ids[:, :3])
steps = [ops.convert_to_numpy(logits)]
for t in range(4, 8):
    logits, cache = model.forward_cached(ids[:, :t], cache)
    steps.append(ops.convert_to_numpy(logits))
q, k = np.random.default_rng(1).normal(size=(2, 1, 2, 9, 4)).astype("float32")
online = ops.convert_to_numpy(ck.online_softmax_attention(q, k, k, None, 4))
plain = reference.scaled_dot_product_attention(q.astype("float64"), k, k)[0]
print(json.dumps({"logits": float(np.abs(full - expected).max()),
                  "cache": float(np.abs(np.concatenate(steps, 1) - full).max()),
                  "online": float(np.abs(online - plain).max())}))
"""


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_the_keras_model_runs_on_other_backends(backend):
    """The Keras twin uses keras.ops only: the same numbers on the torch and JAX backends as on TensorFlow."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    if backend == "jax":
        pytest.importorskip("jax")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(root), "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", BACKEND_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    differences = json.loads(result.stdout.strip().splitlines()[-1])
    assert max(differences.values()) < ATOL, differences


def test_the_block_diagram_shows_the_shapes_the_oracle_computes():
    from matplotlib.figure import Figure

    from companion.modern_diagrams import block_comparison, block_shapes

    shapes = block_shapes(d_model=64, num_heads=8, num_kv_heads=2, d_ff=96, batch=3, seq_len=7)
    assert shapes["gpt_kv"] == (3, 8, 7, 8) and shapes["modern_kv"] == (3, 2, 7, 8)
    assert shapes["swiglu_hidden"] == (3, 7, 96) and shapes["gpt_hidden"] == (3, 7, 256)
    fig = block_comparison(d_model=64, num_heads=8, num_kv_heads=2, d_ff=96, batch=3, seq_len=7)
    assert isinstance(fig, Figure)
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "(batch 3, kv_heads 2, seq_len 7, d_head 8)" in texts and "hidden 96" in texts
    with pytest.raises(ValueError, match="num_kv_heads"):
        block_shapes(d_model=64, num_heads=8, num_kv_heads=3)
