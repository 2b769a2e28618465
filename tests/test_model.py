"""Encoder and decoder layers, the stacks, the Transformer and source 004's MinTransformer.

PyTorch = Keras = NumPy oracle with the same weights; the torch layers = ``torch.nn.Transformer*``; masks, edge
cases, bad input, save/load, and the parameter counts and shapes quoted by the seed documents.
"""

import io
import warnings

import keras
import numpy as np
import pytest
import torch
from keras_backends import keras_grad
from model_helpers import as_numpy, randomize_norms
from torch import nn

from companion import reference
from companion.convert import copy_weights
from companion.keras import min_transformer as keras_min
from companion.keras import model as keras_model
from companion.keras import padding_mask as keras_padding_mask
from companion.reference import model as ref_model
from companion.torch import min_transformer as torch_min
from companion.torch import model as torch_model
from companion.torch.masking import causal_mask, combine_masks, padding_mask

D_MODEL, NUM_HEADS, D_FF, NUM_LAYERS = 16, 4, 32, 2
SRC_VOCAB, TGT_VOCAB, MAX_LEN = 11, 13, 16
LAYER_ATOL, MODEL_ATOL = 1e-5, 1e-4
NORM = pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
FRAMEWORKS = pytest.mark.parametrize("framework", ["torch", "keras"])

# Different lengths on purpose (7 source, 5 target), each with a padded row.
SRC = np.array([[3, 4, 5, 6, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]])
TGT = np.array([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]])


def random_x(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)




def keras_twin(torch_module: nn.Module, keras_layer, *inputs, **kwargs):
    """Build ``keras_layer`` by calling it once, then give it ``torch_module``'s weights."""
    keras_layer(*inputs, **kwargs)
    copy_weights(torch_module, keras_layer)
    return keras_layer


def masks():
    """Torch masks for SRC/TGT: source padding ``(2, 1, 1, 7)`` and target causal+padding ``(2, 1, 5, 5)``."""
    src, tgt = torch.from_numpy(SRC), torch.from_numpy(TGT)
    return padding_mask(src), combine_masks(padding_mask(tgt), causal_mask(TGT.shape[1]))


def model_pair(norm_first: bool = False, dropout: float = 0.0, seed: int = 0):
    """A torch Transformer (eval mode) and a Keras Transformer with the same weights."""
    torch.manual_seed(seed)
    config = dict(d_model=D_MODEL, num_heads=NUM_HEADS, num_layers=NUM_LAYERS, d_ff=D_FF, max_len=MAX_LEN)
    torch_net = torch_model.Transformer(SRC_VOCAB, TGT_VOCAB, **config, dropout=dropout, norm_first=norm_first)
    randomize_norms(torch_net, seed)
    torch_net.eval()
    keras_net = keras_model.Transformer(SRC_VOCAB, TGT_VOCAB, **config, dropout=dropout, norm_first=norm_first)
    return torch_net, keras_twin(torch_net, keras_net, SRC, TGT)


@pytest.fixture(scope="module")
def models():
    return model_pair()


def logits(framework: str, models, src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    torch_net, keras_net = models
    if framework == "torch":
        with torch.no_grad():
            return torch_net(torch.from_numpy(src), torch.from_numpy(tgt)).numpy()
    return as_numpy(keras_net(src, tgt))


# ---------------------------------------------------------------------------------------------------------------
# Parity: reference = torch = keras
# ---------------------------------------------------------------------------------------------------------------


@NORM
def test_encoder_layer_parity(norm_first):
    torch.manual_seed(0)
    layer = torch_model.EncoderLayer(D_MODEL, NUM_HEADS, D_FF, norm_first=norm_first)
    randomize_norms(layer)
    src_mask, _ = masks()
    x = random_x(2, 7, D_MODEL)
    twin = keras_twin(layer, keras_model.EncoderLayer(D_MODEL, NUM_HEADS, D_FF, norm_first=norm_first), x)

    expected = ref_model.encoder_layer(
        x.astype(np.float64), ref_model.encoder_layer_params(layer), NUM_HEADS, src_mask.numpy(), norm_first
    )
    out_torch, weights_torch = layer(torch.from_numpy(x), src_mask, return_weights=True)
    out_keras, weights_keras = twin(x, src_mask.numpy(), return_weights=True)
    np.testing.assert_allclose(as_numpy(out_torch), expected, atol=LAYER_ATOL)
    np.testing.assert_allclose(as_numpy(out_keras), expected, atol=LAYER_ATOL)
    assert weights_torch.shape == (2, NUM_HEADS, 7, 7)
    np.testing.assert_allclose(as_numpy(weights_keras), as_numpy(weights_torch), atol=LAYER_ATOL)


@NORM
def test_decoder_layer_parity_and_cross_attention_weights(norm_first):
    torch.manual_seed(1)
    layer = torch_model.DecoderLayer(D_MODEL, NUM_HEADS, D_FF, norm_first=norm_first)
    randomize_norms(layer)
    src_mask, tgt_mask = masks()
    x, memory = random_x(2, 5, D_MODEL, seed=1), random_x(2, 7, D_MODEL, seed=2)
    twin = keras_twin(layer, keras_model.DecoderLayer(D_MODEL, NUM_HEADS, D_FF, norm_first=norm_first), x, memory)

    expected = ref_model.decoder_layer(
        x.astype(np.float64),
        memory.astype(np.float64),
        ref_model.decoder_layer_params(layer),
        NUM_HEADS,
        tgt_mask.numpy(),
        src_mask.numpy(),
        norm_first,
        return_weights=True,
    )
    got_torch = layer(torch.from_numpy(x), torch.from_numpy(memory), tgt_mask, src_mask, return_weights=True)
    got_keras = twin(x, memory, tgt_mask.numpy(), src_mask.numpy(), return_weights=True)
    for name, want, t, k in zip(("out", "self weights", "cross weights"), expected, got_torch, got_keras, strict=True):
        np.testing.assert_allclose(as_numpy(t), want, atol=LAYER_ATOL, err_msg=f"torch {name}")
        np.testing.assert_allclose(as_numpy(k), want, atol=LAYER_ATOL, err_msg=f"keras {name}")

    cross = as_numpy(got_torch[2])
    assert cross.shape == (2, NUM_HEADS, 5, 7)  # queries from the decoder (5), keys from the encoder (7)
    np.testing.assert_allclose(cross.sum(-1), 1, atol=1e-6)
    assert np.all(cross[0, :, :, 4:] == 0)  # no weight on the source padding


@NORM
def test_encoder_and_decoder_stacks_parity(norm_first):
    torch.manual_seed(2)
    encoder = torch_model.Encoder(NUM_LAYERS, D_MODEL, NUM_HEADS, D_FF, norm_first=norm_first)
    decoder = torch_model.Decoder(NUM_LAYERS, D_MODEL, NUM_HEADS, D_FF, norm_first=norm_first)
    randomize_norms(encoder, 1)
    randomize_norms(decoder, 2)
    assert (encoder.norm is not None) == norm_first and (decoder.norm is not None) == norm_first
    src_mask, tgt_mask = masks()
    x, y = random_x(2, 7, D_MODEL, seed=3), random_x(2, 5, D_MODEL, seed=4)

    memory_ref = ref_model.encoder(
        x.astype(np.float64), ref_model.stack_params(encoder), NUM_HEADS, src_mask.numpy(), norm_first
    )
    out_ref = ref_model.decoder(
        y.astype(np.float64), memory_ref, ref_model.stack_params(decoder), NUM_HEADS, tgt_mask.numpy(),
        src_mask.numpy(), norm_first,
    )
    memory_torch = encoder(torch.from_numpy(x), src_mask)
    out_torch = decoder(torch.from_numpy(y), memory_torch, tgt_mask, src_mask)
    sizes = (NUM_LAYERS, D_MODEL, NUM_HEADS, D_FF)
    keras_encoder = keras_twin(encoder, keras_model.Encoder(*sizes, norm_first=norm_first), x)
    memory_keras = keras_encoder(x, mask=src_mask.numpy())
    keras_decoder = keras_twin(decoder, keras_model.Decoder(*sizes, norm_first=norm_first), y, memory_keras)
    out_keras = keras_decoder(y, memory_keras, self_mask=tgt_mask.numpy(), memory_mask=src_mask.numpy())
    np.testing.assert_allclose(as_numpy(memory_torch), memory_ref, atol=LAYER_ATOL)
    np.testing.assert_allclose(as_numpy(memory_keras), memory_ref, atol=LAYER_ATOL)
    np.testing.assert_allclose(as_numpy(out_torch), out_ref, atol=LAYER_ATOL)
    np.testing.assert_allclose(as_numpy(out_keras), out_ref, atol=LAYER_ATOL)


@NORM
def test_transformer_parity_with_padding(norm_first):
    torch_net, keras_net = model_pair(norm_first)
    expected = reference.transformer(SRC, TGT, reference.transformer_params(torch_net), NUM_HEADS, 0, norm_first)
    assert expected.shape == (2, 5, TGT_VOCAB)
    np.testing.assert_allclose(logits("torch", (torch_net, keras_net), SRC, TGT), expected, atol=MODEL_ATOL)
    np.testing.assert_allclose(logits("keras", (torch_net, keras_net), SRC, TGT), expected, atol=MODEL_ATOL)


def shared_pair(norm_first: bool = False, seed: int = 0):
    """A torch and a Keras Transformer with one joint vocabulary and shared embeddings, same weights."""
    torch.manual_seed(seed)
    config = dict(d_model=D_MODEL, num_heads=NUM_HEADS, num_layers=NUM_LAYERS, d_ff=D_FF, max_len=MAX_LEN,
                  dropout=0.0, norm_first=norm_first, shared_embeddings=True)
    torch_net = torch_model.Transformer(TGT_VOCAB, TGT_VOCAB, **config)
    randomize_norms(torch_net, seed)
    with torch.no_grad():  # a non-zero output bias, so that forgetting it cannot go unnoticed
        torch_net.generator.bias.copy_(0.5 * torch.randn(TGT_VOCAB))
    torch_net.eval()
    keras_net = keras_model.Transformer(TGT_VOCAB, TGT_VOCAB, **config)
    return torch_net, keras_twin(torch_net, keras_net, SRC, TGT)


@NORM
def test_shared_embeddings_parity_with_reference(norm_first):
    torch_net, keras_net = shared_pair(norm_first)
    params = reference.transformer_params(torch_net)
    assert set(params) == {"src_embed", "encoder", "decoder", "generator"} and set(params["generator"]) == {"b"}
    expected = reference.transformer(SRC, TGT, params, NUM_HEADS, 0, norm_first, shared_embeddings=True)
    np.testing.assert_allclose(logits("torch", (torch_net, keras_net), SRC, TGT), expected, atol=MODEL_ATOL)
    np.testing.assert_allclose(logits("keras", (torch_net, keras_net), SRC, TGT), expected, atol=MODEL_ATOL)
    from_keras = reference.transformer_params(keras_net)
    np.testing.assert_allclose(
        reference.transformer(SRC, TGT, from_keras, NUM_HEADS, 0, norm_first, shared_embeddings=True), expected,
        atol=1e-6,
    )


def test_shared_embeddings_are_one_table_counted_once():
    from companion.training import transformer_parameter_count

    torch_net, keras_net = shared_pair()
    expected = transformer_parameter_count(TGT_VOCAB, TGT_VOCAB, D_MODEL, NUM_LAYERS, D_FF, shared_embeddings=True)
    untied = transformer_parameter_count(TGT_VOCAB, TGT_VOCAB, D_MODEL, NUM_LAYERS, D_FF)
    assert untied - expected == 2 * TGT_VOCAB * D_MODEL  # two of the three tables are gone
    assert sum(p.numel() for p in torch_net.parameters()) == expected
    assert keras_net.count_params() == expected
    assert torch_net.tgt_embed is torch_net.src_embed and keras_net.tgt_embed is keras_net.src_embed
    assert torch_net.generator.embedding.weight is torch_net.src_embed.embedding.weight
    assert keras_net.generator.embedding.embeddings is keras_net.src_embed.embedding.embeddings
    # One table: changing the row of token 12 (in no input) through the embedding changes that token's logit only.
    with torch.no_grad():
        before = torch_net(torch.from_numpy(SRC), torch.from_numpy(TGT))
        torch_net.src_embed.embedding.weight[12] += 1.0
        after = torch_net(torch.from_numpy(SRC), torch.from_numpy(TGT))
    changed = (after - before).abs().amax(dim=(0, 1))  # (vocab,): largest change per output token
    assert float(changed[12]) > 0.1 and float(changed[:12].max()) == 0.0


def test_shared_embeddings_gradient_reaches_the_table_from_both_ends():
    torch_net, _ = shared_pair()
    torch_net.train()
    table = torch_net.src_embed.embedding.weight
    out = torch_net(torch.from_numpy(SRC), torch.from_numpy(TGT))
    (grad,) = torch.autograd.grad(out[..., 12].sum(), table)  # token 12 is in no input: only the output uses it
    assert float(grad[12].abs().sum()) > 0 and float(grad[[9, 10, 11]].abs().sum()) == 0.0


@FRAMEWORKS
def test_shared_embeddings_need_one_vocabulary(framework):
    module = torch_model if framework == "torch" else keras_model
    with pytest.raises(ValueError, match="src_vocab_size must equal tgt_vocab_size; got 11 and 13"):
        module.Transformer(SRC_VOCAB, TGT_VOCAB, D_MODEL, NUM_HEADS, 1, D_FF, MAX_LEN, shared_embeddings=True)


def test_keras_file_round_trip_with_shared_embeddings(tmp_path):
    _, keras_net = shared_pair()
    path = tmp_path / "tied.keras"
    keras_net.save(path)
    clone = keras.saving.load_model(path)
    assert clone.get_config()["shared_embeddings"] and clone.tgt_embed is clone.src_embed
    np.testing.assert_array_equal(as_numpy(clone(SRC, TGT)), as_numpy(keras_net(SRC, TGT)))


def test_reference_params_read_the_same_from_keras(models):
    from_torch, from_keras = (reference.transformer_params(m) for m in models)
    expected = reference.transformer(SRC, TGT, from_torch, NUM_HEADS)
    np.testing.assert_allclose(reference.transformer(SRC, TGT, from_keras, NUM_HEADS), expected, atol=1e-6)


def test_encoder_layer_input_gradients_match():
    torch.manual_seed(3)
    layer = torch_model.EncoderLayer(D_MODEL, NUM_HEADS, D_FF)
    randomize_norms(layer)
    src_mask, _ = masks()
    x = random_x(2, 7, D_MODEL, seed=5)
    twin = keras_twin(layer, keras_model.EncoderLayer(D_MODEL, NUM_HEADS, D_FF), x)
    # A random weighting of the output: a plain sum of a post-LN output has a gradient of (almost) zero.
    weighting = random_x(2, 7, D_MODEL, seed=6)

    x_torch = torch.from_numpy(x).requires_grad_()
    (layer(x_torch, src_mask) * torch.from_numpy(weighting)).sum().backward()
    keras_mask = keras_padding_mask(SRC)
    (grad_keras,) = keras_grad(lambda x: twin(x, keras_mask) * weighting, x)
    assert np.abs(grad_keras).max() > 1e-2  # a real gradient, not zeros on both sides
    np.testing.assert_allclose(grad_keras, x_torch.grad.numpy(), atol=LAYER_ATOL)


# ---------------------------------------------------------------------------------------------------------------
# The torch layers equal torch.nn's
# ---------------------------------------------------------------------------------------------------------------


def load_into_nn_attention(ours, theirs: nn.MultiheadAttention) -> None:
    """nn.MultiheadAttention packs Wq, Wk, Wv into one (3 d_model, d_model) in_proj."""
    theirs.in_proj_weight.copy_(torch.cat([ours.wq.weight, ours.wk.weight, ours.wv.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.wq.bias, ours.wk.bias, ours.wv.bias]))
    theirs.out_proj.load_state_dict(ours.wo.state_dict())


@torch.no_grad()
def load_into_nn_layer(ours, theirs) -> None:
    """Our EncoderLayer/DecoderLayer -> nn.TransformerEncoderLayer/nn.TransformerDecoderLayer."""
    load_into_nn_attention(ours.self_attn, theirs.self_attn)
    if hasattr(ours, "cross_attn"):
        load_into_nn_attention(ours.cross_attn, theirs.multihead_attn)
    theirs.linear1.load_state_dict(ours.ffn.linear1.state_dict())
    theirs.linear2.load_state_dict(ours.ffn.linear2.state_dict())
    for i, addnorm in enumerate([ours.addnorm1, ours.addnorm2, getattr(ours, "addnorm3", None)], start=1):
        if addnorm is not None:
            getattr(theirs, f"norm{i}").load_state_dict(addnorm.norm.state_dict())


def nn_kwargs(norm_first: bool) -> dict:
    return dict(dim_feedforward=D_FF, dropout=0.0, activation="relu", batch_first=True, norm_first=norm_first)


@NORM
def test_torch_encoder_layer_equals_nn_transformer_encoder_layer(norm_first):
    torch.manual_seed(4)
    ours = torch_model.EncoderLayer(D_MODEL, NUM_HEADS, D_FF, norm_first=norm_first).eval()
    randomize_norms(ours)
    theirs = nn.TransformerEncoderLayer(D_MODEL, NUM_HEADS, **nn_kwargs(norm_first)).eval()
    load_into_nn_layer(ours, theirs)
    src_mask, _ = masks()
    x = torch.from_numpy(random_x(2, 7, D_MODEL, seed=7))
    with torch.no_grad():
        # nn's boolean masks mean "blocked": the opposite of ours.
        expected = theirs(x, src_key_padding_mask=~src_mask[:, 0, 0])
        torch.testing.assert_close(ours(x, src_mask), expected, atol=LAYER_ATOL, rtol=0)


@NORM
def test_torch_decoder_layer_equals_nn_transformer_decoder_layer(norm_first):
    torch.manual_seed(5)
    ours = torch_model.DecoderLayer(D_MODEL, NUM_HEADS, D_FF, norm_first=norm_first).eval()
    randomize_norms(ours)
    theirs = nn.TransformerDecoderLayer(D_MODEL, NUM_HEADS, **nn_kwargs(norm_first)).eval()
    load_into_nn_layer(ours, theirs)
    src_mask, tgt_mask = masks()
    x, memory = torch.from_numpy(random_x(2, 5, D_MODEL, seed=8)), torch.from_numpy(random_x(2, 7, D_MODEL, seed=9))
    with torch.no_grad():
        expected = theirs(
            x,
            memory,
            tgt_mask=~causal_mask(5)[0, 0],
            tgt_key_padding_mask=~padding_mask(torch.from_numpy(TGT))[:, 0, 0],
            memory_key_padding_mask=~src_mask[:, 0, 0],
        )
        torch.testing.assert_close(ours(x, memory, tgt_mask, src_mask), expected, atol=LAYER_ATOL, rtol=0)


@NORM
@pytest.mark.filterwarnings("ignore::UserWarning")  # nn.TransformerEncoder's note about nested tensors
def test_torch_transformer_equals_nn_transformer(norm_first):
    torch_net, _ = model_pair(norm_first)
    theirs = nn.Transformer(D_MODEL, NUM_HEADS, NUM_LAYERS, NUM_LAYERS, **nn_kwargs(norm_first)).eval()
    for ours_stack, their_stack in ((torch_net.encoder, theirs.encoder), (torch_net.decoder, theirs.decoder)):
        for ours_layer, their_layer in zip(ours_stack.layers, their_stack.layers, strict=True):
            load_into_nn_layer(ours_layer, their_layer)
        # nn.Transformer always ends each stack with a LayerNorm; the paper's post-LN stack has none.
        if norm_first:
            their_stack.norm.load_state_dict(ours_stack.norm.state_dict())
        else:
            their_stack.norm = None
    src, tgt = torch.from_numpy(SRC), torch.from_numpy(TGT)
    with torch.no_grad():
        hidden = theirs(
            torch_net.positional(torch_net.src_embed(src)),
            torch_net.positional(torch_net.tgt_embed(tgt)),
            tgt_mask=~causal_mask(tgt.shape[1])[0, 0],
            src_key_padding_mask=~padding_mask(src)[:, 0, 0],
            tgt_key_padding_mask=~padding_mask(tgt)[:, 0, 0],
            memory_key_padding_mask=~padding_mask(src)[:, 0, 0],
        )
        torch.testing.assert_close(torch_net(src, tgt), torch_net.generator(hidden), atol=MODEL_ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Behaviour: masks, edge cases, attention weights, dropout
# ---------------------------------------------------------------------------------------------------------------


@FRAMEWORKS
def test_later_target_tokens_do_not_change_earlier_logits(framework, models):
    before = logits(framework, models, SRC, TGT)
    changed = TGT.copy()
    changed[1, 3] = 9  # position 3 of the full row
    after = logits(framework, models, SRC, changed)
    np.testing.assert_allclose(after[1, :3], before[1, :3], atol=1e-6)
    assert not np.allclose(after[1, 3:], before[1, 3:], atol=1e-4), "the change must show from position 3 on"


@FRAMEWORKS
def test_source_padding_is_ignored(framework, models):
    # The same sentence with more padding gives the same logits: padded keys get exactly zero weight.
    short = logits(framework, models, SRC[:, :4][:1], TGT[:1])
    long = logits(framework, models, np.pad(SRC[:1], ((0, 0), (0, 5))), TGT[:1])
    np.testing.assert_allclose(long, short, atol=1e-5)
    changed_token = SRC[:1].copy()
    changed_token[0, 1] = 8
    assert not np.allclose(logits(framework, models, changed_token, TGT[:1]), short, atol=1e-4)


@FRAMEWORKS
@pytest.mark.parametrize(
    "src, tgt",
    [
        (np.array([[5]]), np.array([[1]])),  # length 1, batch 1
        (np.array([[5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]), np.array([[1, 2]])),  # src at max_len
        (np.array([[1, 2]]), np.array([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3]])),  # tgt longer than src
    ],
    ids=["length-1", "src-at-max-len", "tgt-longer"],
)
def test_edge_shapes(framework, models, src, tgt):
    out = logits(framework, models, src, tgt)
    assert out.shape == (src.shape[0], tgt.shape[1], TGT_VOCAB)
    assert np.isfinite(out).all()


@FRAMEWORKS
def test_all_pad_source_row_gives_finite_logits(framework, models):
    src = np.array([[0, 0, 0], [1, 2, 3]])
    out = logits(framework, models, src, TGT[:, :3])
    assert np.isfinite(out).all()
    # The all-PAD row does not leak into its neighbour: row 1 alone gives the same logits.
    np.testing.assert_allclose(out[1:], logits(framework, models, src[1:], TGT[1:, :3]), atol=1e-5)


@FRAMEWORKS
def test_decode_returns_alignment_weights(framework, models):
    torch_net, keras_net = models
    if framework == "torch":
        memory, src_mask = torch_net.encode(torch.from_numpy(SRC))
        out, self_w, cross_w = torch_net.decode(torch.from_numpy(TGT), memory, src_mask, return_weights=True)
    else:
        memory, src_mask = keras_net.encode(SRC)
        out, self_w, cross_w = keras_net.decode(TGT, memory, src_mask, return_weights=True)
    np.testing.assert_allclose(as_numpy(out), logits(framework, models, SRC, TGT), atol=1e-6)
    assert len(self_w) == len(cross_w) == NUM_LAYERS
    for s, c in zip(self_w, cross_w, strict=True):
        s, c = as_numpy(s), as_numpy(c)
        assert s.shape == (2, NUM_HEADS, 5, 5) and c.shape == (2, NUM_HEADS, 5, 7)
        assert np.all(np.triu(s[1, 0], k=1) == 0)  # causal: nothing above the diagonal
        assert np.all(c[0, :, :, 4:] == 0)  # source padding gets no weight


@FRAMEWORKS
def test_dropout_is_active_only_in_training(framework):
    torch_net, keras_net = model_pair(dropout=0.3)
    if framework == "torch":
        src, tgt = torch.from_numpy(SRC), torch.from_numpy(TGT)
        eval_a, eval_b = torch_net(src, tgt), torch_net(src, tgt)
        torch_net.train()
        train = torch_net(src, tgt)
    else:
        eval_a, eval_b = keras_net(SRC, TGT), keras_net(SRC, TGT, training=False)
        train = keras_net(SRC, TGT, training=True)
    np.testing.assert_array_equal(as_numpy(eval_a), as_numpy(eval_b))
    assert not np.allclose(as_numpy(train), as_numpy(eval_a), atol=1e-3)


def test_structure_and_attribute_names(models):
    torch_net, keras_net = models
    for net in models:
        for name in ("src_embed", "tgt_embed", "positional", "encoder", "decoder", "generator"):
            assert hasattr(net, name), name
        layer = net.decoder.layers[0]
        assert layer.self_attn is not layer.cross_attn  # two attentions, two sets of weights
        assert net.encoder.norm is None and net.decoder.norm is None  # post-LN by default
    assert len(torch_net.encoder.layers) == len(keras_net.encoder.layers) == NUM_LAYERS
    assert torch_net.src_embed.scale and keras_net.src_embed.scale  # embeddings times sqrt(d_model)
    assert sum(p.numel() for p in torch_net.parameters()) == keras_net.count_params()


def test_keras_model_attaches_no_keras_mask_and_warns_nothing(models):
    _, keras_net = models
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Keras warns when a layer "drops" a mask passed as mask=...
        out = keras_net(SRC, TGT)
    assert getattr(out, "_keras_mask", None) is None  # a loss would read it as a per-token mask


def test_keras_model_in_a_functional_model_and_compiled_predict(models):
    _, keras_net = models
    src, tgt = keras.Input((None,), dtype="int32"), keras.Input((None,), dtype="int32")  # lengths unknown
    functional = keras.Model([src, tgt], keras_net(src, tgt))
    compiled = functional.predict([SRC, TGT], verbose=0)  # traced into a graph on TensorFlow
    np.testing.assert_allclose(compiled, as_numpy(keras_net(SRC, TGT)), atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------


BAD_INPUTS = {
    "src-rank": (np.array([1, 2, 3]), TGT, r"src_ids must have shape \(batch, seq_len\)"),
    "tgt-rank": (SRC, TGT[:, :, None], r"tgt_ids must have shape \(batch, seq_len\)"),
    "src-out-of-range": (np.array([[1, SRC_VOCAB]]), TGT[:1], r"src_ids must lie in \[0, vocab_size=11\)"),
    "tgt-out-of-range": (SRC[:1], np.array([[1, TGT_VOCAB]]), r"tgt_ids must lie in \[0, vocab_size=13\)"),
    "src-negative": (np.array([[-1, 2]]), TGT[:1], r"src_ids must lie in"),
    "src-too-long": (np.ones((1, MAX_LEN + 1), dtype=np.int64), TGT[:1], r"src_ids .*max_len=16.* got 17"),
    "tgt-too-long": (SRC[:1], np.ones((1, MAX_LEN + 1), dtype=np.int64), r"tgt_ids .*max_len=16.* got 17"),
    "src-float": (SRC.astype(np.float32), TGT, r"src_ids must be an integer tensor"),
}


@FRAMEWORKS
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_raises_value_error_naming_the_argument(framework, models, case):
    src, tgt, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        logits(framework, models, src, tgt)


def test_fresh_keras_model_rejects_wrong_rank_before_building():
    net = keras_model.Transformer(SRC_VOCAB, TGT_VOCAB, D_MODEL, NUM_HEADS, 1, D_FF, MAX_LEN)
    with pytest.raises(ValueError, match=r"src_ids must have shape \(batch, seq_len\)"):
        net(np.array([1, 2, 3]), TGT)


# ---------------------------------------------------------------------------------------------------------------
# Save and load
# ---------------------------------------------------------------------------------------------------------------


def test_torch_state_dict_round_trip(models):
    torch_net, _ = models
    buffer = io.BytesIO()
    torch.save(torch_net.state_dict(), buffer)
    assert not any(key.endswith("positional.pe") for key in torch_net.state_dict())  # recomputed, not stored
    torch.manual_seed(123)  # different initial weights, all overwritten by the load
    clone = torch_model.Transformer(SRC_VOCAB, TGT_VOCAB, D_MODEL, NUM_HEADS, NUM_LAYERS, D_FF, MAX_LEN, 0.0).eval()
    buffer.seek(0)
    clone.load_state_dict(torch.load(buffer))
    with torch.no_grad():
        torch.testing.assert_close(clone(torch.from_numpy(SRC), torch.from_numpy(TGT)),
                                   torch_net(torch.from_numpy(SRC), torch.from_numpy(TGT)), atol=0, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_keras_file_round_trip(tmp_path, norm_first):
    _, keras_net = model_pair(norm_first)
    path = tmp_path / "transformer.keras"
    keras_net.save(path)
    clone = keras.saving.load_model(path)
    assert type(clone) is keras_model.Transformer and clone.get_config() == keras_net.get_config()
    np.testing.assert_array_equal(as_numpy(clone(SRC, TGT)), as_numpy(keras_net(SRC, TGT)))


# ---------------------------------------------------------------------------------------------------------------
# The source documents' facts: MinTransformer (004) and the encoder layer's shape (002)
# ---------------------------------------------------------------------------------------------------------------


MIN_PARTS = {"encoder layer": 2_886_144, "decoder layer": 3_672_576, "src embed": 153_600, "tgt embed": 204_800,
             "output": 205_200}


@pytest.fixture(scope="module")
def min_transformer():
    torch.manual_seed(8)
    return torch_min.MinTransformer().eval()  # source 004's sizes


def test_min_transformer_parameter_count_torch(min_transformer):
    net = min_transformer

    def count(module):
        return sum(p.numel() for p in module.parameters())

    assert count(net) == 13_681_040
    assert [count(layer) for layer in net.encoder_layers] == [MIN_PARTS["encoder layer"]] * 2
    assert [count(layer) for layer in net.decoder_layers] == [MIN_PARTS["decoder layer"]] * 2
    assert count(net.src_embed) == MIN_PARTS["src embed"] and count(net.tgt_embed) == MIN_PARTS["tgt embed"]
    assert count(net.generator) == MIN_PARTS["output"]


def test_min_transformer_parameter_count_keras():
    net = keras_min.MinTransformer()
    net.build((None, 25), (None, 25))  # no forward pass needed to create the weights
    assert net.count_params() == 13_681_040
    assert [layer.count_params() for layer in net.encoder_layers] == [MIN_PARTS["encoder layer"]] * 2
    assert [layer.count_params() for layer in net.decoder_layers] == [MIN_PARTS["decoder layer"]] * 2
    assert net.src_embed.count_params() == MIN_PARTS["src embed"]
    assert net.tgt_embed.count_params() == MIN_PARTS["tgt embed"]
    assert net.generator.count_params() == MIN_PARTS["output"]


MIN_SMALL = dict(n_steps=8, src_vocab_size=SRC_VOCAB, tgt_vocab_size=TGT_VOCAB, num_heads=2, d_model=8, d_ff=16)


def test_min_transformer_frameworks_agree():
    torch.manual_seed(6)
    torch_net = torch_min.MinTransformer(**MIN_SMALL).eval()
    keras_net = keras_twin(torch_net, keras_min.MinTransformer(**MIN_SMALL), SRC, TGT)
    with torch.no_grad():
        out_torch = torch_net(torch.from_numpy(SRC), torch.from_numpy(TGT)).numpy()
    assert out_torch.shape == (2, 5, TGT_VOCAB)  # source 7, target 5: the corrected roles handle any lengths
    np.testing.assert_allclose(as_numpy(keras_net(SRC, TGT)), out_torch, atol=LAYER_ATOL)
    with pytest.raises(ValueError, match="src_ids must have between 1 and n_steps=8"):
        torch_net(torch.ones(1, 9, dtype=torch.long), torch.from_numpy(TGT[:1]))
    with pytest.raises(ValueError, match="tgt_ids must have between 1 and n_steps=8"):
        keras_net(SRC[:1], np.ones((1, 9), dtype=np.int64))


def test_min_decoder_layer_roles_and_causality():
    # Queries from the decoder (5 positions), keys and values from the encoder memory (7 positions): the seed's
    # version (queries and keys from the encoder, values from the decoder) cannot even run on these shapes.
    torch.manual_seed(7)
    layer = torch_min.MinDecoderLayer(8, 2, 16).eval()
    x, memory = torch.from_numpy(random_x(2, 5, 8, seed=10)), torch.from_numpy(random_x(2, 7, 8, seed=11))
    mask = causal_mask(5)[0]
    twin = keras_twin(layer, keras_min.MinDecoderLayer(8, 2, 16), x.numpy(), memory.numpy(), mask.numpy())
    with torch.no_grad():
        out = layer(x, memory, mask)
        assert out.shape == (2, 5, 8)
        out_keras = twin(x.numpy(), memory.numpy(), mask.numpy())
        np.testing.assert_allclose(as_numpy(out_keras), out.numpy(), atol=LAYER_ATOL)
        later = x.clone()
        later[:, 3] += 1.0
        changed = layer(later, memory, mask)
        torch.testing.assert_close(changed[:, :3], out[:, :3])  # masked self-attention: no peeking ahead
        assert not torch.allclose(changed[:, 3:], out[:, 3:], atol=1e-4)
        assert not torch.allclose(layer(x, memory.flip(1) * 2, mask), out, atol=1e-4)  # it reads the memory


def test_min_transformer_ignores_the_target_at_initialisation(min_transformer):
    # A fact for the errata: with no residual connections the two encoder layers average every source position
    # into (nearly) one vector, so cross-attention returns the same vector for any query: the logits of a fresh
    # seed-004 model do not depend on the target ids. Our Transformer does (see the causality test).
    net = min_transformer
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(1, 300, (1, 25), generator=generator)
    tgt = torch.randint(1, 400, (1, 25), generator=generator)
    with torch.no_grad():
        memory = net.src_embed(src)
        for layer in net.encoder_layers:
            memory = layer(memory)
        assert (memory - memory.mean(1, keepdim=True)).abs().max() < 1e-5
        other_tgt = (tgt + 7) % 399 + 1
        torch.testing.assert_close(net(src, other_tgt), net(src, tgt), atol=1e-6, rtol=0)


def test_seed_002_encoder_layer_shape():
    # Seed 002: d_model 512, 8 heads, d_ff 2048 maps (64, 43, 512) to (64, 43, 512).
    layer = torch_model.EncoderLayer(512, 8, 2048)
    with torch.no_grad():
        assert layer(torch.zeros(64, 43, 512)).shape == (64, 43, 512)
    # Keras, symbolically (no arithmetic): also shows the layer works in the functional API.
    keras_layer = keras_model.EncoderLayer(512, 8, 2048)
    assert tuple(keras_layer(keras.Input(batch_shape=(64, 43, 512))).shape) == (64, 43, 512)
