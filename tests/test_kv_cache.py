"""The key/value cache: the same logits (within 1e-5) and the same tokens as recomputing everything, in PyTorch and
Keras, for multi-head attention, GPT and the encoder-decoder Transformer (greedy decoding and beam search); the
cross-attention keys and values are computed once per sentence."""

import numpy as np
import pytest
import torch
from model_helpers import as_numpy, randomize_norms
from torch import nn

from companion.convert import copy_weights
from companion.keras import gpt as keras_gpt
from companion.keras import kv_cache as keras_kv
from companion.keras import model as keras_model
from companion.keras import training as keras_training
from companion.keras.multihead import MultiHeadAttention as KerasMHA
from companion.torch import gpt as torch_gpt
from companion.torch import kv_cache as torch_kv
from companion.torch import model as torch_model
from companion.torch import training as torch_training
from companion.torch.masking import causal_mask
from companion.torch.multihead import MultiHeadAttention as TorchMHA

ATOL = 1e-5
FRAMEWORKS = pytest.mark.parametrize("framework", ["torch", "keras"])
VOCAB, MAX_LEN = 19, 24
BOS, EOS, PAD = 1, 2, 0




# ---------------------------------------------------------------------------------------------------------------
# Multi-head attention
# ---------------------------------------------------------------------------------------------------------------


@FRAMEWORKS
def test_attention_from_projected_keys_equals_the_plain_call(framework):
    rng = np.random.default_rng(0)
    x, memory = rng.normal(size=(2, 5, 16)).astype("float32"), rng.normal(size=(2, 7, 16)).astype("float32")
    mask = np.ones((2, 1, 1, 7), dtype=bool)
    mask[0, ..., 4:] = False
    if framework == "torch":
        mha = TorchMHA(16, 4).eval()
        x, memory, mask = torch.as_tensor(x), torch.as_tensor(memory), torch.as_tensor(mask)
    else:
        mha = KerasMHA(16, 4)
        mha(x, memory, memory)
    k, v = mha.project_key_value(memory, memory)
    assert tuple(k.shape) == (2, 4, 7, 4)
    np.testing.assert_allclose(as_numpy(mha.attend_projected(x, k, v, mask)), as_numpy(mha(x, memory, memory, mask)),
                               atol=ATOL)
    with pytest.raises(ValueError, match="num_heads"):
        mha.attend_projected(x, k[:, :2], v[:, :2])


@FRAMEWORKS
def test_self_attention_grown_one_position_at_a_time_equals_causal_attention(framework):
    x = np.random.default_rng(1).normal(size=(2, 6, 16)).astype("float32")
    if framework == "torch":
        mha, x = TorchMHA(16, 4).eval(), torch.as_tensor(x)
        full = mha(x, x, x, causal_mask(6))
    else:
        mha = KerasMHA(16, 4)
        full = mha(x, x, x, as_numpy(causal_mask(6)))
    past, outputs = None, []
    for position in range(6):
        out, past = mha.self_attention_cached(x[:, position : position + 1], past)
        outputs.append(as_numpy(out))
    assert tuple(past[0].shape) == (2, 4, 6, 4)
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), as_numpy(full), atol=ATOL)


# ---------------------------------------------------------------------------------------------------------------
# GPT
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpts():
    torch.manual_seed(0)
    net = torch_gpt.GPT(VOCAB, d_model=16, num_heads=4, num_layers=2, d_ff=32, max_len=MAX_LEN, dropout=0.0).eval()
    randomize_norms(net)
    with torch.no_grad():
        net.token_embed.weight.mul_(20.0)  # logits of order 1
    twin = keras_gpt.GPT(VOCAB, d_model=16, num_heads=4, num_layers=2, d_ff=32, max_len=MAX_LEN, dropout=0.0)
    twin(np.zeros((1, 2), dtype="int32"))
    copy_weights(net, twin)
    return {"torch": net, "keras": twin}


def gpt_logits(model, ids) -> np.ndarray:
    if isinstance(model, nn.Module):
        with torch.no_grad():
            return as_numpy(model(torch.as_tensor(ids)))
    return as_numpy(model(ids))


def cached(model, ids, cache):
    ids = torch.as_tensor(ids) if isinstance(model, nn.Module) else ids
    with torch.no_grad():
        logits, cache = model.forward_cached(ids, cache)
    return as_numpy(logits), cache


@FRAMEWORKS
def test_gpt_cached_logits_equal_uncached_at_every_step(gpts, framework):
    model = gpts[framework]
    ids = np.random.default_rng(2).integers(0, VOCAB, size=(3, 20))
    full = gpt_logits(model, ids)
    # A prompt of 5 in one go (prefill), then one token at a time, then a chunk of 4.
    logits, cache = cached(model, ids[:, :5], None)
    np.testing.assert_allclose(logits, full[:, :5], atol=ATOL)
    for length in range(6, 17):
        logits, cache = cached(model, ids[:, :length], cache)
        assert logits.shape == (3, 1, VOCAB)
        np.testing.assert_allclose(logits[:, 0], gpt_logits(model, ids[:, :length])[:, -1], atol=ATOL)
    logits, cache = cached(model, ids, cache)
    np.testing.assert_allclose(logits, full[:, 16:], atol=ATOL)
    assert len(cache) == 2 and tuple(cache[0][0].shape) == (3, 4, 20, 4)


@pytest.mark.parametrize("options", [dict(temperature=0.0), dict(temperature=1.2, top_k=8, top_p=0.95, seed=5)],
                         ids=["greedy", "sampled"])
def test_gpt_generate_gives_the_same_tokens_with_and_without_cache(gpts, options):
    prompt = np.random.default_rng(3).integers(0, VOCAB, size=(4, 3))
    outputs = {
        "torch cached": torch_gpt.generate(gpts["torch"], torch.as_tensor(prompt), 12, **options),
        "torch uncached": torch_gpt.generate(gpts["torch"], torch.as_tensor(prompt), 12, **options, use_cache=False),
        "keras cached": keras_gpt.generate(gpts["keras"], prompt, 12, **options),
        "keras uncached": keras_gpt.generate(gpts["keras"], prompt, 12, **options, use_cache=False),
    }
    expected = as_numpy(outputs["torch uncached"])
    assert expected.shape == (4, 15)
    for name, out in outputs.items():
        np.testing.assert_array_equal(as_numpy(out), expected, err_msg=name)


@FRAMEWORKS
def test_gpt_cache_misuse_is_rejected(gpts, framework):
    model = gpts[framework]
    ids = np.ones((2, 4), dtype="int64")
    _, cache = cached(model, ids, None)
    with pytest.raises(ValueError, match="cache holds 4"):
        cached(model, ids, cache)  # nothing new to compute
    with pytest.raises(ValueError, match="batch"):
        cached(model, np.ones((3, 5), dtype="int64"), cache)
    with pytest.raises(ValueError, match="max_len"):
        cached(model, np.ones((2, MAX_LEN + 1), dtype="int64"), cache)


# ---------------------------------------------------------------------------------------------------------------
# The encoder-decoder Transformer: greedy decoding and beam search
# ---------------------------------------------------------------------------------------------------------------

SRC = np.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14], [3, 4, 0, 0, 0, 0]])


@pytest.fixture(scope="module", ids=["post-LN", "pre-LN", "shared-embeddings"],
                params=[dict(norm_first=False), dict(norm_first=True), dict(shared_embeddings=True)])
def transformers(request):
    torch.manual_seed(1)
    config = dict(d_model=16, num_heads=4, num_layers=2, d_ff=32, max_len=MAX_LEN, dropout=0.0, **request.param)
    net = torch_model.Transformer(VOCAB, VOCAB, **config).eval()
    randomize_norms(net, 1)
    twin = keras_model.Transformer(VOCAB, VOCAB, **config)
    twin(SRC, SRC[:, :3])
    copy_weights(net, twin)
    return {"torch": net, "keras": twin}


@FRAMEWORKS
def test_decoder_cached_logits_equal_uncached(transformers, framework):
    model = transformers[framework]
    kv = torch_kv if framework == "torch" else keras_kv
    tgt = np.array([[1, 4, 5, 6, 2, 0, 0], [1, 7, 8, 9, 10, 11, 12], [1, 3, 2, 0, 0, 0, 0]])
    src, tgt_in = (torch.as_tensor(SRC), torch.as_tensor(tgt)) if framework == "torch" else (SRC, tgt)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        full = as_numpy(model.decode(tgt_in, memory, src_mask))
        cross = kv.cross_attention_cache(model, memory)
        logits, self_kv = kv.decode_cached(model, tgt_in[:, :2], cross, src_mask)  # two positions at once
        np.testing.assert_allclose(as_numpy(logits), full[:, :2], atol=ATOL)
        for length in range(3, 8):
            logits, self_kv = kv.decode_cached(model, tgt_in[:, :length], cross, src_mask, self_kv)
            np.testing.assert_allclose(as_numpy(logits)[:, 0], full[:, length - 1], atol=ATOL, err_msg=f"{length}")
        with pytest.raises(ValueError, match="longer than the 7 positions"):
            kv.decode_cached(model, tgt_in, cross, src_mask, self_kv)


def count_cross_projections(model, monkeypatch) -> list[int]:
    """Count the calls of every decoder layer's cross-attention ``project_key_value``."""
    calls = [0]
    for layer in model.decoder.layers:
        original = layer.cross_attn.project_key_value

        def counting(key, value, original=original):
            calls[0] += 1
            return original(key, value)

        monkeypatch.setattr(layer.cross_attn, "project_key_value", counting)
    return calls


@FRAMEWORKS
def test_greedy_decoding_gives_the_same_tokens_with_and_without_cache(transformers, framework, monkeypatch):
    training = torch_training if framework == "torch" else keras_training
    model = transformers[framework]
    src = torch.as_tensor(SRC) if framework == "torch" else SRC
    plain = as_numpy(training.greedy_decode(model, src, BOS, EOS, max_len=9, use_cache=False))
    calls = count_cross_projections(model, monkeypatch)
    fast = as_numpy(training.greedy_decode(model, src, BOS, EOS, max_len=9, use_cache=True))
    np.testing.assert_array_equal(fast, plain)
    assert plain.shape[1] > 4  # long enough for the cache to matter
    assert calls[0] == 2  # the encoder output projected once per layer for the whole batch, not once per step


@FRAMEWORKS
def test_beam_search_gives_the_same_tokens_with_and_without_cache(transformers, framework, monkeypatch):
    training = torch_training if framework == "torch" else keras_training
    model = transformers[framework]
    src = torch.as_tensor(SRC[:2]) if framework == "torch" else SRC[:2]
    plain = as_numpy(training.beam_search(model, src, BOS, EOS, beam_size=3, max_len=6, use_cache=False))
    calls = count_cross_projections(model, monkeypatch)
    fast = as_numpy(training.beam_search(model, src, BOS, EOS, beam_size=3, max_len=6, use_cache=True))
    np.testing.assert_array_equal(fast, plain)
    assert calls[0] == 2 * 2  # once per layer and per sentence


def test_cached_greedy_tokens_agree_across_frameworks(transformers):
    greedy = torch_training.greedy_decode(transformers["torch"], torch.as_tensor(SRC), BOS, EOS, 9, use_cache=True)
    keras_greedy = keras_training.greedy_decode(transformers["keras"], SRC, BOS, EOS, 9, use_cache=True)
    np.testing.assert_array_equal(as_numpy(keras_greedy), as_numpy(greedy))


def test_the_beam_scorer_recomputes_when_a_parent_is_unknown(transformers):
    model = transformers["torch"]
    with torch.no_grad():
        memory, src_mask = model.encode(torch.as_tensor(SRC[:1]))
        scorer = torch_kv.cached_beam_scorer(model, memory, src_mask)
        scorer(np.array([[BOS]]))
        jumped = scorer(np.array([[BOS, 5, 6], [BOS, 7, 8]]))  # parents [BOS, 5] and [BOS, 7] were never scored
        expected = torch.log_softmax(model.decode(torch.tensor([[BOS, 5, 6], [BOS, 7, 8]]), memory.expand(2, -1, -1),
                                                  src_mask.expand(2, -1, -1, -1))[:, -1], dim=-1)
    np.testing.assert_allclose(jumped, as_numpy(expected), atol=ATOL)
