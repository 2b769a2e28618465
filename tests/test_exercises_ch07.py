"""Typical wrong answers to the exercises of chapter 7: each must be named in the check's message.

The generic tests in test_exercises.py already cover "the solution passes, the stub fails" for this chapter.
"""

import numpy as np
import pytest
import torch
from keras import ops

from companion.checks import CheckFailed, exercises_for, run_check

# ---------------------------------------------------------------------------------------------------------------
# Exercise 1: parameter count
# ---------------------------------------------------------------------------------------------------------------


def _counter(biases=True, norms=True, cross=True, w_o=True, generator=True, heads=False, as_float=False):
    def count_parameters(src_vocab_size, tgt_vocab_size, d_model, num_layers, d_ff):
        attention = (4 if w_o else 3) * (d_model * d_model + (d_model if biases else 0))
        if heads:  # counts d_model x d_model per head
            attention *= 8
        ffn = 2 * d_model * d_ff + ((d_ff + d_model) if biases else 0)
        norm = 2 * d_model if norms else 0
        encoder = attention + ffn + 2 * norm
        decoder = (2 if cross else 1) * attention + ffn + (3 if cross else 2) * norm
        out = (d_model * tgt_vocab_size + (tgt_vocab_size if biases else 0)) if generator else 0
        total = (src_vocab_size + tgt_vocab_size) * d_model + num_layers * (encoder + decoder) + out
        return float(total) if as_float else total

    return count_parameters


# ---------------------------------------------------------------------------------------------------------------
# Exercise 2: teacher-forcing shift
# ---------------------------------------------------------------------------------------------------------------


def _split_swapped(tgt_ids):
    return tgt_ids[:, 1:], tgt_ids[:, :-1]


def _split_no_shift(tgt_ids):
    return tgt_ids, tgt_ids


def _split_copy(tgt_ids):
    return tgt_ids[:, :-1], tgt_ids[:, :-1]


def _split_input_unshifted(tgt_ids):
    return tgt_ids, tgt_ids[:, 1:]


def _split_both_drop_bos(tgt_ids):
    return tgt_ids[:, 1:], tgt_ids[:, 1:]


# ---------------------------------------------------------------------------------------------------------------
# Exercise 3: warm-up schedule
# ---------------------------------------------------------------------------------------------------------------


def _lr_max(step, d_model, warmup_steps):
    return d_model**-0.5 * max(step**-0.5, step * warmup_steps**-1.5)


def _lr_exponent(step, d_model, warmup_steps):
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-0.5)


def _lr_no_d_model(step, d_model, warmup_steps):
    return min(step**-0.5, step * warmup_steps**-1.5)


def _lr_sqrt(step, d_model, warmup_steps):
    return d_model**-0.5 * min(step**0.5, step * warmup_steps**-1.5)


def _lr_off_by_one(step, d_model, warmup_steps):
    step = step + 1
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


# ---------------------------------------------------------------------------------------------------------------
# Exercise 4: label-smoothed loss
# ---------------------------------------------------------------------------------------------------------------


def _loss_torch(average_pad=False, smooth=True, others=False, total=False, per_sentence=False, as_float=False,
                as_vector=False):
    def label_smoothed_loss_torch(logits, labels, smoothing, pad_id):
        log_probs = torch.log_softmax(logits.double(), dim=-1)
        nll = -log_probs.gather(-1, labels.long()[..., None])[..., 0]
        if others:
            rest = (-log_probs.sum(-1) - nll) / (logits.shape[-1] - 1)
        else:
            rest = -log_probs.mean(-1)
        per_token = (1 - smoothing) * nll + smoothing * rest if smooth else nll
        keep = (labels != pad_id).double()
        if average_pad:
            return per_token.mean()
        if total:
            return (per_token * keep).sum()
        if per_sentence:
            return ((per_token * keep).sum(1) / keep.sum(1)).mean()
        if as_float:
            return ((per_token * keep).sum() / keep.sum()).item()
        if as_vector:
            return ((per_token * keep).sum() / keep.sum()).reshape(1)
        return (per_token * keep).sum() / keep.sum()

    return label_smoothed_loss_torch


def _loss_keras_as_numpy(logits, labels, smoothing, pad_id):
    log_probs = ops.log_softmax(logits, axis=-1)
    nll = -ops.squeeze(ops.take_along_axis(log_probs, ops.expand_dims(ops.cast(labels, "int32"), -1), -1), -1)
    keep = ops.cast(ops.not_equal(labels, pad_id), nll.dtype)
    per_token = (1 - smoothing) * nll + smoothing * -ops.mean(log_probs, axis=-1)
    return ops.convert_to_numpy(ops.sum(per_token * keep) / ops.sum(keep))


def _loss_keras_pad_averaged(logits, labels, smoothing, pad_id):
    log_probs = ops.log_softmax(logits, axis=-1)
    nll = -ops.squeeze(ops.take_along_axis(log_probs, ops.expand_dims(ops.cast(labels, "int32"), -1), -1), -1)
    return ops.mean((1 - smoothing) * nll + smoothing * -ops.mean(log_probs, axis=-1))


def _loss_keras_unsmoothed(logits, labels, smoothing, pad_id):
    log_probs = ops.log_softmax(logits, axis=-1)
    nll = -ops.squeeze(ops.take_along_axis(log_probs, ops.expand_dims(ops.cast(labels, "int32"), -1), -1), -1)
    keep = ops.cast(ops.not_equal(labels, pad_id), "float32")
    return ops.sum(nll * keep) / ops.sum(keep)


def _loss_keras_summed(logits, labels, smoothing, pad_id):
    log_probs = ops.log_softmax(logits, axis=-1)
    nll = -ops.squeeze(ops.take_along_axis(log_probs, ops.expand_dims(ops.cast(labels, "int32"), -1), -1), -1)
    keep = ops.cast(ops.not_equal(labels, pad_id), "float32")
    return ops.sum(((1 - smoothing) * nll + smoothing * -ops.mean(log_probs, axis=-1)) * keep)


# ---------------------------------------------------------------------------------------------------------------
# Exercise 5: greedy decoding
# ---------------------------------------------------------------------------------------------------------------


def _greedy_torch(keep_bos=False, no_pad=False, stop_first=False, never_stop=False, first_position=False,
                  pad_zero=False):
    def greedy_decode_torch(model, src_ids, bos_id, eos_id, max_len):
        memory, src_mask = model.encode(src_ids)
        generated = torch.full((src_ids.shape[0], 1), bos_id, dtype=torch.long)
        finished = torch.zeros(src_ids.shape[0], dtype=torch.bool)
        for _ in range(max_len):
            logits = model.decode(generated, memory, src_mask)
            next_ids = logits[:, 0 if first_position else -1].argmax(-1)
            if not no_pad:
                next_ids = next_ids.masked_fill(finished, 0 if pad_zero else model.pad_id)
            generated = torch.cat([generated, next_ids[:, None]], dim=1)
            finished |= next_ids == eos_id
            if stop_first and finished.any():
                break
            if not never_stop and finished.all():
                break
        return generated if keep_bos else generated[:, 1:]

    return greedy_decode_torch


def _greedy_keras_no_pad(model, src_ids, bos_id, eos_id, max_len):
    memory, src_mask = model.encode(src_ids)
    generated = ops.full((src_ids.shape[0], 1), bos_id, dtype="int32")
    finished = ops.zeros((src_ids.shape[0],), dtype="bool")
    for _ in range(max_len):
        next_ids = ops.cast(ops.argmax(model.decode(generated, memory, src_mask)[:, -1], axis=-1), "int32")
        generated = ops.concatenate([generated, next_ids[:, None]], axis=1)
        finished = ops.logical_or(finished, ops.equal(next_ids, eos_id))
        if bool(ops.convert_to_numpy(ops.all(finished))):
            break
    return generated[:, 1:]


def _greedy_keras_keep_bos(model, src_ids, bos_id, eos_id, max_len):
    memory, src_mask = model.encode(src_ids)
    generated = ops.full((src_ids.shape[0], 1), bos_id, dtype="int32")
    finished = ops.zeros((src_ids.shape[0],), dtype="bool")
    for _ in range(max_len):
        next_ids = ops.cast(ops.argmax(model.decode(generated, memory, src_mask)[:, -1], axis=-1), "int32")
        next_ids = ops.where(finished, model.pad_id, next_ids)
        generated = ops.concatenate([generated, next_ids[:, None]], axis=1)
        finished = ops.logical_or(finished, ops.equal(next_ids, eos_id))
        if bool(ops.convert_to_numpy(ops.all(finished))):
            break
    return generated


def _greedy_keras_pad_zero(model, src_ids, bos_id, eos_id, max_len):
    memory, src_mask = model.encode(src_ids)
    generated = ops.full((src_ids.shape[0], 1), bos_id, dtype="int32")
    finished = ops.zeros((src_ids.shape[0],), dtype="bool")
    for _ in range(max_len):
        next_ids = ops.cast(ops.argmax(model.decode(generated, memory, src_mask)[:, -1], axis=-1), "int32")
        next_ids = ops.where(finished, 0, next_ids)
        generated = ops.concatenate([generated, next_ids[:, None]], axis=1)
        finished = ops.logical_or(finished, ops.equal(next_ids, eos_id))
        if bool(ops.convert_to_numpy(ops.all(finished))):
            break
    return generated[:, 1:]


def _greedy_keras_never_stops(model, src_ids, bos_id, eos_id, max_len):
    memory, src_mask = model.encode(src_ids)
    generated = ops.full((src_ids.shape[0], 1), bos_id, dtype="int32")
    finished = ops.zeros((src_ids.shape[0],), dtype="bool")
    for _ in range(max_len):
        next_ids = ops.cast(ops.argmax(model.decode(generated, memory, src_mask)[:, -1], axis=-1), "int32")
        next_ids = ops.where(finished, model.pad_id, next_ids)
        generated = ops.concatenate([generated, next_ids[:, None]], axis=1)
        finished = ops.logical_or(finished, ops.equal(next_ids, eos_id))
    return generated[:, 1:]


def _nll_torch(kind):
    def masked_nll_torch(logits, labels, pad_id):
        log_probs = torch.log_softmax(logits, dim=-1)
        nll = -log_probs.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
        keep = (labels != pad_id).to(nll.dtype)
        if kind == "pad_in_mean":
            return (nll * keep).mean()
        if kind == "all":
            return nll.mean()
        if kind == "sum":
            return (nll * keep).sum()
        if kind == "item":
            return float(((nll * keep).sum() / keep.sum()).detach())
        if kind == "detached":
            return ((nll * keep).sum() / keep.sum()).detach()
        if kind == "per_row":
            return ((nll * keep).sum(-1) / keep.sum(-1)).mean()
        raise ValueError(kind)

    return masked_nll_torch


def _nll_keras(kind):
    def masked_nll_keras(logits, labels, pad_id):
        log_probs = ops.log_softmax(logits, axis=-1)
        labels = ops.cast(labels, "int32")
        nll = -ops.squeeze(ops.take_along_axis(log_probs, ops.expand_dims(labels, -1), axis=-1), -1)
        keep = ops.cast(ops.not_equal(labels, pad_id), nll.dtype)
        if kind == "pad_in_mean":
            return ops.mean(nll * keep)
        if kind == "all":
            return ops.mean(nll)
        if kind == "numpy":
            return ops.convert_to_numpy(ops.sum(nll * keep) / ops.sum(keep))
        if kind == "vector":
            return ops.sum(nll * keep, axis=-1) / ops.sum(keep)
        raise ValueError(kind)

    return masked_nll_keras


def _calls(kind):
    def decode_calls(eos_steps, max_len):
        known = [s for s in eos_steps if s is not None]
        if kind == "first":
            return min(known)
        if kind == "no_cap":
            return max(known) if len(known) == len(eos_steps) else max_len
        if kind == "ignore_none":
            return min(max(known), max_len) if known else max_len
        if kind == "float":
            return float(max_len if len(known) < len(eos_steps) else min(max(known), max_len))
        raise ValueError(kind)

    return decode_calls


def _best(kind):
    def best_hypothesis(hypotheses, alpha):
        if kind == "raw":
            scores = [sum(h) for h in hypotheses]
        elif kind == "mean":
            scores = [sum(h) / len(h) for h in hypotheses]
        elif kind == "multiply":
            scores = [sum(h) * ((5.0 + len(h)) / 6.0) ** alpha for h in hypotheses]
        elif kind == "length_plus_one":  # counts <s> in the length
            scores = [sum(h) / ((6.0 + len(h)) / 6.0) ** alpha for h in hypotheses]
        elif kind == "without_eos":  # leaves </s> out of the length
            scores = [sum(h) / ((4.0 + len(h)) / 6.0) ** alpha for h in hypotheses]
        elif kind == "last_on_tie":
            scores = [sum(h) / ((5.0 + len(h)) / 6.0) ** alpha for h in hypotheses]
            return max(i for i, score in enumerate(scores) if score == max(scores))
        else:
            raise ValueError(kind)
        return int(np.argmax(scores)) if kind != "raw" else np.float64(np.argmax(scores))

    return best_hypothesis


# The mistake classes of the catalogue (companion.instructor.synthetic.mistake_classes counts them).
NAMED_INPUTS = [
    ("greedy_decode_torch", _greedy_torch(pad_zero=True), "which is 1 for this model; yours filled with 0"),
    ("greedy_decode_keras", _greedy_keras_pad_zero, "which is 1 for this model; yours filled with 0"),
    ("best_hypothesis", _best("without_eos"), "yours left </s> out of the length"),
    ("best_hypothesis", _best("last_on_tie"), "the first one on a tie"),
]
STATED_TYPES = [
    ("label_smoothed_loss_torch", _loss_torch(as_float=True), "a scalar tensor that training can differentiate"),
    ("label_smoothed_loss_keras", _loss_keras_as_numpy, "should be a Keras tensor"),
    ("label_smoothed_loss_torch", _loss_torch(as_vector=True), r"returned shape \(1,\), not a scalar"),
    ("count_parameters", _counter(as_float=True), r"\(as an int\) is an int; got float"),
    ("decode_calls", _calls("float"), r"\(as an int\) is an int; got float"),
]


CH07_NEW_MISTAKES = [
    ("masked_nll_torch", _nll_torch("pad_in_mean"), "original bug"),
    ("masked_nll_torch", _nll_torch("all"), "PAD positions are counted"),
    ("masked_nll_torch", _nll_torch("sum"), "the sum over the non-PAD"),
    ("masked_nll_torch", _nll_torch("per_row"), "each sentence's mean"),
    ("masked_nll_torch", _nll_torch("item"), "cannot be differentiated|torch.Tensor"),
    ("masked_nll_torch", _nll_torch("detached"), "cannot be differentiated"),
    ("masked_nll_keras", _nll_keras("pad_in_mean"), "original bug"),
    ("masked_nll_keras", _nll_keras("all"), "PAD positions are counted"),
    ("masked_nll_keras", _nll_keras("numpy"), "Keras tensor"),
    ("masked_nll_keras", _nll_keras("vector"), "shape"),
    ("decode_calls", _calls("first"), "slowest one decides"),
    ("decode_calls", _calls("no_cap"), "after max_len steps"),
    ("decode_calls", _calls("ignore_none"), "never produces"),
    ("best_hypothesis", _best("raw"), "is an int; got float64"),
    ("best_hypothesis", _best("mean"), "mean log-probability"),
    ("best_hypothesis", _best("multiply"), "multiplied the sum|not divided"),
    ("best_hypothesis", _best("length_plus_one"), "counted <s>"),
]


TAGGED_TYPES = [case for case in CH07_NEW_MISTAKES if (case[0], case[2]) in {
    ("masked_nll_torch", "cannot be differentiated|torch.Tensor"), ("masked_nll_keras", "Keras tensor"),
    ("best_hypothesis", "is an int; got float64")}]
MISTAKE_CLASSES = {"an input the text names": NAMED_INPUTS, "a type the text states": STATED_TYPES + TAGGED_TYPES}


@pytest.mark.parametrize(
    "exercise_id, wrong, message",
    [
        ("count_parameters", _counter(biases=False), "biases are missing"),
        ("count_parameters", _counter(norms=False), "LayerNorm weights are missing"),
        ("count_parameters", _counter(cross=False), "cross-attention"),
        ("count_parameters", _counter(w_o=False), "W_O"),
        ("count_parameters", _counter(generator=False), "final Linear"),
        ("count_parameters", _counter(heads=True), "differs|should be"),
        ("teacher_forcing_split", _split_swapped, "swapped"),
        ("teacher_forcing_split", _split_no_shift, "drops the last token"),
        ("teacher_forcing_split", _split_copy, "learn to copy"),
        ("teacher_forcing_split", _split_input_unshifted, "drops the last token"),
        ("teacher_forcing_split", _split_both_drop_bos, "learn to copy"),
        ("warmup_lr", _lr_max, "max where the formula has min"),
        ("warmup_lr", _lr_exponent, r"\*\* -1.5"),
        ("warmup_lr", _lr_no_d_model, "d_model \\*\\* -0.5 is missing"),
        ("warmup_lr", _lr_sqrt, "sqrt"),
        ("warmup_lr", _lr_off_by_one, "off by one"),
        ("label_smoothed_loss_torch", _loss_torch(average_pad=True), "PAD positions were averaged in"),
        ("label_smoothed_loss_torch", _loss_torch(smooth=False), "smoothing is missing"),
        ("label_smoothed_loss_torch", _loss_torch(others=True), "other tokens only"),
        ("label_smoothed_loss_torch", _loss_torch(total=True), "summed, not averaged"),
        ("label_smoothed_loss_torch", _loss_torch(per_sentence=True), "each sentence was averaged first"),
        ("label_smoothed_loss_keras", _loss_keras_pad_averaged, "PAD positions were averaged in"),
        ("label_smoothed_loss_keras", _loss_keras_unsmoothed, "smoothing is missing"),
        ("label_smoothed_loss_keras", _loss_keras_summed, "summed, not averaged"),
        ("greedy_decode_torch", _greedy_torch(keep_bos=True), "starts with <s>"),
        ("greedy_decode_torch", _greedy_torch(no_pad=True), "kept generating"),
        ("greedy_decode_torch", _greedy_torch(stop_first=True), "first sentence finished"),
        ("greedy_decode_torch", _greedy_torch(never_stop=True), "after every sentence had finished"),
        ("greedy_decode_torch", _greedy_torch(first_position=True), "last position"),
        ("greedy_decode_keras", _greedy_keras_no_pad, "kept generating"),
        ("greedy_decode_keras", _greedy_keras_keep_bos, "starts with <s>"),
        ("greedy_decode_keras", _greedy_keras_never_stops, "after every sentence had finished"),
        *CH07_NEW_MISTAKES,
        *NAMED_INPUTS,
        *STATED_TYPES,
    ],
)
def test_typical_mistakes_are_named(exercise_id, wrong, message):
    with pytest.raises(CheckFailed, match=message):
        run_check(exercise_id, wrong)


def test_chapter_7_has_both_tracks():
    tracks = {e.track for e in exercises_for("07_full_model")}
    assert tracks == {"numpy", "torch", "keras"}


def test_a_hard_coded_count_fails():
    with pytest.raises(CheckFailed):
        run_check("count_parameters", lambda *args: 13_681_040)


def test_greedy_check_counts_decoder_calls():
    """An answer that decodes one extra time after everything finished is caught, even with the right output."""

    def one_call_too_many(model, src_ids, bos_id, eos_id, max_len):
        out = _greedy_torch()(model, src_ids, bos_id, eos_id, max_len)
        memory, mask = model.encode(src_ids)
        model.decode(torch.full((src_ids.shape[0], 1), bos_id), memory, mask)
        return out

    with pytest.raises(CheckFailed, match=r"called model\.(decode|encode)"):
        run_check("greedy_decode_torch", one_call_too_many)


def test_scripted_reference_matches_the_companion_decoder():
    """The checkers' idea of greedy decoding is the companion's: run both on the same scripted model."""
    from companion.checks import ch07
    from companion.torch.training import greedy_decode

    for script, max_len in ch07.decoding_scripts(6):
        model = ch07._torch_scripted_model(script)
        model.max_len = max_len + 1  # the companion caps at model.max_len - 1
        out = greedy_decode(model, torch.full((script.shape[0], 4), 7), ch07.BOS_ID, ch07.EOS_ID, max_len)
        np.testing.assert_array_equal(out.numpy(), ch07.greedy_reference(script, max_len))


def test_the_find_the_bug_stub_of_chapter_7_runs_and_its_bug_is_named():
    from pathlib import Path

    from companion.notebook_code import load_definitions

    root = Path(__file__).resolve().parents[1]
    stubs = load_definitions(root / "exercises" / "07_full_model.md")
    for exercise_id in ("masked_nll_torch", "masked_nll_keras"):
        with pytest.raises(CheckFailed, match="the original bug"):
            run_check(exercise_id, stubs[exercise_id])


def test_every_new_exercise_of_chapter_7_has_at_least_three_mistakes():
    for exercise_id in ("masked_nll_torch", "masked_nll_keras", "decode_calls", "best_hypothesis"):
        assert sum(m[0] == exercise_id for m in CH07_NEW_MISTAKES) >= 3, exercise_id
