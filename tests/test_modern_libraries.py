"""Chapter 9's blocks against libraries written elsewhere: ``torch.nn.RMSNorm``, PyTorch's fused attention with
``enable_gqa=True``, Keras Hub's ``RotaryEmbedding`` and ``RMSNormalization``, the sliding-window mask against
``transformers``' mask functions, and the whole ModernDecoder against Hugging Face ``transformers``'
``LlamaForCausalLM`` and, with a window, ``MistralForCausalLM``, built from small configurations with random weights
(nothing is downloaded). Keras Hub and transformers are test dependencies: without them those tests are skipped."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from model_helpers import as_numpy

import companion.keras as ck
import companion.torch as ct
from companion.convert import copy_weights

ATOL = 1e-5


def _random(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


# ---------------------------------------------------------------------------------------------------------------
# PyTorch's own layers
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_rms_norm_equals_torch_nn_rmsnorm(eps):
    ours = ct.RMSNorm(16, eps)
    theirs = torch.nn.RMSNorm(16, eps=eps)
    with torch.no_grad():
        theirs.weight.copy_(1 + 0.3 * torch.randn(16))
        ours.weight.copy_(theirs.weight)
    x = torch.tensor(_random(2, 5, 16, seed=1) * 3, requires_grad=True)
    y = x.detach().clone().requires_grad_(True)
    torch.testing.assert_close(ours(x), theirs(y), atol=ATOL, rtol=0)
    ours(x).square().sum().backward()
    theirs(y).square().sum().backward()
    torch.testing.assert_close(x.grad, y.grad, atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("heads", [(4, 2), (4, 1), (6, 3)], ids=["gqa", "mqa", "gqa-6-3"])
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "window"])
def test_grouped_query_attention_equals_sdpa_with_enable_gqa(heads, masked):
    num_heads, num_kv_heads = heads
    d_model = 4 * num_heads
    torch.manual_seed(0)
    layer = ct.GroupedQueryAttention(d_model, num_heads, num_kv_heads, max_len=16).eval()
    x = torch.as_tensor(_random(2, 7, d_model, seed=2))
    mask = ct.sliding_window_mask(7, 3) if masked else None
    q, k, v = layer.project(x)
    assert k.shape[1] == num_kv_heads  # the keys and values are NOT repeated before the library call
    heads_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    expected = layer.wo(heads_out.transpose(1, 2).reshape(2, 7, d_model))
    torch.testing.assert_close(layer(x, mask), expected, atol=ATOL, rtol=0)
    # The course's own explicit attention, with the kv heads repeated by hand, agrees too.
    explicit = ct.scaled_dot_product_attention(q, ct.repeat_kv(k, num_heads // num_kv_heads),
                                               ct.repeat_kv(v, num_heads // num_kv_heads), mask)
    torch.testing.assert_close(explicit, heads_out, atol=ATOL, rtol=0)


def test_online_softmax_attention_equals_sdpa():
    q, k, v = (torch.as_tensor(_random(2, 3, n, 8, seed=s)) for n, s in [(40, 3), (70, 4), (70, 5)])
    mask = ct.sliding_window_mask(70, 20)[:, :, 30:]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ct.online_softmax_attention(q, k, v, mask, block_size=16), expected, atol=1e-6,
                               rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Keras Hub
# ---------------------------------------------------------------------------------------------------------------


def test_rotary_embedding_equals_keras_hub():
    keras_hub = pytest.importorskip("keras_hub")
    x = _random(2, 4, 6, 8, seed=6)  # (batch, num_heads, seq_len, head_dim)
    for offset, base in [(0, 10000.0), (5, 10000.0), (3, 500.0)]:
        # Keras Hub expects (batch, seq_len, ..., head_dim) by default: name our sequence axis instead.
        theirs = keras_hub.layers.RotaryEmbedding(max_wavelength=base, sequence_axis=2, feature_axis=-1)
        expected = as_numpy(theirs(x, start_index=offset))
        np.testing.assert_allclose(as_numpy(ck.RotaryEmbedding(8, 16, base)(x, offset=offset)), expected, atol=ATOL)
        np.testing.assert_allclose(as_numpy(ct.RotaryEmbedding(8, 16, base)(torch.as_tensor(x), offset)), expected,
                                   atol=ATOL)


def test_rms_norm_equals_keras_hub_rms_normalization():
    keras_hub = pytest.importorskip("keras_hub")
    theirs = keras_hub.layers.RMSNormalization(16)  # epsilon fixed at 1e-6, gain called "scale"
    gain = 1 + 0.3 * _random(16, seed=7)
    theirs.scale.assign(gain)
    ours = ck.RMSNorm(16, eps=1e-6)
    ours.build((None, 16))
    ours.weight.assign(gain)
    x = _random(2, 5, 16, seed=8) * 3
    np.testing.assert_allclose(as_numpy(ours(x)), as_numpy(theirs(x)), atol=ATOL)


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face transformers: LlamaForCausalLM
# ---------------------------------------------------------------------------------------------------------------

VOCAB, D_MODEL, NUM_HEADS, NUM_KV_HEADS, NUM_LAYERS, D_FF, MAX_LEN = 41, 32, 4, 2, 2, 48, 24
IDS = np.random.default_rng(9).integers(0, VOCAB, size=(2, 8))


def llama_names(num_layers: int) -> dict[str, str]:
    """Our parameter names -> Hugging Face Llama's. The layouts agree (``nn.Linear`` weights, half-split RoPE), so
    the weights copy as they are; a checkpoint in RoFormer's interleaved layout would need the columns of ``wq`` and
    ``wk`` permuted within each head (see ``reference.interleave_permutation``)."""
    names = {"token_embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "head.weight": "lm_head.weight"}
    parts = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn.wq": "self_attn.q_proj",
             "attn.wk": "self_attn.k_proj", "attn.wv": "self_attn.v_proj", "attn.wo": "self_attn.o_proj",
             "ffn.w1": "mlp.gate_proj", "ffn.w3": "mlp.up_proj", "ffn.w2": "mlp.down_proj"}
    for i in range(num_layers):
        for ours, theirs in parts.items():
            names[f"blocks.{i}.{ours}.weight"] = f"model.layers.{i}.{theirs}.weight"
    return names


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def llama(request):
    transformers = pytest.importorskip("transformers")
    tie = request.param
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_FF, num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS, num_key_value_heads=NUM_KV_HEADS, max_position_embeddings=MAX_LEN,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=tie,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        hf.model.embed_tokens.weight.mul_(20.0)  # logits of order 1: greedy choices are not decided by round-off
        if not tie:
            hf.lm_head.weight.mul_(20.0)
        for name, p in hf.named_parameters():
            if "layernorm" in name or name == "model.norm.weight":
                p.copy_(1 + 0.3 * torch.randn(p.shape))
    ours = ct.ModernDecoder(VOCAB, D_MODEL, NUM_HEADS, NUM_KV_HEADS, NUM_LAYERS, D_FF, MAX_LEN, eps=1e-6,
                            tie_weights=tie).eval()
    theirs = dict(hf.named_parameters())
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(theirs[llama_names(NUM_LAYERS)[name]])
    twin = ck.ModernDecoder(VOCAB, D_MODEL, NUM_HEADS, NUM_KV_HEADS, NUM_LAYERS, D_FF, MAX_LEN, eps=1e-6,
                            tie_weights=tie)
    twin(IDS)
    copy_weights(ours, twin)
    return hf, ours, twin


def test_every_llama_weight_has_a_counterpart(llama):
    hf, ours, _ = llama
    mapped = {llama_names(NUM_LAYERS)[name] for name, _ in ours.named_parameters()}
    assert mapped == {name for name, _ in hf.named_parameters()}


def test_logits_equal_llama_for_causal_lm_in_both_frameworks(llama):
    hf, ours, twin = llama
    with torch.no_grad():
        expected = hf(torch.as_tensor(IDS)).logits.numpy()
        np.testing.assert_allclose(as_numpy(ours(torch.as_tensor(IDS))), expected, atol=ATOL)
    np.testing.assert_allclose(as_numpy(twin(IDS)), expected, atol=ATOL)
    assert np.abs(expected).max() > 1


def test_greedy_generation_equals_llama_with_and_without_cache(llama):
    hf, ours, twin = llama
    prompt = IDS[:, :3]
    with torch.no_grad():
        hf_cached = hf.generate(torch.as_tensor(prompt), max_new_tokens=12, do_sample=False, use_cache=True)
        hf_plain = hf.generate(torch.as_tensor(prompt), max_new_tokens=12, do_sample=False, use_cache=False)
    assert hf_cached.shape == (2, 15)
    np.testing.assert_array_equal(hf_cached.numpy(), hf_plain.numpy())
    for use_cache in (True, False):
        np.testing.assert_array_equal(
            as_numpy(ct.generate(ours, torch.as_tensor(prompt), 12, temperature=0, use_cache=use_cache)),
            hf_cached.numpy())
        np.testing.assert_array_equal(as_numpy(ck.generate(twin, prompt, 12, temperature=0, use_cache=use_cache)),
                                      hf_cached.numpy())


def test_the_cache_equals_llama_past_key_values(llama):
    hf, ours, _ = llama
    with torch.no_grad():
        past = hf(torch.as_tensor(IDS), use_cache=True).past_key_values
        _, cache = ours.forward_cached(torch.as_tensor(IDS))
    for index, (k, v) in enumerate(cache):
        layer = past.layers[index]
        assert tuple(layer.keys.shape) == tuple(k.shape) == (2, NUM_KV_HEADS, 8, D_MODEL // NUM_HEADS)
        torch.testing.assert_close(k, layer.keys, atol=ATOL, rtol=0)  # keys stored rotated, as here
        torch.testing.assert_close(v, layer.values, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face transformers: the sliding window (MistralForCausalLM)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [1, 3, 20])
@pytest.mark.parametrize("past", [0, 4])
def test_sliding_window_mask_equals_transformers_mask(window, past):
    """The course's window of W positions, the query's own included, is transformers' ``sliding_window_overlay``
    (``kv_idx > q_idx - sliding_window``) on its causal mask; the rows after a cache of ``past`` positions too."""
    masking_utils = pytest.importorskip("transformers.masking_utils")
    length = 9
    theirs = masking_utils.sdpa_mask(batch_size=1, q_length=length - past, kv_length=length, q_offset=past,
                                     mask_function=masking_utils.sliding_window_causal_mask_function(window),
                                     allow_is_causal_skip=False)
    assert tuple(theirs.shape) == (1, 1, length - past, length)
    np.testing.assert_array_equal(as_numpy(ct.sliding_window_mask(length, window)[:, :, past:]), theirs.numpy())
    np.testing.assert_array_equal(as_numpy(ck.sliding_window_mask(length, window))[:, :, past:], theirs.numpy())


def test_modern_decoder_with_a_window_equals_mistral_for_causal_lm():
    """A ``ModernDecoder`` with ``window=3`` is transformers' Mistral with ``sliding_window=3`` (the weights have
    Llama's names); with the Mistral paper's count, one position more, the logits differ."""
    transformers = pytest.importorskip("transformers")
    window = 3
    config = transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_FF, num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS, num_key_value_heads=NUM_KV_HEADS, max_position_embeddings=MAX_LEN,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, sliding_window=window,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(1)
    hf = transformers.MistralForCausalLM(config).eval()
    with torch.no_grad():
        hf.model.embed_tokens.weight.mul_(20.0)  # logits of order 1, so that a wrong window shows
        hf.lm_head.weight.mul_(20.0)
        expected = hf(torch.as_tensor(IDS)).logits.numpy()
    assert IDS.shape[1] > window + 1 and np.abs(expected).max() > 1
    theirs = dict(hf.named_parameters())
    logits = {}
    for ours_window in (window, window + 1):
        ours = ct.ModernDecoder(VOCAB, D_MODEL, NUM_HEADS, NUM_KV_HEADS, NUM_LAYERS, D_FF, MAX_LEN, window=ours_window,
                                eps=1e-6, tie_weights=False).eval()
        with torch.no_grad():
            for name, p in ours.named_parameters():
                p.copy_(theirs[llama_names(NUM_LAYERS)[name]])
            logits[ours_window] = as_numpy(ours(torch.as_tensor(IDS)))
        if ours_window == window:
            twin = ck.ModernDecoder(VOCAB, D_MODEL, NUM_HEADS, NUM_KV_HEADS, NUM_LAYERS, D_FF, MAX_LEN, window=window,
                                    eps=1e-6, tie_weights=False)
            twin(IDS)
            copy_weights(ours, twin)
            np.testing.assert_allclose(as_numpy(twin(IDS)), expected, atol=ATOL)
    np.testing.assert_allclose(logits[window], expected, atol=ATOL)
    assert np.abs(logits[window + 1] - expected).max() > 100 * ATOL
