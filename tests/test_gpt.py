"""The decoder-only GPT: PyTorch = Keras = NumPy oracle with the same weights, the parameter-count formula,
causality, bad input, saving, and ``generate`` (greedy and seeded sampling give the same tokens everywhere)."""

import os
import tempfile

import keras
import numpy as np
import pytest
import torch
from model_helpers import as_numpy, randomize_norms

from companion import reference
from companion.convert import copy_weights
from companion.keras import gpt as keras_gpt
from companion.reference import gpt as ref_gpt
from companion.torch import gpt as torch_gpt

VOCAB, D_MODEL, NUM_HEADS, NUM_LAYERS, D_FF, MAX_LEN = 23, 16, 4, 2, 32, 12
CONFIG = dict(d_model=D_MODEL, num_heads=NUM_HEADS, num_layers=NUM_LAYERS, d_ff=D_FF, max_len=MAX_LEN, dropout=0.0)
ATOL = 1e-5
TIE = pytest.mark.parametrize("tie_weights", [True, False], ids=["tied", "untied"])
IDS = np.random.default_rng(0).integers(0, VOCAB, size=(3, 7))




def gpt_pair(tie_weights: bool = True, seed: int = 0):
    """A torch GPT (eval mode, embeddings scaled up so the logits are not all near 0) and its Keras twin."""
    torch.manual_seed(seed)
    net = torch_gpt.GPT(VOCAB, **CONFIG, tie_weights=tie_weights).eval()
    randomize_norms(net, seed)
    with torch.no_grad():
        net.token_embed.weight.mul_(20.0)  # logits of order 1: greedy choices are not decided by round-off
    twin = keras_gpt.GPT(VOCAB, **CONFIG, tie_weights=tie_weights)
    twin(IDS)
    copy_weights(net, twin)
    return net, twin


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def pair(request):
    return gpt_pair(request.param)


def torch_logits(net, ids) -> np.ndarray:
    with torch.no_grad():
        return as_numpy(net(torch.as_tensor(ids)))


# ---------------------------------------------------------------------------------------------------------------
# Forward pass and weights
# ---------------------------------------------------------------------------------------------------------------


def test_logits_match_the_oracle_in_both_frameworks(pair):
    net, twin = pair
    expected = ref_gpt.gpt_forward(IDS, ref_gpt.gpt_params(net), NUM_HEADS)
    assert expected.shape == (3, 7, VOCAB)
    np.testing.assert_allclose(torch_logits(net, IDS), expected, atol=ATOL)
    np.testing.assert_allclose(as_numpy(twin(IDS)), expected, atol=ATOL)
    # The oracle reads the same numbers out of either model: copy_weights covered every weight.
    keras_params = ref_gpt.gpt_params(twin)
    np.testing.assert_allclose(ref_gpt.gpt_forward(IDS, keras_params, NUM_HEADS), expected, atol=1e-12)


def test_copy_weights_back_from_keras():
    net, twin = gpt_pair(seed=1)
    fresh = torch_gpt.GPT(VOCAB, **CONFIG).eval()
    assert not np.allclose(torch_logits(fresh, IDS), torch_logits(net, IDS), atol=1e-3)
    copy_weights(twin, fresh)
    np.testing.assert_allclose(torch_logits(fresh, IDS), torch_logits(net, IDS), atol=1e-6)


def test_tied_and_untied_models_do_not_exchange_weights():
    tied, untied_keras = torch_gpt.GPT(VOCAB, **CONFIG), keras_gpt.GPT(VOCAB, **CONFIG, tie_weights=False)
    untied_keras(IDS)
    with pytest.raises(ValueError, match="head"):
        copy_weights(tied, untied_keras)
    untied, tied_keras = torch_gpt.GPT(VOCAB, **CONFIG, tie_weights=False), keras_gpt.GPT(VOCAB, **CONFIG)
    tied_keras(IDS)
    with pytest.raises(ValueError, match="head"):
        copy_weights(untied, tied_keras)


def test_tied_output_layer_is_the_token_table():
    net = torch_gpt.GPT(VOCAB, **CONFIG)
    assert net.head is None
    h = torch.randn(2, 3, D_MODEL)
    with torch.no_grad():
        expected = net.norm(h) @ net.token_embed.weight.T  # (2, 3, vocab): one score per row of the table
        np.testing.assert_allclose(as_numpy(net._logits(h)), as_numpy(expected), atol=1e-6)


@TIE
@pytest.mark.parametrize("dims", [(23, 16, 2, 32, 12), (100, 32, 3, 64, 40)])
def test_parameter_count_formula(tie_weights, dims):
    vocab, d_model, num_layers, d_ff, max_len = dims
    net = torch_gpt.GPT(vocab, d_model, 4, num_layers, d_ff, max_len, tie_weights=tie_weights)
    twin = keras_gpt.GPT(vocab, d_model, 4, num_layers, d_ff, max_len, tie_weights=tie_weights)
    twin(np.zeros((1, 3), dtype="int32"))
    expected = reference.gpt_parameter_count(vocab, d_model, num_layers, d_ff, max_len, tie_weights)
    assert sum(p.numel() for p in net.parameters()) == expected
    assert twin.count_params() == expected
    untied = reference.gpt_parameter_count(vocab, d_model, num_layers, d_ff, max_len, tie_weights=False)
    assert untied - reference.gpt_parameter_count(vocab, d_model, num_layers, d_ff, max_len) == vocab * d_model


def test_parameter_count_of_the_default_model():
    # 512 wide, 6 blocks, d_ff 2048, 512 positions: 6 * 3,152,384 per block + tables + final norm.
    assert reference.gpt_parameter_count(1000) == 6 * 3_152_384 + (1000 + 512) * 512 + 1024
    assert sum(p.numel() for p in torch_gpt.GPT(1000).parameters()) == reference.gpt_parameter_count(1000)


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_a_position_never_sees_later_tokens(pair, framework):
    net, twin = pair
    changed = IDS.copy()
    changed[:, 4:] = (changed[:, 4:] + 1) % VOCAB

    def run(ids):
        return torch_logits(net, ids) if framework == "torch" else as_numpy(twin(ids))

    before, after = run(IDS), run(changed)
    np.testing.assert_allclose(after[:, :4], before[:, :4], atol=1e-6)
    assert not np.allclose(after[:, 4:], before[:, 4:], atol=1e-3)


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_bad_ids_are_rejected(framework):
    model = torch_gpt.GPT(VOCAB, **CONFIG) if framework == "torch" else keras_gpt.GPT(VOCAB, **CONFIG)

    def run(ids):
        return model(torch.as_tensor(ids)) if framework == "torch" else model(ids)

    with pytest.raises(ValueError, match="vocab_size"):
        run(np.array([[1, VOCAB]]))
    with pytest.raises(ValueError, match="max_len"):
        run(np.zeros((1, MAX_LEN + 1), dtype="int64"))
    with pytest.raises(ValueError, match=r"\(batch, "):
        run(np.zeros((2, 3, 4), dtype="int64"))
    with pytest.raises(ValueError, match="integer"):
        run(np.zeros((1, 3), dtype="float32"))
    with pytest.raises(ValueError, match="d_model"):
        (torch_gpt.GPT if framework == "torch" else keras_gpt.GPT)(VOCAB, d_model=0)


def test_dropout_only_in_training():
    net = torch_gpt.GPT(VOCAB, **{**CONFIG, "dropout": 0.5})
    ids = torch.as_tensor(IDS)
    net.train()
    assert not torch.equal(net(ids), net(ids))
    net.eval()
    assert torch.equal(net(ids), net(ids))


def test_keras_gpt_survives_a_keras_file():
    _, twin = gpt_pair(tie_weights=False)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "gpt.keras")
        twin.save(path)
        restored = keras.saving.load_model(path)
    np.testing.assert_array_equal(as_numpy(restored(IDS)), as_numpy(twin(IDS)))


# ---------------------------------------------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------------------------------------------

SAMPLING = pytest.mark.parametrize(
    "options",
    [dict(temperature=0.0), dict(temperature=1.0, seed=3), dict(temperature=0.7, top_k=4, seed=4),
     dict(temperature=1.3, top_p=0.8, seed=5), dict(top_k=6, top_p=0.9, seed=6)],
    ids=["greedy", "plain", "top-k", "top-p", "top-k+top-p"],
)


@SAMPLING
def test_generate_gives_the_same_tokens_in_torch_keras_and_the_oracle(pair, options):
    net, twin = pair
    prompt = IDS[:, :3]
    expected = ref_gpt.gpt_generate(prompt, ref_gpt.gpt_params(net), NUM_HEADS, 6, **options)
    out_torch = torch_gpt.generate(net, torch.as_tensor(prompt), 6, **options)
    out_keras = keras_gpt.generate(twin, prompt, 6, **options)
    assert out_torch.shape == (3, 9) and out_torch.dtype == torch.int64
    np.testing.assert_array_equal(as_numpy(out_torch), expected)
    np.testing.assert_array_equal(as_numpy(out_keras), expected)
    np.testing.assert_array_equal(expected[:, :3], prompt)  # the prompt comes back unchanged


def test_greedy_generation_follows_the_argmax(pair):
    net, _ = pair
    out = as_numpy(torch_gpt.generate(net, torch.as_tensor(IDS[:, :2]), 5, temperature=0.0))
    for step in range(2, 7):
        np.testing.assert_array_equal(out[:, step], torch_logits(net, out[:, :step])[:, -1].argmax(-1))


def test_seed_makes_sampling_reproducible(pair):
    net, twin = pair
    prompt = torch.as_tensor(IDS[:, :2])
    first = torch_gpt.generate(net, prompt, 8, seed=11)
    assert torch.equal(first, torch_gpt.generate(net, prompt, 8, seed=11))
    others = [torch_gpt.generate(net, prompt, 8, seed=s) for s in (12, 13, 14)]
    assert any(not torch.equal(first, other) for other in others)
    np.testing.assert_array_equal(as_numpy(keras_gpt.generate(twin, IDS[:, :2], 8, seed=11)), as_numpy(first))


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_generate_checks_its_arguments(framework):
    module = torch_gpt if framework == "torch" else keras_gpt
    model = module.GPT(VOCAB, **CONFIG)
    prompt = np.ones((2, 4), dtype="int64")
    assert tuple(module.generate(model, prompt, 0).shape) == (2, 4)
    assert tuple(module.generate(model, prompt, MAX_LEN - 4).shape) == (2, MAX_LEN)
    with pytest.raises(ValueError, match="max_len"):
        module.generate(model, prompt, MAX_LEN - 3)
    with pytest.raises(ValueError, match="temperature"):
        module.generate(model, prompt, 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        module.generate(model, prompt, 2, top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        module.generate(model, prompt, 2, top_p=1.5)
    with pytest.raises(ValueError, match=r"\(batch, "):
        module.generate(model, np.ones(4, dtype="int64"), 2)


def test_generate_restores_training_mode():
    net = torch_gpt.GPT(VOCAB, **CONFIG).train()
    torch_gpt.generate(net, torch.ones(1, 2, dtype=torch.long), 2, temperature=0.0)
    assert net.training
