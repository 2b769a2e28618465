"""companion.diagrams: the shapes on the arrows are computed (they follow the configuration), greedy decoding drawn
step by step agrees with the model's own greedy decoding, and the book's figure style switch."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from companion import data, diagrams, plots
from companion.diagram_shapes import Config, decode_greedily, head_shapes, mask_shapes, model_shapes, shape_label


def _texts(fig: Figure) -> str:
    return "\n".join(t.get_text() for ax in fig.axes for t in ax.texts + [ax.title])


def test_model_shapes_follow_the_configuration() -> None:
    config = Config(src_vocab_size=50, tgt_vocab_size=70, d_model=24, num_heads=3, num_layers=2, d_ff=40)
    s = model_shapes(config, batch=3, src_len=7, tgt_len=4)
    assert s["src_embedded"] == s["memory"] == (3, 7, 24)
    assert s["decoded"] == (3, 4, 24) and s["logits"] == (3, 4, 70)
    assert s["src_mask"] == (3, 1, 1, 7) and s["tgt_mask"] == (3, 1, 4, 4)
    pre = model_shapes(Config(d_model=24, num_heads=3, num_layers=1, d_ff=40, norm_first=True), 1, 2, 3)
    assert pre["logits"] == (1, 3, 37000)


def test_transformer_diagram_prints_computed_shapes() -> None:
    small = _texts(diagrams.transformer(Config(tgt_vocab_size=99, d_model=32, num_heads=4, num_layers=3, d_ff=64),
                                        batch=4, src_len=9, tgt_len=2))
    assert "(batch 4, src_len 9, d_model 32)" in small and "(batch 4, tgt_len 2, tgt_vocab 99)" in small
    assert "(batch 4, 1, tgt_len 2, tgt_len 2)" in small and "× 3" in small
    paper = _texts(diagrams.transformer())
    assert "(batch 2, src_len 6, d_model 512)" in paper and "d_ff = 2048" in paper and "× 6" in paper


def test_attention_and_head_diagrams() -> None:
    text = _texts(diagrams.qkv_dataflow(d_model=20, d_k=5, d_v=7, batch=1, query_len=2, key_len=3))
    assert "(batch 1, query_len 2, key_len 3)" in text and "(batch 1, query_len 2, d_v 7)" in text
    s = head_shapes(d_model=12, num_heads=3, batch=2, seq_len=5)
    assert s["reshaped"] == (2, 5, 3, 4) and s["split"] == (2, 3, 5, 4) and s["weights"] == (2, 3, 5, 5)
    assert s["attended"] == (2, 3, 5, 4) and s["transposed"] == (2, 5, 3, 4) and s["merged"] == s["out"] == (2, 5, 12)
    assert "(batch 2, num_heads 3, seq_len 5, d_head 4)" in _texts(diagrams.heads(12, 3, 2, 5))
    with pytest.raises(ValueError, match="divisible"):
        head_shapes(d_model=10, num_heads=3, batch=1, seq_len=2)


def _rows(fig: Figure) -> dict[str, str]:
    """A diagram's rows: the text of each box -> the shape printed on the same line to its right."""
    lines: dict[float, list] = {}
    for t in fig.axes[0].texts:
        lines.setdefault(round(t.get_position()[1], 6), []).append(t)
    return {min(ts, key=lambda t: t.get_position()[0]).get_text(): max(ts, key=lambda t: t.get_position()[0]).get_text()
            for ts in lines.values() if len(ts) == 2}


def test_heads_diagram_prints_the_shape_each_step_produces() -> None:
    rows = _rows(diagrams.heads(d_model=12, num_heads=3, batch=2, seq_len=5))
    # each row shows the shape *after* its step (these two once showed the shape before it)
    assert rows["transpose back"] == "(batch 2, seq_len 5, num_heads 3, d_head 4)"
    assert rows["reshape: concatenate the heads"] == "(batch 2, seq_len 5, d_model 12)"
    assert rows["transpose axes 1 and 2: heads become a batch axis"] == "(batch 2, num_heads 3, seq_len 5, d_head 4)"
    assert rows["weights @ V in every head: the heads' outputs"] == "(batch 2, num_heads 3, seq_len 5, d_head 4)"
    assert rows["× W^O (mixes the heads)"] == "(batch 2, seq_len 5, d_model 12)"
    weights = rows["softmax(Q Kᵀ / √d_head) in every head at once"]
    assert weights == "weights (batch 2, num_heads 3, seq_len 5, seq_len 5)"


def test_mask_placement_draws_the_masks_of_the_first_sentence() -> None:
    s = mask_shapes(src_lengths=(2, 4), tgt_lengths=(3, 3))
    enc, shape = s["enc"]
    assert shape == (2, 1, 1, 4) and enc.tolist() == [[True, True, False, False]] * 4
    dec, shape = s["dec_self"]
    assert shape == (2, 1, 3, 3) and np.array_equal(dec, np.tril(np.ones((3, 3), dtype=bool)))
    cross, _ = s["cross"]
    assert cross.shape == (3, 4) and cross[:, :2].all() and not cross[:, 2:].any()
    fig = diagrams.mask_placement((2, 4), (3, 3))
    assert len(fig.axes) == 3 and "(batch 2, 1, 1, src_len 4)" in _texts(fig)
    with pytest.raises(ValueError, match="one length per sentence"):
        mask_shapes((2, 3), (1,))


def test_residual_wiring_has_both_orders() -> None:
    text = _texts(diagrams.residual_wiring(d_model=16, batch=3, seq_len=2))
    assert "post-LN" in text and "pre-LN" in text and "(batch 3, seq_len 2, d_model 16)" in text


def test_shape_label_checks_its_names() -> None:
    assert shape_label((2, 1, 5), "batch 1 len") == "(batch 2, 1, len 5)"
    assert shape_label((4,), None) == "(4,)"
    with pytest.raises(ValueError, match="one name per axis"):
        shape_label((2, 3), "batch")
    with pytest.raises(ValueError, match="axis named 1"):
        shape_label((2, 3), "batch 1")


def test_greedy_decoding_diagram_matches_the_models_greedy_decoding() -> None:
    from companion.torch import Transformer
    from companion.torch.training import greedy_decode

    pairs = [("a b c", "x y z"), ("c b a", "z y x"), ("a a", "x x")]
    src_vocab, tgt_vocab = data.build_vocabularies(pairs)
    torch.manual_seed(0)
    model = Transformer(len(src_vocab), len(tgt_vocab), d_model=16, num_heads=2, num_layers=1, d_ff=32,
                        max_len=20, dropout=0.0).eval()
    assert Config.from_model(model) == Config(len(src_vocab), len(tgt_vocab), 16, 2, 1, 32, False)
    steps = decode_greedily(model, "a b c", src_vocab, tgt_vocab, max_steps=6)
    src = torch.as_tensor(data.encode_sentences(["a b c"], src_vocab))
    expected = greedy_decode(model, src, tgt_vocab.bos_id, tgt_vocab.eos_id, max_len=6)[0].tolist()
    assert [step["id"] for step in steps] == expected[: len(steps)]  # greedy_decode returns no <s>
    assert [len(step["prefix"]) for step in steps] == list(range(1, len(steps) + 1))
    assert steps[-1]["logits"] == (1, len(steps), len(tgt_vocab)) and steps[0]["last"] == (1, len(tgt_vocab))
    fig = diagrams.greedy_decoding(model, "a b c", src_vocab, tgt_vocab, max_steps=6)
    assert isinstance(fig, Figure) and "<s>" in _texts(fig)


def test_config_from_a_keras_model() -> None:
    from companion.keras import Transformer

    model = Transformer(9, 11, d_model=8, num_heads=2, num_layers=2, d_ff=12, max_len=10, norm_first=True)
    model(np.ones((1, 3), dtype="int32"), np.ones((1, 2), dtype="int32"))  # build the weights
    assert Config.from_model(model) == Config(9, 11, 8, 2, 2, 12, True)


def test_book_style_switch() -> None:
    assert plots.use_book_style() is None  # outside a kernel: only matplotlib's settings
    assert matplotlib.rcParams["figure.facecolor"] == "white" and not matplotlib.rcParams["savefig.transparent"]
    with pytest.raises(ValueError, match="fmt"):
        plots.use_book_style("jpeg")
