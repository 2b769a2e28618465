"""Checks for chapter 7, "The full model"."""

from __future__ import annotations

import numpy as np

from companion.checks import CheckFailed, _short, call, exercise, expect_close, expect_equal, rng, to_numpy
from companion.checks.tracks import LOSS_SHORTCUTS, expect_answer_type, expect_type, keras_gradients, torch_gradients
from companion.training import transformer_parameter_count, warmup_learning_rate

CHAPTER = "07_full_model"

# ---------------------------------------------------------------------------------------------------------------
# Exercise 1: parameter count
# ---------------------------------------------------------------------------------------------------------------


def _count(
    src_vocab: int,
    tgt_vocab: int,
    d_model: int,
    num_layers: int,
    d_ff: int,
    biases: bool = True,
    norms: bool = True,
    norm_shift: bool = True,
    cross: bool = True,
    output_projection: bool = True,
    generator: bool = True,
) -> int:
    """The parameter count with parts switched off: each switch is one typical mistake."""
    attention = (4 if output_projection else 3) * (d_model * d_model + (d_model if biases else 0))
    ffn = 2 * d_model * d_ff + ((d_ff + d_model) if biases else 0)
    norm = (2 if norm_shift else 1) * d_model if norms else 0
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = (2 if cross else 1) * attention + ffn + (3 if cross else 2) * norm
    head = (d_model * tgt_vocab + (tgt_vocab if biases else 0)) if generator else 0
    return (src_vocab + tgt_vocab) * d_model + num_layers * (encoder_layer + decoder_layer) + head


_CONFIGS = [
    (300, 400, 512, 2, 2048),
    (37000, 37000, 512, 6, 2048),
    (70, 100, 64, 2, 128),
    (11, 13, 8, 3, 20),
]


@exercise(CHAPTER, "count_parameters", "trainable parameters of a Transformer configuration")
def check_count_parameters(count_parameters) -> None:
    for config in _CONFIGS:
        expected = transformer_parameter_count(*config)
        assert expected == _count(*config)
        answer = call(count_parameters, *config)
        expect_answer_type(answer, "int", f"count_parameters{config} (as an int)")
        answer = int(answer)
        expect_equal(
            answer,
            expected,
            f"count_parameters{config}",
            mistakes={
                "the text says: every Linear / Dense layer has a bias; in yours the biases are missing (d_out "
                "numbers each)": _count(*config, biases=False),
                "the text says: every LayerNorm has a scale and a shift; in yours the LayerNorm weights are missing "
                "(d_model numbers each)": _count(*config, norms=False),
                "the text says: every LayerNorm has a scale AND a shift, 2 * d_model numbers; yours counted one "
                "vector": _count(*config, norm_shift=False),
                "the text asks for the course's Transformer with num_layers decoder layers; yours counted a decoder "
                "layer like an encoder layer, but it also has a cross-attention and a third LayerNorm": _count(
                    *config, cross=False
                ),
                "the text asks for the course's Transformer; in yours the output projection W_O of each attention is "
                "missing (4 projections per attention, not 3)": _count(*config, output_projection=False),
                "the text says: the model ends with a Linear / Dense layer from d_model to tgt_vocab_size; in yours "
                "the final Linear / Dense layer (with bias) is missing": _count(*config, generator=False),
            },
        )


# ---------------------------------------------------------------------------------------------------------------
# Exercise 2: the teacher-forcing shift
# ---------------------------------------------------------------------------------------------------------------


def _target_batches(seed: int):
    generator = rng(seed)
    for batch, length in [(2, 5), (3, 7), (1, 3), (4, 2)]:
        ids = generator.integers(4, 30, size=(batch, length))
        ids[:, 0] = 2  # <s>
        for row in range(batch):
            end = int(generator.integers(1, length))
            ids[row, end] = 3  # </s>
            ids[row, end + 1 :] = 0  # PAD
        yield ids


@exercise(CHAPTER, "teacher_forcing_split", "decoder input = target without its last token; labels = without <s>")
def check_teacher_forcing_split(teacher_forcing_split) -> None:
    for ids in _target_batches(4):
        answer = call(teacher_forcing_split, ids.copy())
        if not isinstance(answer, tuple | list) or len(answer) != 2:
            raise CheckFailed("the text says: teacher_forcing_split returns (decoder_input, labels); yours did not "
                              "return two arrays")
        decoder_input, labels = (to_numpy(a) for a in answer)
        expected_input, expected_labels = ids[:, :-1], ids[:, 1:]
        if decoder_input.shape == ids.shape or labels.shape == ids.shape:
            raise CheckFailed(
                f"the text says: both of shape (batch, tgt_len - 1); for a target of shape {ids.shape} both parts "
                f"should have shape {expected_input.shape}: the input drops the last token and the labels drop the "
                "first"
            )
        if np.array_equal(decoder_input, expected_labels) and np.array_equal(labels, expected_input):
            raise CheckFailed("the text says: return (decoder_input, labels), in that order; yours are swapped: the "
                              "decoder input starts with <s>, the labels do not")
        if decoder_input.shape == labels.shape and np.array_equal(decoder_input, labels):
            raise CheckFailed(
                "the text says: the label is the token that FOLLOWS the decoder's input token; yours equal the "
                "decoder input, so the model would learn to copy its input"
            )
        expect_close(decoder_input, expected_input, "the decoder input", atol=0)
        expect_close(
            labels,
            expected_labels,
            "the labels",
            atol=0,
            mistakes={"the text says: the label is the token that follows the input token; yours were shifted the "
                      "wrong way: the labels drop <s>, not the last token": expected_input},
        )


# ---------------------------------------------------------------------------------------------------------------
# Exercise 3: the warm-up schedule
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "warmup_lr", "the paper's learning rate: linear warm-up, then 1/sqrt(step) decay")
def check_warmup_lr(warmup_lr) -> None:
    for d_model, warmup in [(512, 4000), (64, 200), (128, 30)]:
        steps = np.array(sorted({1, 2, warmup // 2, warmup - 1, warmup, warmup + 1, 3 * warmup, 25 * warmup}))
        answer = np.array([float(call(warmup_lr, int(s), d_model, warmup)) for s in steps])
        expected = warmup_learning_rate(steps, d_model, warmup)
        s = steps.astype(float)
        expect_close(
            answer,
            expected,
            f"warmup_lr(step, d_model={d_model}, warmup_steps={warmup}) for steps {steps.tolist()}",
            rtol=1e-6,
            atol=0,
            mistakes={
                "the text says: min(step^-0.5, step * warmup_steps^-1.5); yours has max where the formula has "
                "min": d_model**-0.5 * np.maximum(s**-0.5, s * warmup**-1.5),
                "the text says: step * warmup_steps ** -1.5; your warm-up term uses warmup_steps ** -0.5": (
                    d_model**-0.5 * np.minimum(s**-0.5, s * warmup**-0.5)
                ),
                "the text says: lr = d_model^-0.5 * min(...); in yours the factor d_model ** -0.5 is missing": (
                    np.minimum(s**-0.5, s * warmup**-1.5)
                ),
                "the text says: step^-0.5 = 1 / sqrt(step); your decay term is sqrt(step)": d_model**-0.5
                * np.minimum(s**0.5, s * warmup**-1.5),
                "the text says: step counts updates from 1; yours is off by one (do not add or subtract 1)": (
                    d_model**-0.5 * np.minimum((s + 1) ** -0.5, (s + 1) * warmup**-1.5)
                ),
            },
        )


# ---------------------------------------------------------------------------------------------------------------
# Exercise 4: label-smoothed cross-entropy that ignores PAD
# ---------------------------------------------------------------------------------------------------------------


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def smoothed_loss_variants(logits: np.ndarray, labels: np.ndarray, smoothing: float, pad_id: int) -> dict:
    """The right loss (key ``"right"``) and the value each typical mistake gives, computed in float64."""
    log_probs = _log_softmax(logits.astype(np.float64))
    vocab = logits.shape[-1]
    nll = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    uniform = -log_probs.mean(axis=-1)
    others = (-log_probs.sum(axis=-1) - nll) / (vocab - 1)  # smoothing spread over the other tokens only
    per_token = (1 - smoothing) * nll + smoothing * uniform
    keep = labels != pad_id
    count = max(int(keep.sum()), 1)
    per_sentence = [per_token[r][keep[r]].mean() for r in range(len(labels)) if keep[r].any()]
    return {
        "right": (per_token * keep).sum() / count,
        "the text says: the mean over the non-PAD positions; in yours PAD positions were averaged in (sum over the "
        "non-PAD positions and divide by their number)": per_token.mean(),
        "the text says: (1 - eps) (-log p_label) + eps * the mean of -log p_v; in yours the smoothing is missing": (
            nll * keep
        ).sum() / count,
        "the text says: spread eps evenly over all V tokens, the right one included; yours gave the smoothing to "
        "the other tokens only (smoothing / (vocab - 1) each)": (
            ((1 - smoothing) * nll + smoothing * others) * keep
        ).sum() / count,
        "the text says: the MEAN over the non-PAD positions; yours is summed, not averaged": (per_token * keep).sum(),
        "the text says: the mean over the non-PAD positions of the whole batch; in yours each sentence was averaged "
        "first": np.mean(per_sentence),
    }


def _loss_cases(seed: int):
    generator = rng(seed)
    for batch, length, vocab, smoothing, pad_id in [(2, 5, 7, 0.1, 0), (3, 6, 11, 0.2, 0), (4, 4, 9, 0.1, 1)]:
        logits = (generator.standard_normal((batch, length, vocab)) * 2).astype(np.float32)
        labels = generator.integers(0, vocab, size=(batch, length))
        labels[labels == pad_id] = (pad_id + 1) % vocab
        for row in range(batch):
            labels[row, int(generator.integers(1, length + 1)) :] = pad_id  # right padding, >= 1 token each
        labels[0, -1] = (pad_id + 2) % vocab  # one full-length sentence, so lengths differ
        yield logits, labels, smoothing, pad_id


def _check_loss(loss_fn, convert, name: str, track: str = "numpy") -> None:
    for logits, labels, smoothing, pad_id in _loss_cases(5):
        variants = smoothed_loss_variants(logits, labels, smoothing, pad_id)
        expected = variants.pop("right")
        result = call(loss_fn, *convert(logits, labels), smoothing, pad_id)
        expect_type(result, track, f"the loss of {name}", "float")
        answer = to_numpy(result)
        if answer.shape != ():
            raise CheckFailed(f"the text says: return a scalar tensor; {name} returned shape {answer.shape}, not a "
                              "scalar (shape ())")
        expect_close(
            answer.reshape(()),
            np.asarray(expected),
            f"{name}(logits {logits.shape}, labels {labels.shape}, smoothing={smoothing}, pad_id={pad_id})",
            mistakes={message: np.asarray(value) for message, value in variants.items()},
            atol=1e-5,
            rtol=1e-5,
        )


@exercise(
    CHAPTER, "label_smoothed_loss_torch", "label-smoothed cross-entropy over non-PAD positions (PyTorch)", "torch",
    LOSS_SHORTCUTS,
)
def check_label_smoothed_loss_torch(label_smoothed_loss_torch) -> None:
    import torch

    _check_loss(
        label_smoothed_loss_torch,
        lambda logits, labels: (torch.as_tensor(logits), torch.as_tensor(labels)),
        "label_smoothed_loss_torch",
        "torch",
    )
    # The loss is what training differentiates: it must stay a tensor in the graph of the logits.
    logits, labels, smoothing, pad_id = next(iter(_loss_cases(5)))
    try:
        _, grads, why = torch_gradients(label_smoothed_loss_torch, (torch.as_tensor(logits), torch.as_tensor(labels),
                                                                    smoothing, pad_id), 1.0)
    except Exception as error:
        raise CheckFailed(f"the text says: a scalar tensor that training can differentiate; the loss could not be "
                          f"differentiated: {type(error).__name__}: {error}") from None
    if grads[0] is None:
        raise CheckFailed("the text says: a scalar tensor that training can differentiate; the loss cannot be "
                          "differentiated with respect to the logits: return the tensor itself (not float(loss), "
                          f"loss.item() or a NumPy value); {why}")


@exercise(CHAPTER, "label_smoothed_loss_keras", "label-smoothed cross-entropy over non-PAD positions (Keras)", "keras",
          LOSS_SHORTCUTS)
def check_label_smoothed_loss_keras(label_smoothed_loss_keras) -> None:
    from keras import ops

    _check_loss(
        label_smoothed_loss_keras,
        lambda logits, labels: (ops.convert_to_tensor(logits), ops.convert_to_tensor(labels.astype("int32"))),
        "label_smoothed_loss_keras",
        "keras",
    )
    # As in PyTorch: the loss must stay in the graph of the logits (the backend's autodiff).
    logits, labels, smoothing, pad_id = next(iter(_loss_cases(5)))
    try:
        _, grads, why = keras_gradients(label_smoothed_loss_keras, (ops.convert_to_tensor(logits.astype(np.float32)),
                                                                    ops.convert_to_tensor(labels.astype("int32")),
                                                                    smoothing, pad_id), 1.0)
    except Exception as error:
        raise CheckFailed(f"the text says: a scalar tensor that training can differentiate; the loss could not be "
                          f"differentiated: {type(error).__name__}: {error}") from None
    if grads[0] is None and not why.startswith("the output is a"):  # not a tensor at all: expect_type names that
        raise CheckFailed("the text says: a scalar tensor that training can differentiate; the loss cannot be "
                          "differentiated with respect to the logits: return the Keras tensor itself (no "
                          f"keras.ops.stop_gradient, no float(loss) or NumPy value); {why}")


# ---------------------------------------------------------------------------------------------------------------
# Exercise 5: batched greedy decoding with a stop token
# ---------------------------------------------------------------------------------------------------------------

BOS_ID, EOS_ID, PAD_ID = 2, 3, 0


def decoding_scripts(seed: int) -> list[tuple[np.ndarray, int]]:
    """Token scripts ``(batch, steps)`` for the scripted models, and the ``max_len`` to decode with.

    Rows end with ``</s>`` at different steps; the script goes on with ordinary tokens after it (a decoder that
    keeps generating after ``</s>`` gets them). One case stops at ``max_len`` before every row has finished.
    """
    generator = rng(seed)
    cases = []
    for batch, steps, max_len in [(3, 8, 12), (4, 9, 12), (2, 8, 4), (1, 6, 10)]:
        script = generator.integers(4, 20, size=(batch, steps))
        for row in range(batch):
            script[row, int(generator.integers(0, steps - 2))] = EOS_ID
        cases.append((script, max_len))
    return cases


def greedy_reference(script: np.ndarray, max_len: int, pad_id: int = PAD_ID) -> np.ndarray:
    """What batched greedy decoding must return for a scripted model whose padding id is ``pad_id``."""
    batch, steps = script.shape
    out = np.full((batch, 0), pad_id, dtype=np.int64)
    finished = np.zeros(batch, dtype=bool)
    for t in range(max_len):
        token = np.where(finished, pad_id, script[:, min(t, steps - 1)])
        out = np.concatenate([out, token[:, None]], axis=1)
        finished |= token == EOS_ID
        if finished.all():
            break
    return out


def _greedy_mistakes(script: np.ndarray, max_len: int, pad_id: int = PAD_ID) -> dict[str, np.ndarray]:
    batch, steps = script.shape
    right = greedy_reference(script, max_len, pad_id)
    column = script[:, : right.shape[1]] if right.shape[1] <= steps else None
    full = np.full((batch, max_len), pad_id, dtype=np.int64)
    full[:, : right.shape[1]] = right
    first_done = int(np.argmax((right == EOS_ID).any(axis=0))) + 1 if (right == EOS_ID).any() else right.shape[1]
    mistakes = {
        "the text says: return the generated ids WITHOUT the leading bos_id; your output starts with <s>": (
            np.concatenate([np.full((batch, 1), BOS_ID), right], axis=1)
        ),
        "the text says: stop as soon as every sentence is finished; your loop went on to max_len after every "
        "sentence had finished": full,
        "the text says: stop as soon as EVERY sentence is finished; your loop stopped when the first sentence "
        "finished": right[:, :first_done],
    }
    if column is not None:
        mistakes["the text says: a sentence that has produced eos_id gets model.pad_id from then on; in yours a "
                 "finished sentence kept generating"] = column
    if pad_id != 0:
        mistakes[f"the text says: a finished sentence gets model.pad_id, which is {pad_id} for this model; yours "
                 "filled with 0"] = greedy_reference(script, max_len, 0)
    return mistakes


def _torch_scripted_model(script: np.ndarray, vocab: int = 24, pad_id: int = PAD_ID):
    import torch
    from torch import nn

    padding = pad_id

    class ScriptedModel(nn.Module):
        """Predicts ``script[:, t]`` at decoder position t, whatever it is fed. Counts its decode calls."""

        pad_id, max_len = padding, 64

        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))
            self.script = torch.as_tensor(script)
            self.calls = 0
            self.encodes = 0

        def encode(self, src_ids):
            self.encodes += 1
            return src_ids.float()[..., None] * self.scale, (src_ids != self.pad_id)[:, None, None, :]

        def decode(self, tgt_ids, memory, src_mask):
            self.calls += 1
            batch, steps = tgt_ids.shape
            if batch != self.script.shape[0] or memory.shape[0] != batch:
                raise ValueError(f"the text says: decode the whole batch at once; expected a batch of "
                                 f"{self.script.shape[0]} rows, got {batch}")
            if not bool((tgt_ids[:, 0] == BOS_ID).all()):
                raise ValueError("the text says: start every sentence with bos_id; every decoder input must start "
                                 "with <s>")
            index = torch.arange(steps).clamp(max=self.script.shape[1] - 1)
            logits = torch.zeros(batch, steps, vocab)
            logits.scatter_(2, self.script[:, index][..., None], 5.0)
            return logits

    return ScriptedModel()


def _keras_scripted_model(script: np.ndarray, vocab: int = 24, pad_id: int = PAD_ID):
    from keras import ops

    padding = pad_id

    class ScriptedModel:
        """Predicts ``script[:, t]`` at decoder position t, whatever it is fed. Counts its decode calls."""

        pad_id, max_len = padding, 64

        def __init__(self):
            self.calls = 0
            self.encodes = 0

        def encode(self, src_ids):
            self.encodes += 1
            src = ops.convert_to_tensor(src_ids)
            return ops.cast(src, "float32")[..., None], ops.not_equal(src, self.pad_id)[:, None, None, :]

        def decode(self, tgt_ids, memory, src_mask):
            self.calls += 1
            ids = ops.convert_to_numpy(tgt_ids)
            batch, steps = ids.shape
            if batch != script.shape[0]:
                raise ValueError(f"the text says: decode the whole batch at once; expected a batch of "
                                 f"{script.shape[0]} rows, got {batch}")
            if not (ids[:, 0] == BOS_ID).all():
                raise ValueError("the text says: start every sentence with bos_id; every decoder input must start "
                                 "with <s>")
            index = np.minimum(np.arange(steps), script.shape[1] - 1)
            logits = np.eye(vocab, dtype="float32")[script[:, index]] * 5.0
            return ops.convert_to_tensor(logits)

    return ScriptedModel()


def _check_greedy(decode_fn, make_model, to_ids, name: str) -> None:
    # Position matters: the next token is read at the *last* position of the decoder output.
    script = np.array([[5, 6, 7, 8, 9, EOS_ID]])
    answer = to_numpy(call(decode_fn, make_model(script), to_ids(np.full((1, 3), 7)), BOS_ID, EOS_ID, 10))
    if answer.shape[1:] and answer.shape[1] >= 2 and answer[0, 0] == 5 and answer[0, 1] == 5:
        raise CheckFailed(f"the text says: append the most likely token of the LAST position; {name} read the next "
                          "token at the first position; read it at the last position, logits[:, -1]")
    for case, (script, max_len) in enumerate(decoding_scripts(6)):
        pad_id = PAD_ID if case % 2 == 0 else 1  # the model's padding id is not always 0
        model = make_model(script, pad_id=pad_id)
        src = to_ids(np.full((script.shape[0], 5), 7, dtype=np.int64))
        expected = greedy_reference(script, max_len, pad_id)
        answer = to_numpy(call(decode_fn, model, src, BOS_ID, EOS_ID, max_len))
        what = f"{name}(case {case + 1}: batch {script.shape[0]}, max_len={max_len}, model.pad_id={pad_id})"
        expect_close(answer, expected, what, mistakes=_greedy_mistakes(script, max_len, pad_id), atol=0)
        if model.encodes != 1:
            raise CheckFailed(
                f"the text says: encode the source once; {what} called model.encode {model.encodes} times: encode "
                "the source once, before the loop, and decode step by step with that memory"
            )
        if model.calls > expected.shape[1]:
            raise CheckFailed(
                f"the text says: stop as soon as every sentence is finished; {what} called model.decode "
                f"{model.calls} times for {expected.shape[1]} tokens"
            )


@exercise(CHAPTER, "greedy_decode_torch", "batched greedy decoding that stops at </s> (PyTorch)", "torch")
def check_greedy_decode_torch(greedy_decode_torch) -> None:
    import torch

    _check_greedy(greedy_decode_torch, _torch_scripted_model, torch.as_tensor, "greedy_decode_torch")


@exercise(CHAPTER, "greedy_decode_keras", "batched greedy decoding that stops at </s> (Keras)", "keras")
def check_greedy_decode_keras(greedy_decode_keras) -> None:
    from keras import ops

    _check_greedy(
        greedy_decode_keras,
        _keras_scripted_model,
        lambda ids: ops.convert_to_tensor(ids.astype("int32")),
        "greedy_decode_keras",
    )


# ---------------------------------------------------------------------------------------------------------------
# Find-the-bug (a loss that counts PAD), graded prediction, stretch
# ---------------------------------------------------------------------------------------------------------------


def _masked_nll_cases():
    generator = rng(71)
    # (batch, tgt_len, vocab, pad_id, how many trailing PADs per row); the first cases are padded.
    for batch, tgt_len, vocab, pad_id, pads in [(2, 6, 7, 0, (2, 0)), (3, 4, 5, 3, (1, 3, 0)),
                                                 (1, 5, 9, 0, (0,)), (4, 8, 11, 1, (4, 0, 7, 2))]:
        logits = (generator.standard_normal((batch, tgt_len, vocab)) * 2).astype(np.float32)
        labels = generator.integers(0, vocab, size=(batch, tgt_len))
        labels[labels == pad_id] = (pad_id + 1) % vocab
        for row, count in enumerate(pads):
            if count:
                labels[row, tgt_len - count:] = pad_id
        yield logits, labels, pad_id


def _check_masked_nll(masked_nll, track: str) -> None:
    from companion.checks.tracks import converter, tolerance

    name = f"masked_nll_{track}"
    for logits, labels, pad_id in _masked_nll_cases():
        shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
        keep = labels != pad_id
        int_labels = labels.astype(np.int64 if track == "torch" else np.int32)
        answer = call(masked_nll, *converter(track)(logits, int_labels), pad_id)
        expect_close(
            answer,
            np.float64(nll[keep].mean()),
            f"{name}(logits {logits.shape}, labels {labels.shape}, pad_id={pad_id})",
            mistakes={
                "the text says: the mean over the non-PAD positions; in yours the mean still runs over every "
                "position, PAD included (the original bug): divide by the number of real tokens": np.float64(
                    (nll * keep).sum() / nll.size
                ),
                "the text says: the mean over the non-PAD positions only; in yours PAD positions are counted in the "
                "loss": np.float64(nll.mean()),
                "the text says: the mean over the non-PAD positions of a batch; yours is the mean of each sentence's "
                "mean": np.float64(np.mean([nll[b][keep[b]].mean() for b in range(len(nll))])),
                "the text says: the MEAN over the non-PAD positions; yours is the sum over the non-PAD "
                "positions": np.float64(nll[keep].sum()),
            },
            **tolerance(track),
        )
        expect_type(answer, track, f"the result of {name}", "float")
        if to_numpy(answer).shape != ():
            raise CheckFailed(f"the text says: the result is a scalar float tensor (shape ()); {name} returned "
                              f"shape {to_numpy(answer).shape}")
    if track == "torch":
        import torch

        logits, labels, pad_id = next(iter(_masked_nll_cases()))
        _, grads, why = torch_gradients(masked_nll, (torch.as_tensor(logits), torch.as_tensor(labels), pad_id), 1.0)
        if grads[0] is None:
            raise CheckFailed(f"the text says: a scalar float tensor that training can differentiate; {name} "
                              "cannot be differentiated with respect to the logits: return the tensor itself (not "
                              f".item() or NumPy); {why}")


@exercise(CHAPTER, "masked_nll_torch", "find the bug: mean cross-entropy over the non-PAD tokens (PyTorch)", "torch",
          LOSS_SHORTCUTS)
def check_masked_nll_torch(masked_nll_torch) -> None:
    _check_masked_nll(masked_nll_torch, "torch")


@exercise(CHAPTER, "masked_nll_keras", "find the bug: mean cross-entropy over the non-PAD tokens (Keras)", "keras",
          LOSS_SHORTCUTS)
def check_masked_nll_keras(masked_nll_keras) -> None:
    _check_masked_nll(masked_nll_keras, "keras")


@exercise(CHAPTER, "decode_calls", "predict: how many decode calls the batched greedy loop makes")
def check_decode_calls(decode_calls) -> None:
    cases = [([3, 5, 2], 10), ([3, 5, 2], 4), ([1], 7), ([None, 2], 6), ([4, 4], 4), ([6, 1, 9, 2], 20),
             ([2, None, None], 3), ([5], 1)]
    for eos_steps, max_len in cases:
        answer = call(decode_calls, list(eos_steps), max_len)
        expect_answer_type(answer, "int", f"decode_calls(eos_steps={eos_steps}, max_len={max_len}) (as an int)")
        known = [s for s in eos_steps if s is not None]
        never = len(known) < len(eos_steps)
        expected = max_len if never else min(max(known), max_len)
        expect_equal(
            int(answer),
            expected,
            f"decode_calls(eos_steps={eos_steps}, max_len={max_len})",
            mistakes={
                "the text says: None means never; a sentence that never produces </s> keeps the loop running until "
                "max_len": min(max(known), max_len) if known and never else -1,
                "the text says: stop when every sentence has produced </s>, or after max_len steps; the loop also "
                "stops after max_len steps": max(known) if known and not never else -1,
                "the text says: stop when EVERY sentence has produced </s>, so the slowest one decides, not the "
                "first": min(min(known), max_len) if known else -1,
                "the text says: one decode call per step; one call per generated token of every sentence is what a "
                "loop over sentences makes, the batched loop makes one per step for the whole batch": sum(
                    min(s or max_len, max_len) for s in eos_steps
                ) if len(eos_steps) > 1 else -1,
            },
        )


@exercise(CHAPTER, "best_hypothesis", "beam search's final ranking: sum of log-probs / ((5 + length) / 6)**alpha")
def check_best_hypothesis(best_hypothesis) -> None:
    generator = rng(72)
    # Short hypotheses have the highest raw sums; with alpha = 0.6 a longer one wins in the designed cases.
    designed = [
        [[-0.9, -0.6], [-0.3, -0.4, -0.35, -0.3, -0.2], [-2.0]],
        [[-1.5], [-0.4, -0.4, -0.4, -0.4]],
    ]
    cases = [(h, a) for h in designed for a in (0.0, 0.6)]
    cases.append(([[-1.0], [-0.5, -0.5, -0.6, -0.55]], 2.0))  # length counts the tokens, not <s>
    cases.append(([[-1.0], [-0.5, -0.5, -0.37]], 1.0))  # the order flips when </s> is left out of the length
    cases.append(([[-2.0], [-0.5, -0.5], [-1.0]], 0.0))  # a tie: the first one wins
    cases.append(([[-0.3, -0.4], [-0.9], [-0.3, -0.4]], 0.6))
    for _ in range(6):
        count = int(generator.integers(2, 6))
        hypotheses = [(-generator.exponential(0.4, size=int(generator.integers(1, 12)))).round(4).tolist()
                      for _ in range(count)]
        cases.append((hypotheses, float(generator.choice([0.0, 0.6, 1.0, 2.0]))))
    for hypotheses, alpha in cases:
        answer = call(best_hypothesis, [list(h) for h in hypotheses], alpha)
        expect_answer_type(answer, "int", "best_hypothesis(...) (the int index of the best one)")

        def best(score, hypotheses=hypotheses):
            return int(np.argmax([score(h) for h in hypotheses]))

        expected = best(lambda h, a=alpha: sum(h) / ((5.0 + len(h)) / 6.0) ** a)
        scores = [sum(h) / ((5.0 + len(h)) / 6.0) ** alpha for h in hypotheses]
        wrong = {
            "the text says: the first one on a tie; yours returned a later hypothesis with the same score": max(
                i for i, score in enumerate(scores) if score == scores[expected]),
            "the text says: length counts the hypothesis's log-probabilities, </s> included; yours left </s> out "
            "of the length": best(lambda h, a=alpha: sum(h) / ((4.0 + len(h)) / 6.0) ** a),
            "the text says: length is the number of the hypothesis's log-probabilities; yours counted <s> in the "
            "length": best(lambda h, a=alpha: sum(h) / ((6.0 + len(h)) / 6.0) ** a),
            "the text says: divide the sum by the length penalty ((5 + length) / 6) ** alpha; your score was not "
            "divided": best(sum),
            "the text says: divide the sum by ((5 + length) / 6) ** alpha; the mean log-probability is not that "
            "penalty": best(lambda h: sum(h) / len(h)),
            "the text says: the sum DIVIDED by ((5 + length) / 6) ** alpha; your penalty multiplied the sum": best(
                lambda h, a=alpha: sum(h) * ((5.0 + len(h)) / 6.0) ** a),
            "the text says: return the index of the best one; yours picked the lowest score, the best has the "
            "highest (least negative)": int(
                np.argmin([sum(h) / ((5.0 + len(h)) / 6.0) ** alpha for h in hypotheses])),
        }
        expect_equal(int(answer), expected,
                     f"best_hypothesis({_short(hypotheses, 80)}, alpha={alpha})",
                     mistakes={m: v for m, v in wrong.items() if v != expected})
