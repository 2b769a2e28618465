"""The mistake classes that once passed the checks (issue 10), one wrong answer each, for every exercise it applies to.

Each mutant is a solution with one mistake: a hard-coded argument (``pad_id`` always 0), ``key`` used where
``value`` belongs, the wrong type for the track (a NumPy array, a list or a Python number where a tensor is
specified), a lost gradient, a string for a count, and structure the exercise asks for (encode once). Each must fail
with a message that names it. The last test runs two of them through the grader, whose proxies must keep the
type and the gradient of what the student's code returned.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from keras import ops

from companion.checks import CheckFailed, run_check
from companion.grade import FAILED, PASSED, grade
from companion.notebook_code import load_definitions

ROOT = Path(__file__).resolve().parents[1]


def _solutions(chapter: str) -> dict:
    return load_definitions(ROOT / "solutions" / f"{chapter}.md")


CH1, CH2, CH3, CH4 = (_solutions(c) for c in ("01_text_as_numbers", "02_attention", "03_multihead_attention",
                                              "04_masking"))
CH5, CH6, CH7, CH8 = (_solutions(c) for c in ("05_positional_encoding", "06_add_and_norm", "07_full_model",
                                               "08_gpt"))


def _as_numpy(fn):
    """The right values, returned as NumPy arrays where the track specifies its own tensors."""

    def wrapped(*args, **kwargs):
        result = fn(*args, **kwargs)
        if isinstance(result, tuple):
            return tuple(ops.convert_to_numpy(r) if not isinstance(r, torch.Tensor) else r.detach().numpy()
                         for r in result)
        return result.detach().numpy() if isinstance(result, torch.Tensor) else ops.convert_to_numpy(result)

    return wrapped


def _pad_zero(batch, length, pad_id=0):
    return CH1["pad_batch"](batch, length, 0)


def _pad_list(batch, length, pad_id=0):
    return CH1["pad_batch"](batch, length, pad_id).tolist()


def _mha_key_as_value(query, key, value, params, num_heads, mask=None):
    return CH3["multi_head_attention_torch"](query, key, key, params, num_heads, mask)


def _padding_mask_ints(ids, pad_id=0):
    return CH4["padding_mask_torch"](ids, pad_id).long()


def _loss_float(logits, labels, smoothing, pad_id):
    return float(CH7["label_smoothed_loss_torch"](logits, labels, smoothing, pad_id).detach())


def _loss_detached(logits, labels, smoothing, pad_id):
    return CH7["label_smoothed_loss_torch"](logits, labels, smoothing, pad_id).detach()


def _count_string(*config):
    return str(CH7["count_parameters"](*config))


def _encoder_layer_float(d_model, d_ff, num_heads):
    return float(CH6["encoder_layer_parameters"](d_model, d_ff, num_heads))


def _greedy_reencode(model, src_ids, bos_id, eos_id, max_len):
    class Again:
        """Encodes the source again before every step."""

        pad_id, max_len = model.pad_id, model.max_len

        def encode(self, src):
            return model.encode(src)

        def decode(self, tgt, memory, mask):
            memory, mask = model.encode(src_ids)
            return model.decode(tgt, memory, mask)

    return CH7["greedy_decode_torch"](Again(), src_ids, bos_id, eos_id, max_len)


MUTANTS = [
    ("pad_batch", _pad_zero, "the text says: fill with `pad_id`; yours always fills with 0"),
    ("pad_batch", _pad_list, "return a NumPy integer array; pad_batch\\(.*\\) returned list"),
    ("embed_torch", _as_numpy(CH1["embed_torch"]), "should be a torch.Tensor; got ndarray"),
    ("embed_keras", _as_numpy(CH1["embed_keras"]), "should be a Keras tensor"),
    ("attention_torch", _as_numpy(CH2["attention_torch"]), "should be a torch.Tensor; got ndarray"),
    ("attention_keras", _as_numpy(CH2["attention_keras"]), "should be a Keras tensor"),
    ("split_heads_torch", _as_numpy(CH3["split_heads_torch"]), "should be a torch.Tensor"),
    ("merge_heads_keras", _as_numpy(CH3["merge_heads_keras"]), "should be a Keras tensor"),
    ("multi_head_attention_torch", _mha_key_as_value, "projected from `key`"),
    ("multi_head_attention_keras", _as_numpy(CH3["multi_head_attention_keras"]), "should be a Keras tensor"),
    ("padding_mask_torch", _padding_mask_ints, "a boolean mask, True = may attend"),
    ("padding_mask_keras", _as_numpy(CH4["padding_mask_keras"]), "should be a Keras tensor"),
    ("causal_mask_torch", _as_numpy(CH4["causal_mask_torch"]), "should be a torch.Tensor"),
    ("masked_attention_torch", _as_numpy(CH4["masked_attention_torch"]), "should be a torch.Tensor"),
    ("encoder_input_torch", _as_numpy(CH5["encoder_input_torch"]), "should be a torch.Tensor"),
    ("encoder_input_keras", _as_numpy(CH5["encoder_input_keras"]), "should be a Keras tensor"),
    ("label_smoothed_loss_torch", _loss_float, "cannot be differentiated.*the output is a float"),
    ("label_smoothed_loss_torch", _loss_detached, "cannot be differentiated"),
    ("label_smoothed_loss_keras", _as_numpy(CH7["label_smoothed_loss_keras"]), "should be a Keras tensor"),
    ("count_parameters", _count_string, "is an int; got str '"),
    ("encoder_layer_parameters", _encoder_layer_float, "\\(as an int\\) is an int; got float"),
    ("greedy_decode_torch", _greedy_reencode, "called model.encode \\d+ times: encode the source once"),
]


@pytest.mark.parametrize("exercise_id, wrong, message", MUTANTS,
                         ids=[f"{m[0]}-{i}" for i, m in enumerate(MUTANTS)])
def test_each_mistake_class_is_named(exercise_id, wrong, message):
    with pytest.raises(CheckFailed, match=message):
        run_check(exercise_id, wrong)


def test_the_one_rule_for_answer_types():
    from companion.checks.tracks import ANSWER_TYPE_RULE, expect_answer_type

    for value, kind in [(12, "int"), (np.int64(12), "int"), (0.5, "float"), (np.float32(0.5), "float"),
                        ((1, 2), "tuple"), ([1], "list"), ({}, "dict"), ("error", "str")]:
        expect_answer_type(value, kind, "the answer")
    for value, kind, got in [(12.0, "int", "float"), (True, "int", "bool"), (12, "float", "int"),
                             (np.bool_(True), "float", "bool"), ([1, 2], "tuple", "list"), ((1,), "list", "tuple"),
                             (np.array(0.5), "float", "ndarray")]:
        with pytest.raises(CheckFailed, match=f"the answer is an? {kind}; got {got}.*{re.escape(ANSWER_TYPE_RULE)}"):
            expect_answer_type(value, kind, "the answer")
    with pytest.raises(ValueError, match="kind must be one of"):
        expect_answer_type(1, "number", "the answer")


def test_messages_show_where_the_largest_difference_is():
    def off_by_one(ids, num_words):
        out = np.eye(num_words + 1, dtype=np.float32)[ids]
        out[0, 1, 2] += 1.0
        return out

    with pytest.raises(CheckFailed, match=r"largest difference 1 at index \(0, 1, 2\): got \d\.?\d*, expected \d"):
        run_check("one_hot_batch", off_by_one)


_BLOCK = r"(def {symbol}\(.*?\n[ \t]*### BEGIN SOLUTION[^\n]*\n).*?(^[ \t]*### END SOLUTION)"


def _mutate(tmp_path: Path, chapter: str, symbol: str, body: str) -> Path:
    text = (ROOT / "solutions" / f"{chapter}.md").read_text(encoding="utf-8")
    text, count = re.compile(_BLOCK.format(symbol=symbol), re.S | re.M).subn(lambda m: m[1] + body + m[2], text)
    assert count == 1
    folder = tmp_path / symbol
    folder.mkdir()
    path = folder / f"{chapter}.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_types_and_gradients_survive_the_grader(tmp_path):
    """Through the sandbox: a detached residual and a loss turned into a float fail; the rest of each passes."""
    residual = _mutate(tmp_path, "06_add_and_norm", "pre_ln_sublayer_torch",
                       "    return x.detach() + sublayer(norm(x))\n")
    loss = _mutate(tmp_path, "07_full_model", "label_smoothed_loss_torch",
                   "    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()))\n")
    report = grade([residual, loss], tracks=["torch"])
    first, second = report.notebooks
    result = first.result("pre_ln_sublayer_torch")
    assert (result.status, result.reason) == (FAILED, "wrong"), result
    assert "residual path must stay in the graph" in result.message
    result = second.result("label_smoothed_loss_torch")
    assert result.status == FAILED and result.reason in ("wrong", "shortcut"), result
    assert all(r.status == PASSED for r in first.exercises + second.exercises
               if r.id not in ("pre_ln_sublayer_torch", "label_smoothed_loss_torch") and r.track != "keras")


def _detached(fn):
    def wrapped(*args, **kwargs):
        result = fn(*args, **kwargs)
        return tuple(r.detach() for r in result) if isinstance(result, tuple) else result.detach()

    return wrapped


@pytest.mark.parametrize("exercise_id, chapter", [("embed_torch", CH1), ("attention_torch", CH2),
                                                  ("multi_head_attention_torch", CH3),
                                                  ("masked_attention_torch", CH4)])
def test_a_detached_result_loses_its_gradient(exercise_id, chapter):
    with pytest.raises(CheckFailed, match="no gradient reaches argument"):
        run_check(exercise_id, _detached(chapter[exercise_id]))


def _stopped(fn, keep=()):
    """A Keras answer whose float tensor arguments go through keras.ops.stop_gradient (those in ``keep`` do not):
    the values are right, the gradient is lost."""

    def wrapped(*args):
        return fn(*(ops.stop_gradient(a) if i not in keep and ops.is_tensor(a) and "float" in str(a.dtype) else a
                    for i, a in enumerate(args)))

    return wrapped


def _pre_ln_stopped(x, sublayer, norm):
    return ops.stop_gradient(x) + sublayer(norm(x))


KERAS_STOPPED = [
    ("embed_keras", _stopped(CH1["embed_keras"]), "no gradient reaches argument 2"),
    ("attention_keras", _stopped(CH2["attention_keras"]), "no gradient reaches argument 1"),
    ("multi_head_attention_keras", _stopped(CH3["multi_head_attention_keras"], keep=(0,)),
     "no gradient reaches argument 2"),
    ("masked_attention_keras", _stopped(CH4["masked_attention_keras"]), "no gradient reaches argument 1"),
    ("encoder_input_keras", _stopped(CH5["encoder_input_keras"]), "no gradient reaches argument 2"),
    ("pre_ln_sublayer_keras", _pre_ln_stopped, "residual path must stay in the graph.*stop_gradient"),
    ("label_smoothed_loss_keras", _stopped(CH7["label_smoothed_loss_keras"]), "cannot be differentiated"),
    ("cached_attention_keras", _stopped(CH8["cached_attention_keras"], keep=(0, 3, 4)),
     "no gradient reaches argument 2"),
]


@pytest.mark.parametrize("exercise_id, wrong, message", KERAS_STOPPED, ids=[m[0] for m in KERAS_STOPPED])
def test_a_keras_answer_that_stops_the_gradient_fails(exercise_id, wrong, message):
    with pytest.raises(CheckFailed, match=message):
        run_check(exercise_id, wrong)


def test_keras_gradients_are_computed_in_the_students_process(tmp_path):
    """Through the sandbox: the backend's autodiff runs next to the student's code and the grader compares; a
    stop_gradient on the residual or on the inputs of attention fails, the solutions' other Keras answers pass."""
    residual = _mutate(tmp_path, "06_add_and_norm", "pre_ln_sublayer_keras",
                       "    return ops.add(ops.stop_gradient(x), sublayer(norm(x)))\n")
    attention = _mutate(tmp_path, "02_attention", "attention_keras",
                        "    q, k, v = (ops.stop_gradient(t) for t in (q, k, v))\n"
                        "    weights = ops.softmax(ops.matmul(q, ops.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1]))\n"
                        "    return ops.matmul(weights, v), weights\n")
    report = grade([residual, attention], tracks=["keras"])
    first, second = report.notebooks
    result = first.result("pre_ln_sublayer_keras")
    assert (result.status, result.reason) == (FAILED, "wrong"), result
    assert "residual path must stay in the graph (no keras.ops.stop_gradient" in result.message
    result = second.result("attention_keras")
    assert (result.status, result.reason) == (FAILED, "wrong"), result
    assert "no gradient reaches argument 1" in result.message and "stop_gradient" in result.message
    assert all(r.status == PASSED for r in first.exercises + second.exercises
               if r.id not in ("pre_ln_sublayer_keras", "attention_keras") and r.track != "torch")
