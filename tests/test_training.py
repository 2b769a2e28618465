"""Training and decoding: the schedule, the shift, the loss, the metrics, greedy decoding, beam search, and the
parity of a torch and a Keras training run started from the same weights."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
import torch
from keras import ops

from companion import data, decoding, training
from companion.checks import ch07
from companion.convert import copy_weights
from companion.keras import Transformer as KerasTransformer
from companion.keras import training as keras_training
from companion.torch import Transformer as TorchTransformer
from companion.torch import training as torch_training

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------------------------
# Framework-free helpers
# ---------------------------------------------------------------------------------------------------------------


def test_warmup_learning_rate():
    d_model, warmup = 512, 4000
    steps = np.array([1, 100, 3999, 4000, 4001, 100_000])
    rates = training.warmup_learning_rate(steps, d_model, warmup)
    for step, rate in zip(steps, rates, strict=True):
        expected = d_model**-0.5 * (step * warmup**-1.5 if step < warmup else step**-0.5)
        assert rate == pytest.approx(expected, rel=1e-12)
    assert int(steps[np.argmax(rates)]) == warmup  # the peak is at the end of the warm-up
    assert training.warmup_learning_rate(4000, 512, 4000) == pytest.approx((512 * 4000) ** -0.5)
    assert training.warmup_learning_rate(10, 64, 100, factor=2.0) == pytest.approx(2 * 64**-0.5 * 10 * 100**-1.5)
    assert isinstance(training.warmup_learning_rate(3, 64, 10), float)
    with pytest.raises(ValueError, match="step must be >= 1"):
        training.warmup_learning_rate(0, 512)
    with pytest.raises(ValueError, match="d_model and warmup_steps"):
        training.warmup_learning_rate(1, 512, 0)


def test_framework_schedules_follow_the_formula():
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = torch_training.make_optimizer(model, d_model=64, warmup_steps=10, factor=0.5)
    schedule = keras_training.WarmupSchedule(64, 10, 0.5)
    for step in range(1, 30):  # update number `step` runs with these rates
        expected = training.warmup_learning_rate(step, 64, 10, 0.5)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12)
        assert float(ops.convert_to_numpy(schedule(step - 1))) == pytest.approx(expected, rel=1e-6)
        optimizer.step()
        scheduler.step()
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9
    keras_adam = keras_training.make_optimizer(None, 64, 10)
    assert (keras_adam.beta_1, keras_adam.beta_2, keras_adam.epsilon) == (0.9, 0.98, 1e-9)


def test_shift_targets():
    tgt = np.array([[2, 7, 8, 3, 0], [2, 9, 3, 0, 0]])
    decoder_input, labels = training.shift_targets(tgt)
    np.testing.assert_array_equal(decoder_input, [[2, 7, 8, 3], [2, 9, 3, 0]])
    np.testing.assert_array_equal(labels, [[7, 8, 3, 0], [9, 3, 0, 0]])
    for tensor in (torch.as_tensor(tgt), ops.convert_to_tensor(tgt)):
        a, b = training.shift_targets(tensor)
        np.testing.assert_array_equal(ops.convert_to_numpy(a) if not isinstance(a, torch.Tensor) else a, tgt[:, :-1])
        np.testing.assert_array_equal(ops.convert_to_numpy(b) if not isinstance(b, torch.Tensor) else b, tgt[:, 1:])
    with pytest.raises(ValueError, match="tgt_len >= 2"):
        training.shift_targets(np.array([[2], [2]]))
    with pytest.raises(ValueError, match=r"\(batch, tgt_len\)"):
        training.shift_targets(np.array([2, 3, 4]))


def test_metrics():
    refs = ["le chien dort", "la voiture rouge", "les chats"]
    assert training.exact_match(refs, refs) == 1.0
    assert training.exact_match(["le chien dort", "la voiture verte", "les  chats"], refs) == pytest.approx(2 / 3)
    assert training.exact_match([["le", "chien", "dort"]], ["le chien dort"]) == 1.0
    long_refs = ["le grand chien noir dort", "la voiture rouge ne court pas"]
    assert training.corpus_bleu(long_refs, long_refs) == pytest.approx(100.0)
    assert 0 < training.corpus_bleu(["le grand chien noir dort", "la voiture verte ne court pas"], long_refs) < 100
    assert training.corpus_bleu(refs, refs) == 0.0  # no 4-gram in any sentence: BLEU needs longer text
    with pytest.raises(ValueError, match="same length"):
        training.exact_match(refs, refs[:2])
    with pytest.raises(ValueError, match="not one string"):
        training.corpus_bleu("le chien", "le chien")


@pytest.mark.parametrize("norm_first", [False, True])
def test_parameter_count_matches_both_frameworks(norm_first):
    config = dict(d_model=16, num_heads=2, num_layers=2, d_ff=24, max_len=10, dropout=0.0, norm_first=norm_first)
    torch_model = TorchTransformer(23, 29, **config)
    keras_model = KerasTransformer(23, 29, **config)
    keras_model(np.ones((1, 3), "int32"), np.ones((1, 4), "int32"))
    expected = training.transformer_parameter_count(23, 29, 16, 2, 24, norm_first=norm_first)
    assert sum(p.numel() for p in torch_model.parameters()) == expected
    assert keras_model.count_params() == expected
    # The base configuration with 37000 tokens on each side and separate tables (counted by hand: 2 embeddings
    # 37,888,000 + 6 encoder layers of 3,152,384 + 6 decoder layers of 4,204,032 + output layer 18,981,000).
    assert training.transformer_parameter_count(37000, 37000) == 101_007_496
    # Section 3.4's sharing: one 37000 x 512 table (18,944,000) for both embeddings and the output weight, plus
    # the output bias (37,000): 63,119,496, the paper's "65M" for the base model.
    assert training.transformer_parameter_count(37000, 37000, shared_embeddings=True) == 63_119_496
    with pytest.raises(ValueError, match="src_vocab_size must equal tgt_vocab_size"):
        training.transformer_parameter_count(10, 12, shared_embeddings=True)
    with pytest.raises(ValueError, match="d_ff"):
        training.transformer_parameter_count(10, 10, d_ff=0)


# ---------------------------------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------------------------------


def _loss_inputs(seed=0, pad_id=0):
    generator = np.random.default_rng(seed)
    logits = generator.standard_normal((3, 6, 11)).astype("float32") * 3
    labels = generator.integers(1, 11, size=(3, 6))
    labels[0, 4:] = pad_id
    labels[2, 1:] = pad_id
    return logits, labels


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_loss_matches_torch_builtin_and_keras(smoothing):
    logits, labels = _loss_inputs()
    ours = torch_training.label_smoothed_cross_entropy(torch.as_tensor(logits), torch.as_tensor(labels), smoothing)
    builtin = torch.nn.functional.cross_entropy(
        torch.as_tensor(logits).reshape(-1, 11), torch.as_tensor(labels).reshape(-1), ignore_index=0,
        label_smoothing=smoothing,
    )
    assert float(ours) == pytest.approx(float(builtin), abs=1e-6)
    keras_loss = keras_training.label_smoothed_cross_entropy(logits, labels, smoothing)
    assert float(ops.convert_to_numpy(keras_loss)) == pytest.approx(float(ours), abs=1e-5)
    # The Keras built-in with the same smoothing, on the non-PAD positions only.
    keep = labels != 0
    builtin_keras = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=smoothing)(
        np.eye(11, dtype="float32")[labels[keep]], logits[keep]
    )
    assert float(ops.convert_to_numpy(builtin_keras)) == pytest.approx(float(ours), abs=1e-5)
    # The Loss wrapper Keras' compile() uses gives the same number.
    wrapped = keras_training.LabelSmoothedCrossEntropy(smoothing)(labels, logits)
    assert float(ops.convert_to_numpy(wrapped)) == pytest.approx(float(ours), abs=1e-5)


def test_loss_ignores_pad_positions():
    logits, labels = _loss_inputs(seed=1, pad_id=1)
    noisy = logits.copy()
    noisy[labels == 1] += np.random.default_rng(2).standard_normal(noisy[labels == 1].shape).astype("float32") * 50
    for loss in (torch_training.label_smoothed_cross_entropy, keras_training.label_smoothed_cross_entropy):
        convert = torch.as_tensor if loss is torch_training.label_smoothed_cross_entropy else ops.convert_to_tensor
        clean = float(np.asarray(loss(convert(logits), convert(labels), 0.1, pad_id=1)))
        assert float(np.asarray(loss(convert(noisy), convert(labels), 0.1, pad_id=1))) == pytest.approx(clean, rel=1e-6)
        all_pad = np.ones_like(labels)
        assert float(np.asarray(loss(convert(logits), convert(all_pad), 0.1, pad_id=1))) == 0.0
        with pytest.raises(ValueError, match="smoothing"):
            loss(convert(logits), convert(labels), 1.0)
        with pytest.raises(ValueError, match=r"\(batch, tgt_len, vocab\)"):
            loss(convert(logits[0]), convert(labels), 0.1)


def test_paper_adam_matches_torch_adam_where_epsilon_matters():
    """Gradients near 1e-8 make the place of epsilon visible; PaperAdam puts it where torch (and the paper) do."""
    gradients = [np.array([1e-8, -3e-9, 2e-7, 0.5], "float32") * (k + 1) for k in range(4)]
    weight = torch.nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.Adam([weight], lr=0.1, betas=(0.9, 0.98), eps=1e-9)
    variable = keras.Variable(np.zeros(4, "float32"))
    adam = keras_training.PaperAdam(0.1, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    for gradient in gradients:
        weight.grad = torch.as_tensor(gradient)
        optimizer.step()
        adam.apply([ops.convert_to_tensor(gradient)], [variable])
    np.testing.assert_allclose(ops.convert_to_numpy(variable), weight.detach().numpy(), rtol=1e-5)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="sparse embedding gradients are TensorFlow's")
def test_paper_adam_sums_repeated_embedding_rows_like_torch():
    """One Adam step on an embedding whose row 1 appears four times in the batch: the same move in both."""
    ids = np.array([1, 1, 1, 1, 2])
    table = torch.nn.Embedding(4, 3)
    torch.nn.init.zeros_(table.weight)
    optimizer = torch.optim.Adam(table.parameters(), lr=0.1, betas=(0.9, 0.98), eps=1e-9)
    table(torch.as_tensor(ids)).sum().backward()
    optimizer.step()

    layer = keras.layers.Embedding(4, 3, embeddings_initializer="zeros")
    layer.build((None,))
    adam = keras_training.PaperAdam(0.1, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    import tensorflow as tf  # the main test process runs Keras on TensorFlow, where the gradient is sparse

    with tf.GradientTape() as tape:
        total = tf.reduce_sum(layer(ids))
    gradients = tape.gradient(total, layer.trainable_variables)
    assert hasattr(gradients[0], "indices")  # a tf.IndexedSlices, one row per occurrence
    adam.apply_gradients(zip(gradients, layer.trainable_variables, strict=True))
    np.testing.assert_allclose(ops.convert_to_numpy(layer.embeddings), table.weight.detach().numpy(), atol=1e-7)


# ---------------------------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_greedy_decode_stops_each_sentence_and_the_loop(framework):
    for script, max_len in ch07.decoding_scripts(11):
        if framework == "torch":
            model = ch07._torch_scripted_model(script)
            src = torch.full((script.shape[0], 4), 7)
            out = torch_training.greedy_decode(model, src, ch07.BOS_ID, ch07.EOS_ID, max_len).numpy()
        else:
            model = ch07._keras_scripted_model(script)
            src = np.full((script.shape[0], 4), 7, dtype="int32")
            out = ops.convert_to_numpy(keras_training.greedy_decode(model, src, ch07.BOS_ID, ch07.EOS_ID, max_len))
        expected = ch07.greedy_reference(script, max_len)
        np.testing.assert_array_equal(out, expected)
        assert model.calls == expected.shape[1]  # no decoder call after every sentence has finished
        for row in out:  # after </s> only PAD
            if ch07.EOS_ID in row:
                assert (row[list(row).index(ch07.EOS_ID) + 1 :] == ch07.PAD_ID).all()


def test_greedy_decode_rejects_bad_input():
    model = TorchTransformer(10, 10, d_model=8, num_heads=2, num_layers=1, d_ff=8, max_len=8)
    with pytest.raises(ValueError, match=r"\(batch, src_len\)"):
        torch_training.greedy_decode(model, torch.ones(3, dtype=torch.long), 2, 3)
    keras_model = KerasTransformer(10, 10, d_model=8, num_heads=2, num_layers=1, d_ff=8, max_len=8)
    with pytest.raises(ValueError, match=r"\(batch, src_len\)"):
        keras_training.greedy_decode(keras_model, np.ones(3, "int32"), 2, 3)


def _table_scorer(table, vocab=6):
    """next_log_probs for a scorer given as {prefix tuple (after <s>): log-probabilities}; any other prefix
    ends with </s> (id 3) for sure."""
    done = np.log(np.where(np.arange(vocab) == 3, 1.0, 1e-12))

    def next_log_probs(prefixes):
        return np.array([table.get(tuple(int(t) for t in p[1:]), done) for p in prefixes])

    return next_log_probs


def test_beam_search_finds_what_greedy_misses():
    # vocabulary: 0 PAD, 1 unused, 2 <s>, 3 </s>, 4 "a", 5 "b"
    def dist(**probs):
        p = np.full(6, 1e-9)
        for token, value in probs.items():
            p[{"eos": 3, "a": 4, "b": 5}[token]] = value
        return np.log(p / p.sum())

    table = {
        (): dist(a=0.6, b=0.4),  # greedy takes "a" ...
        (4,): dist(eos=0.1, a=0.45, b=0.45),  # ... but everything after "a" is uncertain
        (5,): dist(eos=0.95, a=0.03, b=0.02),  # "b </s>" has probability 0.38 > 0.6 * 0.45 * ...
        (4, 4): dist(eos=0.5, a=0.5),
        (4, 5): dist(eos=0.5, b=0.5),
        (5, 4): dist(eos=1.0),
        (5, 5): dist(eos=1.0),
    }
    scorer = _table_scorer(table)
    greedy = decoding.beam_search_from_scores(scorer, 2, 3, beam_size=1, max_len=5, length_penalty=0.0)
    beam = decoding.beam_search_from_scores(scorer, 2, 3, beam_size=3, max_len=5, length_penalty=0.0)
    assert greedy[0] == 4 and greedy[-1] == 3
    assert beam == [5, 3]
    with pytest.raises(ValueError, match="beam_size"):
        decoding.beam_search_from_scores(scorer, 2, 3, beam_size=0)


def test_length_penalty_favours_longer_hypotheses():
    def dist(eos, a):
        p = np.full(6, 1e-9)
        p[3], p[4] = eos, a
        return np.log(p / p.sum())

    # Stopping now has probability 0.4; going on gives 0.6 * 0.6 = 0.36, a longer sentence just below it.
    table = {(): dist(0.4, 0.6), (4,): dist(0.6, 0.4), (4, 4): dist(1.0, 1e-9)}
    scorer = _table_scorer(table)
    assert decoding.beam_search_from_scores(scorer, 2, 3, beam_size=2, max_len=3, length_penalty=0.0) == [3]
    assert decoding.beam_search_from_scores(scorer, 2, 3, beam_size=2, max_len=3, length_penalty=1.0) == [4, 3]


def test_batch_beam_search_equals_one_sentence_at_a_time():
    # Three random scorers (a fixed table of log-probabilities per prefix), one per sentence of the batch.
    rng = np.random.default_rng(0)
    tables = [{} for _ in range(3)]

    def scores(sentence, prefix):
        key = tuple(int(t) for t in prefix)
        if key not in tables[sentence]:
            logits = rng.normal(size=7) * 2
            logits[0] = -30.0  # never PAD
            tables[sentence][key] = logits - np.log(np.exp(logits).sum())
        return tables[sentence][key]

    for alpha in (0.0, 0.6, 1.0):
        batched = decoding.batch_beam_search_from_scores(
            lambda prefixes, rows: np.array([scores(r, p) for p, r in zip(prefixes, rows, strict=True)]),
            3, 2, 3, beam_size=3, max_len=8, length_penalty=alpha,
        )
        one_by_one = [
            decoding.beam_search_from_scores(
                lambda prefixes, b=b: np.array([scores(b, p) for p in prefixes]), 2, 3, 3, 8, alpha
            )
            for b in range(3)
        ]
        assert batched == one_by_one
    with pytest.raises(ValueError, match="batch_size"):
        decoding.batch_beam_search_from_scores(lambda p, r: None, 0, 2, 3)


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_batch_beam_search_matches_beam_search(framework):
    torch.manual_seed(2)
    keras.utils.set_random_seed(2)
    src = np.array([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0], [2, 9, 10, 3, 0]])
    config = dict(d_model=16, num_heads=2, num_layers=1, d_ff=16, max_len=12, dropout=0.0)
    if framework == "torch":
        model = TorchTransformer(12, 12, **config)
        one = torch_training.beam_search(model, src, 2, 3, beam_size=3, max_len=6).numpy()
        batched = torch_training.batch_beam_search(model, src, 2, 3, beam_size=3, max_len=6).numpy()
    else:
        model = KerasTransformer(12, 12, **config)
        one = ops.convert_to_numpy(keras_training.beam_search(model, src, 2, 3, beam_size=3, max_len=6))
        batched = ops.convert_to_numpy(keras_training.batch_beam_search(model, src, 2, 3, beam_size=3, max_len=6))
    np.testing.assert_array_equal(batched, one)


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_beam_of_one_is_greedy(framework):
    torch.manual_seed(1)
    keras.utils.set_random_seed(1)
    src = np.array([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0]])
    config = dict(d_model=16, num_heads=2, num_layers=1, d_ff=16, max_len=12, dropout=0.0)
    if framework == "torch":
        model = TorchTransformer(12, 12, **config)
        greedy = torch_training.greedy_decode(model, src, 2, 3, max_len=6).numpy()
        beam = torch_training.beam_search(model, src, 2, 3, beam_size=1, max_len=6).numpy()
    else:
        model = KerasTransformer(12, 12, **config)
        greedy = ops.convert_to_numpy(keras_training.greedy_decode(model, src, 2, 3, max_len=6))
        beam = ops.convert_to_numpy(keras_training.beam_search(model, src, 2, 3, beam_size=1, max_len=6))
    width = max(greedy.shape[1], beam.shape[1])
    pad = [np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in (greedy, beam)]
    np.testing.assert_array_equal(pad[0], pad[1])


def test_keras_compiled_next_token_equals_eager_decode():
    """next_token_logits (one compiled call) gives model.decode's last position, built once per model and kept."""
    keras.utils.set_random_seed(2)
    model = KerasTransformer(12, 14, d_model=16, num_heads=2, num_layers=2, d_ff=16, max_len=12, dropout=0.1)
    src = np.array([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0]], dtype="int32")
    memory, src_mask = model.encode(src)
    scorer = keras_training.next_token_logits(model)
    assert keras_training.next_token_logits(model) is scorer
    for steps in (1, 2, 5):  # new lengths: traced again, then one graph for any length
        generated = np.tile(np.arange(2, 2 + steps, dtype="int32"), (2, 1))
        eager = ops.convert_to_numpy(model.decode(generated, memory, src_mask))[:, -1]
        np.testing.assert_allclose(scorer(generated, memory, src_mask), eager, atol=1e-5)
    assert len(model.layers) == len(KerasTransformer(12, 14, d_model=16, num_heads=2, num_layers=2, d_ff=16,
                                                     max_len=12).layers)  # the wrapper is not one of its layers


# ---------------------------------------------------------------------------------------------------------------
# Training: torch and Keras from the same weights, on the same batches
# ---------------------------------------------------------------------------------------------------------------

PARITY_CONFIG = dict(d_model=32, num_heads=4, num_layers=1, d_ff=64, max_len=16, dropout=0.0)
PARITY_STEPS = 20


def _parity_setup():
    pairs = data.toy_translation_pairs(400, seed=3)
    src_vocab, tgt_vocab = data.build_vocabularies(pairs)
    src, tgt = data.encode_pairs(pairs, src_vocab, tgt_vocab)
    batches = list(data.iterate_batches(src, tgt, 20, seed=1))[:PARITY_STEPS]
    return src_vocab, tgt_vocab, src, tgt, batches


@pytest.fixture(scope="module")
def trained_pair():
    """A torch and a Keras trainer after 20 identical steps from identical weights."""
    torch.manual_seed(0)
    src_vocab, tgt_vocab, src, tgt, batches = _parity_setup()
    torch_model = TorchTransformer(len(src_vocab), len(tgt_vocab), **PARITY_CONFIG)
    keras_model = KerasTransformer(len(src_vocab), len(tgt_vocab), **PARITY_CONFIG)
    keras_model(src[:1], tgt[:1, :-1])
    copy_weights(torch_model, keras_model)
    initial_logits = _logits(torch_model, src, tgt)
    torch_trainer = torch_training.Trainer(torch_model, warmup_steps=10, device="cpu")
    keras_trainer = keras_training.Trainer(keras_model, warmup_steps=10, jit_compile=False)
    for batch in batches:
        torch_trainer.train_step(*batch)
        keras_trainer.train_step(*batch)
    return torch_trainer, keras_trainer, (src_vocab, tgt_vocab, src, tgt), initial_logits


def _logits(model: TorchTransformer, src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    """The model's logits for the first 8 pairs, (8, tgt_len - 1, tgt_vocab_size)."""
    return model(torch.as_tensor(src[:8]), torch.as_tensor(tgt[:8, :-1])).detach().numpy()


def test_torch_and_keras_losses_agree_after_20_steps(trained_pair):
    torch_trainer, keras_trainer, _, _ = trained_pair
    torch_loss, keras_loss = np.array(torch_trainer.history["loss"]), np.array(keras_trainer.history["loss"])
    assert len(torch_loss) == len(keras_loss) == PARITY_STEPS
    np.testing.assert_allclose(keras_loss, torch_loss, atol=1e-3)
    np.testing.assert_allclose(keras_trainer.history["lr"], torch_trainer.history["lr"], rtol=1e-6)
    # The Keras optimizer's own rate for the next update (its step counter starts at 0) is the schedule's 21st.
    next_rate = float(ops.convert_to_numpy(keras_trainer.optimizer.learning_rate))
    assert next_rate == pytest.approx(training.warmup_learning_rate(PARITY_STEPS + 1, 32, 10), rel=1e-6)
    assert torch_trainer.optimizer.param_groups[0]["lr"] == pytest.approx(next_rate, rel=1e-6)
    assert torch_loss[-1] < torch_loss[0] - 0.5  # and it is learning


def test_weights_agree_after_training(trained_pair):
    torch_trainer, keras_trainer, (src_vocab, tgt_vocab, src, tgt), initial = trained_pair
    back = TorchTransformer(len(src_vocab), len(tgt_vocab), **PARITY_CONFIG)
    copy_weights(keras_trainer.model, back)
    logits_torch, logits_back = _logits(torch_trainer.model, src, tgt), _logits(back, src, tgt)
    # Adam turns round-off differences in near-zero gradients into full-size steps, so the weights drift apart a
    # little even though the losses agree to 1e-3. How far depends on the CPU's kernels (0.055 at most on an AVX2
    # machine, less with AVX-512), so the drift is measured against what the 20 steps changed: about 1% of it at
    # most, 0.15% on average.
    drift, moved = np.abs(logits_back - logits_torch), np.abs(logits_torch - initial)
    assert moved.mean() > 0.5, "the 20 steps hardly changed the model"
    assert drift.max() < 0.05 * moved.max(), (drift.max(), moved.max())
    assert drift.mean() < 0.01 * moved.mean(), (drift.mean(), moved.mean())


def test_fit_and_evaluate_record_history(trained_pair):
    torch_trainer, keras_trainer, (_, tgt_vocab, src, tgt), _ = trained_pair
    for trainer in (torch_trainer, keras_trainer):
        before = trainer.step
        history = trainer.fit(src[:100], tgt[:100], epochs=2, batch_size=20, seed=5, validation=(src[:40], tgt[:40]),
                              progress=False)
        assert trainer.step == before + 10
        assert len(history["loss"]) == len(history["lr"]) == len(history["step"]) == trainer.step
        assert history["val_step"][-2:] == [before + 5, before + 10] and len(history["val_loss"]) >= 2
        assert history["seconds"][0] > 0
        assert 0 < trainer.evaluate(src[:40], tgt[:40]) < 10
    # The two frameworks saw the same batches again and still agree closely (the drift grows slowly with steps).
    np.testing.assert_allclose(keras_trainer.history["val_loss"], torch_trainer.history["val_loss"], atol=2e-2)


def test_translate_returns_sentences(trained_pair):
    torch_trainer, keras_trainer, (src_vocab, tgt_vocab, _, _), _ = trained_pair
    sentences = ["the dog sleeps", "my small cats do not run"]
    for module, trainer in ((torch_training, torch_trainer), (keras_training, keras_trainer)):
        out = module.translate(trainer.model, sentences, src_vocab, tgt_vocab)
        assert len(out) == 2 and all(isinstance(s, str) for s in out)
        beam = module.translate(trainer.model, sentences, src_vocab, tgt_vocab, beam_size=2)
        assert len(beam) == 2


KERAS_TORCH_BACKEND_SCRIPT = textwrap.dedent(
    """
    import numpy as np, torch, keras
    assert keras.backend.backend() == "torch"
    from companion.convert import copy_weights
    from companion.keras import Transformer as KerasTransformer
    from companion.keras import training as keras_training
    from companion.torch import Transformer as TorchTransformer
    from companion.torch import training as torch_training
    from tests.test_training import PARITY_CONFIG, _parity_setup

    torch.manual_seed(0)
    src_vocab, tgt_vocab, src, tgt, batches = _parity_setup()
    torch_model = TorchTransformer(len(src_vocab), len(tgt_vocab), **PARITY_CONFIG)
    keras_model = KerasTransformer(len(src_vocab), len(tgt_vocab), **PARITY_CONFIG)
    keras_model(src[:1], tgt[:1, :-1])
    copy_weights(torch_model, keras_model)
    torch_trainer = torch_training.Trainer(torch_model, warmup_steps=10, device="cpu")
    keras_trainer = keras_training.Trainer(keras_model, warmup_steps=10)
    for batch in batches:
        torch_trainer.train_step(*batch)
        keras_trainer.train_step(*batch)
    difference = np.abs(np.array(torch_trainer.history["loss"]) - np.array(keras_trainer.history["loss"])).max()
    out = keras_training.translate(keras_model, ["the dog sleeps"], src_vocab, tgt_vocab)
    print("max loss difference", difference, "translation", out)
    assert difference < 1e-3, difference
    """
)


def test_keras_training_on_the_torch_backend():
    """The same parity run with Keras on its torch backend, in a subprocess (the backend is fixed per process)."""
    env = {**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", KERAS_TORCH_BACKEND_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "max loss difference" in result.stdout
