"""Issue 33: the algorithms around the layers, value for value against libraries nobody here wrote.

Five families, each compared on the same inputs with outside code, and where the conventions differ the difference
is asserted in closed form rather than "close":

1. **Learning-rate schedules.** The paper's schedule (``companion.training.warmup_learning_rate``, driven by
   ``LambdaLR`` in the PyTorch trainer and by ``WarmupSchedule`` in the Keras trainer) against Hugging Face's
   ``get_inverse_sqrt_schedule`` (one update apart: see the test), torch's ``LinearLR`` and the linear warm-up of
   Keras' ``CosineDecay``; the rate each framework's optimizer actually applies at every update of a real
   ``Trainer``, read back from its Adam moments. Chapters 8 and 9 train with torch's own schedulers:
   ``OneCycleLR(max_lr=3e-3, total_steps=600, pct_start=0.1)`` (``benchmarks/bench_modern_decoder.py``, the one-cycle
   variants of ``benchmarks/bench_gpt.py``), checked against two halves of Keras' ``CosineDecay``, and, where
   ``bench_gpt.py`` defines it, the warm-up plus half cosine of build-nanogpt against Hugging Face's
   ``get_cosine_with_min_lr_schedule_with_warmup`` and Keras' ``CosineDecay``. Chapter 8 trains in PyTorch only (its
   Keras GPT receives the trained weights), so it has no Keras schedule to compare.
2. **Label smoothing.** ``label_smoothed_cross_entropy`` (both frameworks) against ``torch.nn.CrossEntropyLoss``,
   Keras' ``CategoricalCrossentropy`` / ``SparseCategoricalCrossentropy`` and Hugging Face's ``LabelSmoother``, with
   PAD positions; fairseq's and the Annotated Transformer's conventions differ by the closed forms asserted below.
3. **Sampling.** ``companion.sampling`` (which both frameworks' ``gpt.generate`` call) against Hugging Face's
   ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper``: kept tokens and probabilities, ties,
   ``top_p`` near 0 and at 1, ``k = 1`` and ``k >= vocab``; and ``generate`` replayed draw by draw.
4. **BLEU.** ``companion.training.corpus_bleu`` against ``sacrebleu.corpus_bleu`` and Papineni et al.'s formula.
5. **The error classifier** ``companion.errors.classify_error`` against hand labels.
"""

from __future__ import annotations

import functools
import importlib
import math
import random
import sys
from collections import Counter
from pathlib import Path

import keras
import numpy as np
import pytest
import sacrebleu
import torch
import torch.nn.functional as F
from keras import ops
from transformers import get_cosine_with_min_lr_schedule_with_warmup, get_inverse_sqrt_schedule
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.trainer_pt_utils import LabelSmoother

import companion.keras as ck
import companion.torch as ct
from companion import data, errors, sampling, training
from companion.keras import training as keras_training
from companion.torch import training as torch_training

ROOT = Path(__file__).resolve().parents[1]


def _float(x) -> float:
    """A scalar from a torch tensor, a Keras tensor or a NumPy number."""
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(ops.convert_to_numpy(x))


# ---------------------------------------------------------------------------------------------------------------
# 1. Learning-rate schedules
# ---------------------------------------------------------------------------------------------------------------

#: (d_model, warmup_steps, factor) of every use of the paper's schedule: the paper (section 5.3); chapter 7 and
#: bench_translation's RECIPE; bench_translation's SMALL_RECIPE; its "no warm-up" variant (the peak at once).
PAPER_SCHEDULES = {
    "paper": (512, 4000, 1.0),
    "chapter 7": (64, 200, 0.5),
    "small": (32, 100, 0.5),
    "no warm-up": (32, 1, 0.5 / math.sqrt(100)),
}


def _peak(d_model: int, warmup: int, factor: float) -> float:
    """The schedule's highest rate, reached at update ``warmup``: factor * (d_model * warmup)^-1/2."""
    return factor * (d_model * warmup) ** -0.5


def _rates_used(optimizer: torch.optim.Optimizer, scheduler, updates: int, key: str = "lr") -> np.ndarray:
    """``param_groups[0][key]`` as each of ``updates`` optimizer steps reads it (before the step), float64.

    The optimizer has no gradient, so its steps would change nothing; the scheduler alone moves the value.
    """
    values = []
    optimizer.step()  # no gradients, nothing moves; once is enough for the scheduler to see the optimizer stepped
    for _ in range(updates):
        value = optimizer.param_groups[0][key]
        values.append(value[0] if key == "betas" else value)
        if scheduler is not None:
            scheduler.step()
    return np.array(values, dtype=np.float64)


def _one_parameter_optimizer(lr: float, kind: str = "sgd") -> torch.optim.Optimizer:
    parameter = torch.nn.Parameter(torch.zeros(1))
    if kind == "adamw":
        return torch.optim.AdamW([parameter], lr=lr, weight_decay=0.01)
    return torch.optim.SGD([parameter], lr=lr)


def _keras_values(schedule, steps) -> np.ndarray:
    """A Keras schedule at each of ``steps``; one call per step (``CosineDecay``'s warm-up branch is an ``ops.cond``,
    which takes a scalar), float64."""
    return np.array([float(ops.convert_to_numpy(schedule(int(step)))) for step in steps])


@pytest.mark.parametrize("name", list(PAPER_SCHEDULES))
def test_paper_schedule_is_hugging_face_inverse_sqrt_one_update_ahead(name):
    """The algebra. With ``peak = factor (d_model w)^-1/2`` and updates counted from n = 1,

        course(n) = factor d_model^-1/2 min(n^-1/2, n w^-3/2) = peak * min(n / w, sqrt(w / n)).

    Hugging Face's ``get_inverse_sqrt_schedule(num_warmup_steps=w)`` (its timescale defaults to w) is a
    ``LambdaLR`` on the base rate, whose counter i is 0 at the first update:

        hf(i) = i / w  for i < w,   1 / sqrt((i + timescale - w) / timescale) = sqrt(w / i)  for i >= w,

    so course(n) = peak * hf(n): the course's update n runs at Hugging Face's rate for update n + 1. Hugging Face
    spends its first update at rate 0 (hf(0) = 0) where the course uses peak / w, and reaches the peak one update
    later. The course's ``LambdaLR`` passes ``index + 1`` for exactly this reason. With w = 1 (no warm-up),
    course(n) = peak n^-1/2 is also Hugging Face's ``num_warmup_steps=0, timescale=1`` with no shift at all.
    """
    d_model, warmup, factor = PAPER_SCHEDULES[name]
    updates = 2 * warmup + 50
    optimizer, scheduler = torch_training.make_optimizer(torch.nn.Linear(1, 1), d_model, warmup, factor)
    ours = _rates_used(optimizer, scheduler, updates)
    np.testing.assert_allclose(
        ours, training.warmup_learning_rate(np.arange(1, updates + 1), d_model, warmup, factor), rtol=1e-12, atol=0
    )
    reference = _one_parameter_optimizer(_peak(d_model, warmup, factor))
    theirs = _rates_used(reference, get_inverse_sqrt_schedule(reference, num_warmup_steps=warmup), updates + 1)
    assert theirs[0] == 0.0 and ours[0] == pytest.approx(_peak(d_model, warmup, factor) / warmup, rel=1e-12)
    np.testing.assert_allclose(ours, theirs[1:], rtol=1e-12, atol=0)
    assert int(np.argmax(ours)) + 1 == warmup and int(np.argmax(theirs)) == warmup  # the peak, one update apart
    if warmup == 1:
        unshifted = _one_parameter_optimizer(_peak(d_model, warmup, factor))
        no_warmup = get_inverse_sqrt_schedule(unshifted, num_warmup_steps=0, timescale=1)
        np.testing.assert_allclose(ours, _rates_used(unshifted, no_warmup, updates), rtol=1e-12, atol=0)
    # The Keras trainer's schedule (float32), called as Keras calls it: with the number of updates already done.
    keras_rates = ops.convert_to_numpy(keras_training.WarmupSchedule(d_model, warmup, factor)(np.arange(updates)))
    np.testing.assert_allclose(keras_rates, theirs[1:], rtol=2e-6, atol=0)


@pytest.mark.parametrize("name", ["paper", "chapter 7", "small"])
def test_paper_warm_up_is_torch_linear_lr_and_keras_cosine_decay_warm_up(name):
    """Up to the peak the schedule is a straight line from peak / w (update 1) to the peak (update w): torch's
    ``LinearLR(start_factor=1/w, end_factor=1, total_iters=w-1)`` and the warm-up of Keras'
    ``CosineDecay(initial_learning_rate=peak/w, warmup_target=peak, warmup_steps=w-1)``, both counting from 0.
    Neither library has the inverse-square-root decay: torch only through a ``LambdaLR``, and Keras'
    ``InverseTimeDecay`` is ``1 / (1 + rate t)``, not ``t^-1/2``."""
    d_model, warmup, factor = PAPER_SCHEDULES[name]
    peak = _peak(d_model, warmup, factor)
    ours = training.warmup_learning_rate(np.arange(1, warmup + 1), d_model, warmup, factor)
    linear = _one_parameter_optimizer(peak)
    scheduler = torch.optim.lr_scheduler.LinearLR(linear, start_factor=1 / warmup, end_factor=1.0,
                                                  total_iters=warmup - 1)
    np.testing.assert_allclose(_rates_used(linear, scheduler, warmup), ours, rtol=1e-10, atol=0)
    keras_warmup = keras.optimizers.schedules.CosineDecay(peak / warmup, decay_steps=1, warmup_target=peak,
                                                          warmup_steps=warmup - 1)
    steps = np.unique(np.linspace(0, warmup - 1, 25).astype(int))  # a sample: one eager call per step
    np.testing.assert_allclose(_keras_values(keras_warmup, steps), ours[steps], rtol=2e-6, atol=0)


TRAINER = dict(d_model=16, warmup=4, factor=0.5, updates=8, smoothing=0.1)


@functools.lru_cache(maxsize=1)
def _translation_batches():
    pairs = data.toy_translation_pairs(120, seed=3)
    src_vocab, tgt_vocab = data.build_vocabularies(pairs)
    src, tgt = data.encode_pairs(pairs, src_vocab, tgt_vocab)
    batches = list(data.iterate_batches(src, tgt, 12, seed=1))[: TRAINER["updates"]]
    return len(src_vocab), len(tgt_vocab), batches


def _tiny_transformer_config() -> dict:
    return dict(d_model=TRAINER["d_model"], num_heads=2, num_layers=1, d_ff=32, max_len=16, dropout=0.0)


def _applied_rate(before: np.ndarray, after: np.ndarray, m: np.ndarray, v: np.ndarray, update: int) -> float:
    """The learning rate an Adam update used, recovered from its effect on one weight tensor.

    Both trainers' Adam (``torch.optim.Adam`` and ``PaperAdam``) apply
    ``w -= lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)`` with the moments after the update, so
    ``lr = (before - after) / direction``, read at the entry whose direction is largest (least round-off).
    """
    beta1, beta2 = torch_training.ADAM_BETAS
    direction = m / (1 - beta1**update) / (np.sqrt(v / (1 - beta2**update)) + torch_training.ADAM_EPSILON)
    index = np.unravel_index(np.argmax(np.abs(direction)), direction.shape)
    assert abs(direction[index]) > 0.3, "no weight moved far enough to read the rate from"
    return float((before[index] - after[index]) / direction[index])


def _smoothed_reference_loss(logits: np.ndarray, labels: np.ndarray, smoothing: float, pad_id: int) -> float:
    """``torch.nn.CrossEntropyLoss(label_smoothing, ignore_index=PAD)`` on logits ``(batch, tgt_len, vocab)``."""
    loss = torch.nn.CrossEntropyLoss(label_smoothing=smoothing, ignore_index=pad_id)
    flat_labels = torch.as_tensor(np.asarray(labels, dtype=np.int64)).reshape(-1)
    return float(loss(torch.as_tensor(logits).reshape(-1, logits.shape[-1]), flat_labels))


def test_torch_trainer_applies_the_schedule_at_every_update():
    """What ``torch.optim.Adam`` actually applied at each update of ``companion.torch.training.Trainer``, read back
    from the weights and the Adam moments, against Hugging Face's inverse-sqrt schedule one update ahead; the first
    loss against ``torch.nn.CrossEntropyLoss`` on the untrained model's logits."""
    src_vocab_size, tgt_vocab_size, batches = _translation_batches()
    torch.manual_seed(0)
    model = ct.Transformer(src_vocab_size, tgt_vocab_size, **_tiny_transformer_config())
    trainer = torch_training.Trainer(model, warmup_steps=TRAINER["warmup"], factor=TRAINER["factor"],
                                     smoothing=TRAINER["smoothing"], device="cpu")
    decoder_input, labels = training.shift_targets(batches[0][1])
    first_logits = model(torch.as_tensor(batches[0][0]), torch.as_tensor(decoder_input)).detach().numpy()
    watched = max(model.parameters(), key=lambda p: p.numel())  # the target embedding table
    applied = []
    for update, (src, tgt) in enumerate(batches, start=1):
        before = watched.detach().double().numpy().copy()
        trainer.train_step(src, tgt)
        state = trainer.optimizer.state[watched]
        applied.append(_applied_rate(before, watched.detach().double().numpy(), state["exp_avg"].double().numpy(),
                                     state["exp_avg_sq"].double().numpy(), update))
    reference = _one_parameter_optimizer(_peak(TRAINER["d_model"], TRAINER["warmup"], TRAINER["factor"]))
    expected = _rates_used(reference, get_inverse_sqrt_schedule(reference, TRAINER["warmup"]), len(batches) + 1)[1:]
    np.testing.assert_allclose(applied, expected, rtol=1e-4)
    np.testing.assert_allclose(trainer.history["lr"], expected, rtol=1e-12)
    assert trainer.history["loss"][0] == pytest.approx(
        _smoothed_reference_loss(first_logits, labels, TRAINER["smoothing"], model.pad_id), rel=1e-6)


def test_keras_trainer_applies_the_schedule_at_every_update():
    """The same for ``companion.keras.training.Trainer``: the rate ``PaperAdam`` applied at each update (read back
    from the weights and its moments), the rate its schedule gives for the optimizer's step counter just before
    the update, and the history, against Hugging Face's schedule one update ahead; the first loss against
    ``torch.nn.CrossEntropyLoss`` on the untrained Keras model's logits."""
    src_vocab_size, tgt_vocab_size, batches = _translation_batches()
    keras.utils.set_random_seed(0)
    model = ck.Transformer(src_vocab_size, tgt_vocab_size, **_tiny_transformer_config())
    decoder_input, labels = training.shift_targets(batches[0][1].astype("int32"))
    first_logits = ops.convert_to_numpy(model(batches[0][0].astype("int32"), decoder_input))  # builds the model
    trainer = keras_training.Trainer(model, warmup_steps=TRAINER["warmup"], factor=TRAINER["factor"],
                                     smoothing=TRAINER["smoothing"])
    watched = max(model.trainable_variables, key=lambda v: int(np.prod(v.shape)))
    applied, scheduled = [], []
    for update, (src, tgt) in enumerate(batches, start=1):
        before = ops.convert_to_numpy(watched).astype(np.float64)
        if trainer.optimizer.built:
            scheduled.append(_float(trainer.optimizer.learning_rate))  # schedule(iterations): what the update reads
        trainer.train_step(src, tgt)
        index = trainer.optimizer._get_variable_index(watched)
        moments = (trainer.optimizer._momentums[index], trainer.optimizer._velocities[index])
        m, v = (ops.convert_to_numpy(x).astype(np.float64) for x in moments)
        applied.append(_applied_rate(before, ops.convert_to_numpy(watched).astype(np.float64), m, v, update))
    assert int(ops.convert_to_numpy(trainer.optimizer.iterations)) == len(batches)
    reference = _one_parameter_optimizer(_peak(TRAINER["d_model"], TRAINER["warmup"], TRAINER["factor"]))
    expected = _rates_used(reference, get_inverse_sqrt_schedule(reference, TRAINER["warmup"]), len(batches) + 1)[1:]
    np.testing.assert_allclose(applied, expected, rtol=1e-4)
    np.testing.assert_allclose(scheduled, expected[1:], rtol=2e-6)  # the optimizer is built at the first update
    np.testing.assert_allclose(trainer.history["lr"], expected, rtol=1e-12)
    assert trainer.history["loss"][0] == pytest.approx(
        _smoothed_reference_loss(first_logits, labels, TRAINER["smoothing"], model.pad_id), rel=1e-5)


#: Chapters 8 and 9's one-cycle schedule: peak 3e-3, 600 updates, 10% warm-up; torch's defaults otherwise
#: (cosine annealing, div_factor 25, final_div_factor 1e4, two phases, beta1 cycled between 0.85 and 0.95).
ONE_CYCLE = dict(max_lr=3e-3, total_steps=600, pct_start=0.1)


def _one_cycle_expected(max_lr: float, total_steps: int, pct_start: float) -> tuple[np.ndarray, int]:
    """The one-cycle rates from Keras' ``CosineDecay``, and the index of the peak update.

    ``OneCycleLR`` anneals with ``end + (start - end) / 2 * (1 + cos(pi * t))`` over two phases that meet at
    counter ``p = pct_start * total_steps - 1`` (update p + 1). Keras' ``CosineDecay(initial, decay_steps, alpha)``
    is ``initial * ((1 - alpha) / 2 * (1 + cos(pi * s / decay_steps)) + alpha)``, the same curve from ``initial``
    to ``alpha * initial``, so:

    * warm-up, counters 0..p: ``CosineDecay(max_lr / 25, p, alpha=25)`` (alpha > 1: the cosine goes *up*);
    * decay, counters p..total-1: ``CosineDecay(max_lr, total - 1 - p, alpha=1 / (25 * 1e4))`` at ``counter - p``.
    """
    peak_index = int(pct_start * total_steps) - 1
    initial, final = max_lr / 25, max_lr / 25 / 1e4
    warm = keras.optimizers.schedules.CosineDecay(initial, peak_index, alpha=max_lr / initial)
    decay = keras.optimizers.schedules.CosineDecay(max_lr, total_steps - 1 - peak_index, alpha=final / max_lr)
    rates = np.concatenate([
        ops.convert_to_numpy(warm(np.arange(peak_index + 1))),
        ops.convert_to_numpy(decay(np.arange(1, total_steps - peak_index))),
    ]).astype(np.float64)
    return rates, peak_index


def _one_cycle_beta1_expected(total_steps: int, pct_start: float) -> np.ndarray:
    """``OneCycleLR``'s default ``cycle_momentum=True`` moves AdamW's beta1 against the rate: 0.95 down to 0.85
    during the warm-up, back to 0.95 during the decay, with the same cosine (Keras' ``CosineDecay`` again)."""
    peak_index = int(pct_start * total_steps) - 1
    down = keras.optimizers.schedules.CosineDecay(0.95, peak_index, alpha=0.85 / 0.95)
    up = keras.optimizers.schedules.CosineDecay(0.85, total_steps - 1 - peak_index, alpha=0.95 / 0.85)
    return np.concatenate([ops.convert_to_numpy(down(np.arange(peak_index + 1))),
                           ops.convert_to_numpy(up(np.arange(1, total_steps - peak_index)))]).astype(np.float64)


def test_one_cycle_schedule_equals_two_halves_of_keras_cosine_decay():
    """Chapters 8 and 9's ``OneCycleLR`` against Keras' ``CosineDecay``, update by update (float32 on the Keras side:
    the differences are round-off, at most a few 1e-10 on rates up to 3e-3). Keras has no one-cycle schedule, and
    its own warm-up (``warmup_target``) is a straight line: a Keras port using it would differ from torch's cosine
    warm-up by ``(max_lr - max_lr / 25) * (x - (1 - cos(pi x)) / 2)`` at fraction x of the warm-up, up to 10.5% of
    that rise (at x = 0.22 and 0.78), asserted here in closed form."""
    optimizer = _one_parameter_optimizer(ONE_CYCLE["max_lr"], "adamw")
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, **ONE_CYCLE)
    ours = _rates_used(optimizer, scheduler, ONE_CYCLE["total_steps"])
    expected, peak_index = _one_cycle_expected(**ONE_CYCLE)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-9)
    # What chapter 8 says of it: from 3e-3 / 25 up to 3e-3 over the first tenth (update 60), then down.
    assert ours[0] == pytest.approx(3e-3 / 25, rel=1e-12) and int(np.argmax(ours)) == peak_index == 59
    assert ours[peak_index] == pytest.approx(3e-3, rel=1e-12) and ours[-1] < 3e-3 / 25 / 1e4 * 1.01
    # Keras' linear warm-up is not torch's cosine one: the gap in closed form.
    fraction = np.arange(peak_index + 1) / peak_index
    linear = keras.optimizers.schedules.CosineDecay(3e-3 / 25, decay_steps=1, warmup_target=3e-3,
                                                    warmup_steps=peak_index)
    steps = np.arange(0, peak_index + 1, 4)
    gap = _keras_values(linear, steps) - ours[steps]
    rise = 3e-3 - 3e-3 / 25
    np.testing.assert_allclose(gap, rise * (fraction[steps] - (1 - np.cos(np.pi * fraction[steps])) / 2), atol=1e-9)
    assert 0.10 * rise < np.abs(gap).max() < 0.106 * rise
    # The beta1 cycle of the default cycle_momentum=True (bench_gpt.py's "one-cycle-beta1").
    optimizer = _one_parameter_optimizer(ONE_CYCLE["max_lr"], "adamw")
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, **ONE_CYCLE)
    beta1 = _rates_used(optimizer, scheduler, ONE_CYCLE["total_steps"], key="betas")
    np.testing.assert_allclose(beta1, _one_cycle_beta1_expected(ONE_CYCLE["total_steps"], ONE_CYCLE["pct_start"]),
                               rtol=0, atol=1e-6)


def _bench_gpt():
    """``benchmarks/bench_gpt.py`` imported as a module (it puts the repository and benchmarks/ on sys.path)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module("bench_gpt")


def test_chapter_8_warm_up_cosine_equals_hugging_face_and_keras():
    """Chapter 8's warm-up plus half cosine (build-nanogpt's ``get_lr``: ``(i + 1) / W`` for i < W, then
    ``floor + (1 - floor) (1 + cos(pi (i - W) / (T - W))) / 2``), as ``bench_gpt.make_schedule`` builds it.

    * Hugging Face's ``get_cosine_with_min_lr_schedule_with_warmup(num_warmup_steps=W, num_training_steps=T,
      min_lr_rate=floor)`` gives the same decay from counter W on, but its warm-up is ``i / W``: one update
      behind (0 at the first update, the peak first at update W + 1 where the chapter reaches it at update W).
    * Keras: the decay is ``CosineDecay(peak, T - W, alpha=floor)`` at ``i - W``; the warm-up is the linear warm-up
      of ``CosineDecay(peak / W, warmup_target=peak, warmup_steps=W - 1)``, also torch's
      ``LinearLR(1 / W, 1, total_iters=W - 1)``.

    Also every variant bench_gpt.py runs: "constant-lr" leaves the rate at its peak, "one-cycle" is the schedule of
    the test above with beta1 fixed, "one-cycle-beta1" the same with beta1 cycled.
    """
    bench = _bench_gpt()
    if not hasattr(bench, "make_schedule"):
        pytest.skip("this bench_gpt.py has no make_schedule: chapter 8 still trains with OneCycleLR (tested above)")
    peak, total, warmup, floor = bench.PEAK_LR, bench.STEPS, bench.WARMUP, bench.FLOOR
    used = {}
    for kind in ("warmup-cosine", "constant", "one-cycle", "one-cycle-beta1"):
        optimizer = _one_parameter_optimizer(peak, "adamw")
        scheduler = bench.make_schedule(optimizer, kind)
        used[kind] = _rates_used(optimizer, scheduler, total)
        optimizer = _one_parameter_optimizer(peak, "adamw")
        used[kind + " beta1"] = _rates_used(optimizer, bench.make_schedule(optimizer, kind), total, key="betas")
    ours = used["warmup-cosine"]
    reference = _one_parameter_optimizer(peak)
    hf = _rates_used(reference, get_cosine_with_min_lr_schedule_with_warmup(
        reference, num_warmup_steps=warmup, num_training_steps=total, min_lr_rate=floor), total)
    np.testing.assert_allclose(ours[warmup:], hf[warmup:], rtol=1e-12, atol=0)
    np.testing.assert_allclose(ours[: warmup - 1], hf[1:warmup], rtol=1e-12, atol=0)  # one update behind
    assert hf[0] == 0.0 and ours[warmup - 1] == ours[warmup] == pytest.approx(peak, rel=1e-12)
    decay = keras.optimizers.schedules.CosineDecay(peak, total - warmup, alpha=floor)
    np.testing.assert_allclose(ours[warmup:], ops.convert_to_numpy(decay(np.arange(total - warmup))), rtol=2e-6)
    keras_warmup = keras.optimizers.schedules.CosineDecay(peak / warmup, decay_steps=1, warmup_target=peak,
                                                          warmup_steps=warmup - 1)
    np.testing.assert_allclose(ours[:warmup], _keras_values(keras_warmup, range(warmup)), rtol=2e-6)
    linear = _one_parameter_optimizer(peak)
    scheduler = torch.optim.lr_scheduler.LinearLR(linear, 1 / warmup, 1.0, total_iters=warmup - 1)
    np.testing.assert_allclose(ours[:warmup], _rates_used(linear, scheduler, warmup), rtol=1e-10)
    # The other variants.
    assert (used["constant"] == peak).all() and (used["constant beta1"] == 0.9).all()
    one_cycle, _ = _one_cycle_expected(peak, total, 0.1)
    np.testing.assert_allclose(used["one-cycle"], one_cycle, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(used["one-cycle-beta1"], one_cycle, rtol=1e-5, atol=1e-9)
    assert (used["one-cycle beta1"] == 0.9).all() and (used["warmup-cosine beta1"] == 0.9).all()
    np.testing.assert_allclose(used["one-cycle-beta1 beta1"], _one_cycle_beta1_expected(total, 0.1), atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# 2. Label smoothing
# ---------------------------------------------------------------------------------------------------------------
#
# Who spreads the smoothing mass eps over which classes (V = vocabulary size, y = the right token):
#
# * over all V classes, y included: q = (1 - eps) onehot(y) + eps / V, so y gets 1 - eps + eps / V. This is the
#   course (both frameworks: (1 - eps) * nll + eps * mean_k(-log p_k)), Szegedy et al. 2016 (section 7, u(k) = 1/K),
#   torch.nn.CrossEntropyLoss(label_smoothing), keras.losses.CategoricalCrossentropy(label_smoothing) and Hugging
#   Face's LabelSmoother. The Transformer paper only says "label smoothing of value eps_ls = 0.1", citing Szegedy.
# * over the V - 1 other classes: y gets exactly 1 - eps, every other class eps / (V - 1). fairseq's
#   label_smoothed_nll_loss (eps_i = eps / (V - 1), loss = (1 - eps - eps_i) nll + eps_i sum_k(-log p_k)).
#   Since it is the V convention with eps' = eps V / (V - 1), the difference is eps / (V - 1) * (u - nll) per token
#   (u = mean_k(-log p_k)), asserted below.
# * over V - 2 classes, neither y nor PAD: the Annotated Transformer's LabelSmoothing (true_dist filled with
#   eps / (size - 2), 1 - eps scattered on y, the PAD column and the rows whose label is PAD zeroed, KLDivLoss with
#   reduction="sum", divided by the number of tokens). Being a KL divergence it also subtracts the target's entropy
#   H(q) = -(1 - eps) log(1 - eps) - eps log(eps / (V - 2)), a constant that moves the value, not the gradient.
#
# PAD: the course averages over the positions whose label is not PAD, as CrossEntropyLoss(ignore_index=PAD),
# SparseCategoricalCrossentropy(ignore_class=PAD) and LabelSmoother (labels -100) do. Keras' CategoricalCrossentropy
# with PAD weighted 0 divides by every position, PAD included ("sum_over_batch_size"): smaller by n_real / n_all.

VOCAB = 11


def _smoothing_inputs(pad_id: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Logits ``(4, 7, VOCAB)`` and labels ``(4, 7)`` with PAD after each sentence's end (never inside it)."""
    generator = np.random.default_rng(seed)
    logits = (generator.standard_normal((4, 7, VOCAB)) * 3).astype("float32")
    labels = generator.integers(0, VOCAB, size=(4, 7))
    labels[labels == pad_id] = (pad_id + 1) % VOCAB
    labels[0, 5:], labels[1, 2:], labels[3, 6:] = pad_id, pad_id, pad_id
    return logits, labels


def _terms(logits: np.ndarray, labels: np.ndarray, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per non-PAD position, float64: ``nll = -log p[y]``, ``u = mean_k(-log p_k)`` and ``-log p[PAD]``."""
    log_probs = torch.log_softmax(torch.as_tensor(logits, dtype=torch.float64), dim=-1).numpy()
    keep = labels != pad_id
    rows, targets = log_probs[keep], labels[keep]
    return -rows[np.arange(len(targets)), targets], -rows.mean(axis=-1), -rows[:, pad_id]


def _course_losses(logits: np.ndarray, labels: np.ndarray, eps: float, pad_id: int) -> tuple[float, float]:
    ours_torch = torch_training.label_smoothed_cross_entropy(torch.as_tensor(logits), torch.as_tensor(labels), eps,
                                                             pad_id)
    return _float(ours_torch), _float(keras_training.label_smoothed_cross_entropy(logits, labels, eps, pad_id))


@pytest.mark.parametrize("pad_id", [0, 3])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.25])
def test_smoothed_loss_equals_torch_keras_and_hugging_face(eps, pad_id):
    logits, labels = _smoothing_inputs(pad_id)
    ours_torch, ours_keras = _course_losses(logits, labels, eps, pad_id)
    builtin = _smoothed_reference_loss(logits, labels, eps, pad_id)
    assert ours_torch == pytest.approx(builtin, abs=1e-6) and ours_keras == pytest.approx(builtin, abs=1e-5)
    keep = labels != pad_id
    onehot = np.eye(VOCAB, dtype="float32")[labels]
    categorical = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=eps)
    assert _float(categorical(onehot[keep], logits[keep])) == pytest.approx(ours_torch, abs=1e-5)
    weighted = _float(categorical(onehot, logits, sample_weight=keep.astype("float32")))
    assert weighted == pytest.approx(ours_torch * keep.sum() / keep.size, abs=1e-5)  # PAD counted in the mean
    hugging_face = LabelSmoother(epsilon=eps)({"logits": torch.as_tensor(logits)},
                                              torch.as_tensor(np.where(keep, labels, -100)))
    assert _float(hugging_face) == pytest.approx(ours_torch, abs=1e-6)
    # Keras' sparse loss has no label_smoothing: it is the plain cross-entropy, and the course's smoothing adds
    # eps * mean(u - nll) to it (the loss is linear in eps: (1 - eps) nll + eps u = nll + eps (u - nll)).
    sparse = _float(keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=pad_id)(labels, logits))
    nll, uniform, _ = _terms(logits, labels, pad_id)
    assert sparse == pytest.approx(nll.mean(), abs=1e-5)
    assert ours_torch - sparse == pytest.approx(eps * (uniform - nll).mean(), abs=2e-5)


def _annotated_transformer_loss(logits: np.ndarray, labels: np.ndarray, eps: float, pad_id: int) -> float:
    """The Annotated Transformer's label smoothing, built from its definition (see the comment above)."""
    log_probs = torch.log_softmax(torch.as_tensor(logits, dtype=torch.float64), dim=-1).reshape(-1, VOCAB)
    target = torch.as_tensor(labels).reshape(-1)
    true_dist = torch.full_like(log_probs, eps / (VOCAB - 2))
    true_dist[torch.arange(len(target)), target] = 1 - eps
    true_dist[:, pad_id] = 0
    true_dist[target == pad_id] = 0
    return float(torch.nn.KLDivLoss(reduction="sum")(log_probs, true_dist) / (target != pad_id).sum())


def _fairseq_loss(logits: np.ndarray, labels: np.ndarray, eps: float, pad_id: int) -> float:
    """fairseq's convention, 1 - eps on the label and eps / (V - 1) on every other class, per token, computed by
    ``torch.nn.functional.cross_entropy`` with that target distribution."""
    keep = labels != pad_id
    target = np.full((int(keep.sum()), VOCAB), eps / (VOCAB - 1))
    target[np.arange(len(target)), labels[keep]] = 1 - eps
    return float(F.cross_entropy(torch.as_tensor(logits[keep], dtype=torch.float64), torch.as_tensor(target)))


@pytest.mark.parametrize("pad_id", [0, 3])
@pytest.mark.parametrize("eps", [0.1, 0.25])
def test_other_smoothing_conventions_differ_by_their_closed_form(eps, pad_id):
    logits, labels = _smoothing_inputs(pad_id, seed=1)
    ours, _ = _course_losses(logits, labels, eps, pad_id)
    nll, uniform, pad = _terms(logits, labels, pad_id)
    # V - 1 (fairseq): eps / (V - 1) * mean(u - nll) more, and equal to the V convention at eps' = eps V / (V - 1).
    fairseq = _fairseq_loss(logits, labels, eps, pad_id)
    assert fairseq - ours == pytest.approx(eps / (VOCAB - 1) * (uniform - nll).mean(), abs=2e-6)
    assert fairseq == pytest.approx(_smoothed_reference_loss(logits, labels, eps * VOCAB / (VOCAB - 1), pad_id),
                                    abs=2e-6)
    # V - 2 (Annotated Transformer): the cross-entropy against its target minus the target's entropy.
    annotated = _annotated_transformer_loss(logits, labels, eps, pad_id)
    cross_entropy_v2 = (1 - eps) * nll + eps / (VOCAB - 2) * (VOCAB * uniform - nll - pad)
    entropy = -(1 - eps) * math.log(1 - eps) - eps * math.log(eps / (VOCAB - 2))
    expected_offset = (cross_entropy_v2 - ((1 - eps) * nll + eps * uniform)).mean() - entropy
    assert annotated - ours == pytest.approx(expected_offset, abs=2e-6)
    assert abs(expected_offset) > 0.05  # the conventions do differ, by more than round-off


def test_all_pad_batch_gives_zero_where_the_libraries_give_nan():
    """A batch with no real token: the course returns 0 (its mean divides by max(count, 1)); torch's
    CrossEntropyLoss and Hugging Face's LabelSmoother divide 0 by 0; Keras' sparse loss with ignore_class gives 0."""
    logits, labels = _smoothing_inputs(0)
    labels = np.zeros_like(labels)
    assert _course_losses(logits, labels, 0.1, 0) == (0.0, 0.0)
    assert math.isnan(_smoothed_reference_loss(logits, labels, 0.1, 0))
    assert math.isnan(_float(LabelSmoother(0.1)({"logits": torch.as_tensor(logits)}, torch.full(labels.shape, -100))))
    assert _float(keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)(labels, logits)) == 0


# ---------------------------------------------------------------------------------------------------------------
# 3. Sampling
# ---------------------------------------------------------------------------------------------------------------
#
# Hugging Face's generate() applies its warpers in this order: temperature, top-k, top-p (then min-p, typical, ...),
# the course's order. Conventions: HF's TopKLogitsWarper keeps every token whose logit is >= the k-th largest, so a
# tie at the k-th place keeps more than k tokens; the course keeps exactly k, the lower id winning a tie. HF's
# TopPLogitsWarper removes, from the least likely up, the tokens whose cumulative mass is <= 1 - p: like the course,
# it keeps the token that crosses p (the smallest set of mass >= p); among tokens of equal probability at the edge
# the course keeps the lower ids, HF whichever torch.sort puts last (the higher ids, in this version). HF rejects
# temperature 0 ("set do_sample=False"); the course's temperature 0 is greedy decoding, the arg-max, which is also
# HF's greedy choice.


def _hugging_face_logits(logits, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None):
    """The logits after Hugging Face's warpers (filtered tokens at -inf), float64, in generate()'s order."""
    processors = LogitsProcessorList()
    if temperature != 1.0:
        processors.append(TemperatureLogitsWarper(float(temperature)))
    if top_k is not None:
        processors.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        processors.append(TopPLogitsWarper(float(top_p)))
    return processors(None, torch.as_tensor(np.asarray(logits, dtype=np.float64))).numpy()


def _random_logits(rows: int = 64, vocab: int = 40, seed: int = 0) -> np.ndarray:
    """Rows from nearly flat to sharply peaked (each row scaled by 0.3 to 6): continuous values, no ties."""
    generator = np.random.default_rng(seed)
    return generator.standard_normal((rows, vocab)) * np.geomspace(0.3, 6.0, rows)[:, None]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_filters_equal_hugging_face_warpers_on_random_logits(temperature):
    logits = _random_logits()
    vocab = logits.shape[1]
    for top_k in (None, 1, 2, 7, vocab, vocab + 5):
        for top_p in (None, 1e-9, 0.05, 0.3, 0.9, 0.999999):
            ours = sampling.filter_logits(logits, temperature, top_k, top_p)
            theirs = _hugging_face_logits(logits, temperature, top_k, top_p)
            setting = f"temperature={temperature} top_k={top_k} top_p={top_p}"
            np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(theirs), err_msg=setting)
            np.testing.assert_allclose(sampling.softmax(ours), sampling.softmax(theirs), rtol=0, atol=1e-12,
                                       err_msg=setting)
    # The edges: top_p -> 0 and k = 1 keep the arg-max alone; k >= vocab keeps everything.
    argmax_only = np.eye(vocab, dtype=bool)[logits.argmax(axis=-1)]
    np.testing.assert_array_equal(np.isfinite(sampling.filter_logits(logits, temperature, top_p=1e-9)), argmax_only)
    np.testing.assert_array_equal(np.isfinite(sampling.filter_logits(logits, temperature, top_k=1)), argmax_only)
    assert np.isfinite(sampling.filter_logits(logits, temperature, top_k=vocab + 5)).all()


def test_top_k_ties_hugging_face_keeps_every_token_tied_with_the_kth():
    logits = np.array([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0], [1.0] * 6, [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    for k in range(1, 8):
        ours, theirs = sampling.top_k_mask(logits, k), np.isfinite(_hugging_face_logits(logits, top_k=k))
        kth_largest = -np.sort(-logits, axis=-1)[:, min(k, 6) - 1 : min(k, 6)]
        np.testing.assert_array_equal(theirs, logits >= kth_largest)  # HF: everything at least the k-th value
        assert (ours.sum(axis=-1) == min(k, 6)).all() and (ours <= theirs).all()  # ours: exactly k of those
        stable = np.argsort(-logits, axis=-1, kind="stable")[:, :k]  # ... the lower id first among equals
        np.testing.assert_array_equal(ours, np.any(np.arange(6)[None, :, None] == stable[:, None, :], axis=-1))
        np.testing.assert_array_equal(ours[2], theirs[2])  # no tie, no difference
    assert sampling.top_k_mask(logits, 1)[1].sum() == 1 and np.isfinite(_hugging_face_logits(logits, top_k=1)[1]).all()


def test_top_p_ties_same_count_other_tokens_and_the_exact_edge():
    logits = np.log(np.array([[0.4, 0.2, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25], [0.5, 0.3, 0.15, 0.05]]))
    for p in (0.3, 0.55, 0.7, 0.9):  # no cumulative mass lies within round-off of these
        ours, theirs = sampling.top_p_mask(logits, p), np.isfinite(_hugging_face_logits(logits, top_p=p))
        np.testing.assert_array_equal(ours.sum(axis=-1), theirs.sum(axis=-1))
        probs = sampling.softmax(logits)
        for row in range(3):  # the same probabilities are kept, whichever of the tied tokens carries them
            np.testing.assert_allclose(np.sort(probs[row][ours[row]]), np.sort(probs[row][theirs[row]]), atol=1e-15)
        np.testing.assert_array_equal(ours[2], theirs[2])
    assert sampling.top_p_mask(logits, 0.55)[0].tolist() == [True, True, False, False]  # ours: lower id
    # At p equal to a cumulative mass (0.4 + 0.2 + 0.2 = 0.8) both mean the same set mathematically, but HF compares
    # with 1 - 0.8 = 0.19999999999999996 < 0.2 and keeps one token more; only round-off decides here.
    ours, theirs = sampling.top_p_mask(logits[:1], 0.8), np.isfinite(_hugging_face_logits(logits[:1], top_p=0.8))
    assert 0 <= theirs.sum() - ours.sum() <= 1


def test_top_p_one_keeps_every_token_like_hugging_face():
    logits = np.array([[0.0, -50.0, -50.0], [0.0, -30.0, -30.0]])
    np.testing.assert_array_equal(np.isfinite(_hugging_face_logits(logits, top_p=1.0)), np.ones((2, 3), bool))
    np.testing.assert_array_equal(sampling.top_p_mask(logits, 1.0), np.ones((2, 3), bool))


def test_temperature_zero_is_greedy_which_hugging_face_spells_do_sample_false():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, -1.0, 0.5, 2.0]])
    with pytest.raises(ValueError, match="do_sample=False"):
        TemperatureLogitsWarper(0.0)
    greedy = torch.argmax(torch.as_tensor(logits), dim=-1).numpy()  # HF's greedy step; first of equal maxima
    np.testing.assert_array_equal(sampling.sample_next(logits, temperature=0.0), greedy)
    assert greedy.tolist() == [1, 0]


GPT_CONFIG = dict(d_model=16, num_heads=2, num_layers=1, d_ff=32, max_len=24, dropout=0.0)
GPT_VOCAB = 23


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_generate_draws_from_the_hugging_face_distribution(framework):
    """``gpt.generate`` replayed draw by draw: at each step the model's logits for the sequence so far (from one
    uncached forward pass over the finished sequence: the model is causal) go through Hugging Face's warpers, and
    the token must be the one the same uniform number picks from those probabilities by inverse transform
    (``sample_next``'s rule: the first token whose running sum exceeds u)."""
    prompt, new_tokens = np.random.default_rng(1).integers(0, GPT_VOCAB, size=(3, 4)), 10
    if framework == "keras":
        keras.utils.set_random_seed(2)
        keras_model = ck.GPT(GPT_VOCAB, **GPT_CONFIG)

        def all_logits(ids):  # (batch, length, vocab): the next-token logits after every prefix
            return ops.convert_to_numpy(keras_model(ids.astype("int32"), training=False)).astype(np.float64)

        def generate(**kw):
            return np.asarray(ops.convert_to_numpy(ck.generate(keras_model, prompt, new_tokens, **kw)))
    else:
        torch.manual_seed(0)
        torch_model = ct.GPT(GPT_VOCAB, **GPT_CONFIG).eval()

        def all_logits(ids):
            with torch.no_grad():
                return torch_model(torch.as_tensor(ids)).double().numpy()

        def generate(**kw):
            return ct.generate(torch_model, torch.as_tensor(prompt), new_tokens, **kw).numpy()

    settings = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.8, top_k=10, top_p=0.9),
                dict(temperature=1.3, top_p=0.5), dict(temperature=0.7, top_k=3)]
    for setting in settings:
        tokens = generate(**setting, seed=7)
        logits = all_logits(tokens[:, :-1])
        rng = np.random.default_rng(7)
        for step in range(new_tokens):
            last = logits[:, prompt.shape[1] - 1 + step]
            if setting["temperature"] == 0:
                expected = last.argmax(axis=-1)
            else:
                running = np.cumsum(sampling.softmax(_hugging_face_logits(last, **setting)), axis=-1)
                u = rng.random(len(tokens)) * running[:, -1]
                expected = (running <= u[:, None]).sum(axis=-1)
            np.testing.assert_array_equal(tokens[:, prompt.shape[1] + step], expected, err_msg=f"{setting}, {step}")


# ---------------------------------------------------------------------------------------------------------------
# 4. BLEU
# ---------------------------------------------------------------------------------------------------------------
#
# companion.training.corpus_bleu is sacrebleu.corpus_bleu with its defaults (one reference per sentence, 13a
# tokenization, 'exp' smoothing, case kept, effective order off), on sentences whose whitespace is normalised.
# On the toy task's sentences (lowercase words, no punctuation but the apostrophe of "n'est", which 13a leaves
# alone) 13a tokenization is the whitespace split: tokenize='none' gives the same scores; 'intl' does not (it splits
# "n'est"). The 'exp' smoothing (Chen & Cherry 2014's method 3, as mteval-v13a) counts the k-th order without any
# match as 1 / 2^k matches; 'none' gives 0 then, 'floor' 0.1 matches. An order with no n-gram at all (every
# hypothesis shorter than 4 words) gives 0 with every smoothing unless use_effective_order=True.


def _papineni_bleu(hypotheses: list[str], references: list[str], smooth: str = "exp") -> float:
    """Corpus BLEU from its definition: clipped n-gram matches summed over the corpus for n = 1..4, their
    geometric mean, times the brevity penalty exp(1 - r / c) when c < r (c, r: total hypothesis and reference
    lengths); 'exp' or 'none' smoothing as described above."""
    matches, totals, c, r = [0] * 4, [0] * 4, 0, 0
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        hyp, ref = hypothesis.split(), reference.split()
        c, r = c + len(hyp), r + len(ref)
        for n in range(1, 5):
            hyp_grams = Counter(tuple(hyp[i : i + n]) for i in range(len(hyp) - n + 1))
            ref_grams = Counter(tuple(ref[i : i + n]) for i in range(len(ref) - n + 1))
            matches[n - 1] += sum(min(count, ref_grams[gram]) for gram, count in hyp_grams.items())
            totals[n - 1] += max(len(hyp) - n + 1, 0)
    if 0 in totals:
        return 0.0
    log_precision, halvings = 0.0, 1
    for match, total in zip(matches, totals, strict=True):
        if match == 0:
            if smooth == "none":
                return 0.0
            halvings *= 2
            match = 1 / halvings
        log_precision += math.log(match / total) / 4
    return 100 * (1.0 if c >= r else math.exp(1 - r / c)) * math.exp(log_precision)


def _french_forms() -> list[tuple[str, ...]]:
    """The toy grammar's French words grouped by lemma (the forms of one noun, adjective, determiner or verb)."""
    groups = [row[2:4] for row in data.NOUNS] + [row[1:] for row in data.ADJECTIVES_BEFORE + data.ADJECTIVES_AFTER]
    groups += [row[2:] + ("de",) * (row[4] == "des") for row in data.DETERMINERS]
    groups += [row[2:] for row in data.INTRANSITIVE_VERBS + data.TRANSITIVE_VERBS] + [("est", "sont", "n'est")]
    return groups


def _corrupted(reference: str, rng: random.Random) -> str:
    """A plausible wrong translation: one or two of drop, swap, another form, another word, cut, extend."""
    words = reference.split()
    groups = _french_forms()
    vocabulary = [w for group in groups for w in group] + ["ne", "pas", "vingt", "et", "un", "trois"]
    for _ in range(rng.choice((1, 1, 2))):
        edit = rng.choice(("keep", "drop", "swap", "form", "word", "cut", "extend"))
        i = rng.randrange(max(len(words), 1))
        if edit == "drop" and words:
            del words[i]
        elif edit == "swap" and len(words) > 1:
            i = min(i, len(words) - 2)
            words[i], words[i + 1] = words[i + 1], words[i]
        elif edit == "form" and words:
            forms = [group for group in groups if words[i] in group]
            words[i] = rng.choice(forms[0]) if forms else words[i]
        elif edit == "word" and words:
            words[i] = rng.choice(vocabulary)
        elif edit == "cut":
            words = words[: rng.randrange(len(words) + 1)]
        elif edit == "extend":
            words += [rng.choice(vocabulary) for _ in range(rng.randint(1, 3))]
    return " ".join(words)


@functools.lru_cache(maxsize=1)
def _bleu_corpus() -> tuple[list[str], list[str]]:
    references = [target for _, target in data.toy_translation_pairs(60, seed=11, numbers=data.NUMBERS)]
    references += ["le chien n'est pas content", "cette maison n'est pas rouge"]
    rng = random.Random(5)
    return [_corrupted(reference, rng) for reference in references], references


def test_corpus_bleu_equals_sacrebleu_on_random_toy_translations():
    hypotheses, references = _bleu_corpus()
    assert len(references) >= 50 and any(len(h.split()) < 4 for h in hypotheses)
    rng = random.Random(6)
    corpora = [(hypotheses, references)]  # the whole corpus, then 40 small ones (down to single sentences)
    for size in [1] * 15 + [2, 3, 5, 8, 13] * 5:
        rows = rng.sample(range(len(references)), size)
        corpora.append(([hypotheses[i] for i in rows], [references[i] for i in rows]))
    scores = []
    for hyps, refs in corpora:
        ours = training.corpus_bleu(hyps, refs)
        assert ours == sacrebleu.corpus_bleu(hyps, [refs], tokenize="13a", smooth_method="exp").score
        assert ours == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score, abs=1e-9)
        assert ours == pytest.approx(_papineni_bleu(hyps, refs), abs=1e-9)
        assert training.corpus_bleu([h.split() for h in hyps], [r.split() for r in refs]) == ours  # token lists
        scores.append(ours)
    assert 5 < scores[0] < 95 and min(scores) == 0.0 and max(scores) == pytest.approx(100.0) and len(set(scores)) > 20
    # The tokenization does matter where a word holds an apostrophe: 'intl' splits "n'est".
    negated = [i for i, r in enumerate(references) if "n'est" in r and hypotheses[i] != r]
    assert negated, "the corpus needs a wrong translation of a sentence with n'est"
    hyps, refs = [hypotheses[i] for i in negated], [references[i] for i in negated]
    assert sacrebleu.corpus_bleu(hyps, [refs], tokenize="intl").score != training.corpus_bleu(hyps, refs)


def test_bleu_edge_cases_in_closed_form():
    reference = "le grand chien noir ne dort pas"  # 7 words
    # A prefix of the reference: every precision is 1, so BLEU is the brevity penalty alone, exp(1 - r / c).
    for length in (4, 5, 6):
        prefix = " ".join(reference.split()[:length])
        assert training.corpus_bleu([prefix], [reference]) == pytest.approx(100 * math.exp(1 - 7 / length))
    # An empty hypothesis scores 0 alone; beside a perfect one it adds only to r: 100 exp(1 - (7 + 3) / 7).
    assert training.corpus_bleu([""], ["le chien dort"]) == 0.0
    assert training.corpus_bleu(["", reference], ["le chien dort", reference]) == pytest.approx(
        100 * math.exp(1 - 10 / 7))
    # Zero 4-gram matches: 6/7 words, 4/6 bigrams, 2/5 trigrams, 0/4 four-grams. 'exp' counts 1/2 match.
    hypothesis = "le grand chien blanc ne dort pas"
    precisions = (6 / 7, 4 / 6, 2 / 5, 0.5 / 4)
    assert training.corpus_bleu([hypothesis], [reference]) == pytest.approx(100 * math.prod(precisions) ** 0.25)
    assert sacrebleu.corpus_bleu([hypothesis], [[reference]], smooth_method="none").score == 0.0
    floor = (*precisions[:3], 0.1 / 4)
    assert sacrebleu.corpus_bleu([hypothesis], [[reference]], smooth_method="floor").score == pytest.approx(
        100 * math.prod(floor) ** 0.25)
    # Longer than the reference: no brevity penalty, and the extra words lower every precision.
    longer = reference + " la souris"  # 9 words, 8 bigrams, 7 trigrams, 6 four-grams; 7, 6, 5, 4 of them match
    assert training.corpus_bleu([longer], [reference]) == pytest.approx(
        100 * (7 / 9 * 6 / 8 * 5 / 7 * 4 / 6) ** 0.25)
    # Sentences shorter than 4 words have no 4-gram: 0 however good, unless the order is cut to what exists.
    short = ["le chien dort", "la souris mange"]
    assert training.corpus_bleu(short, short) == 0.0
    assert sacrebleu.corpus_bleu(short, [short], use_effective_order=True).score == pytest.approx(100.0)


# ---------------------------------------------------------------------------------------------------------------
# 5. The error classifier against hand labels
# ---------------------------------------------------------------------------------------------------------------
#
# Each reference is a sentence of the toy grammar (companion/data.py: determiner or number, adjectives of size and
# age before the noun, colours and moods after it, agreement in gender and number, ne ... pas, des -> de before an
# adjective). The labels are a reader's, following the kinds' definitions in companion/errors.py: an output that
# stops early is "early end" even when its last words carry a slip of form or of number word; a longer output that
# repeats the whole sentence is "no end"; then number, word order, agreement, other.

LABELLED = [
    # early end: a truncation, with or without a slip in a form or a number word on the way
    ("quatre vingt onze petits livres tristes dorment", "quatre vingt un petit", "early end"),
    ("le chien noir ne dort pas", "le chien noir", "early end"),
    ("le chien ne dort pas", "le chien ne dort", "early end"),  # stopped before "pas"
    ("les grandes maisons blanches ne chantent pas", "les grandes maisons blanche", "early end"),
    ("soixante dix huit chats noirs voient la fille", "soixante dix sept chats", "early end"),
    ("vingt et une maisons rouges sautent", "vingt et un", "early end"),
    ("quatre vingt dix neuf souris vertes courent", "quatre vingt dix", "early end"),
    ("les petites filles contentes chantent", "le petit fille", "early end"),
    ("la souris mange", "", "early end"),  # </s> first
    ("un chien voit deux chats", "deux chien", "early end"),  # un is also the number one
    # no end: the whole sentence and more, or the length limit reached
    ("le chien dort", "le chien dort dort", "no end"),
    ("les chats noirs dorment", "les chats noirs dorment les chats noirs", "no end"),
    ("le chien dort", "le chat court court court court", "no end", 6),
    # number
    ("vingt trois chats dorment", "vingt quatre chats dorment", "number"),
    ("quatre vingt onze chats dorment", "quatre vingt et un chats dorment", "number"),  # 91 is not 80 + "et un"
    ("vingt et une maisons dorment", "vingt et un maisons dorment", "number"),  # une agrees with maisons
    ("soixante dix huit chiens voient la souris", "soixante huit chiens voient la souris", "number"),
    ("trente chats dorment", "les chats dorment", "number"),
    ("deux chiens voient trois chats", "trois chiens voient deux chats", "number"),
    ("vingt chats dorment", "vingt deux", "number"),  # a wrong number, then the end
    # word order
    ("le chien voit la fille", "la fille voit le chien", "word order"),
    ("le grand chien noir dort", "le noir chien grand dort", "word order"),
    ("le chien ne dort pas", "le chien ne pas dort", "word order"),
    # agreement
    ("la voiture noire dort", "la voiture noir dort", "agreement"),
    ("les chiens dorment", "les chiens dort", "agreement"),
    ("de grandes voitures blanches courent", "des grandes voitures blanches courent", "agreement"),
    ("la fille est contente", "la fille est content", "agreement"),
    ("les filles sont vieilles", "les filles est vieilles", "agreement"),
    ("le cheval dort", "le chevaux dort", "agreement"),
    ("cette maison n'est pas rouge", "ce maison n'est pas rouge", "agreement"),
    # other
    ("le chien dort", "le chat dort", "other"),
    ("le chien ne dort pas", "le chien dort pas", "other"),  # ne dropped
    ("la fille voit le chien", "la fille regarde le chien", "other"),
    ("mon livre est rouge", "mon livre est vert", "other"),
    ("le grand chien noir dort", "le chien noir dort", "other"),  # a word left out, the end reached
    ("le chien voit la fille", "le chat voit", "other"),  # another noun is not a slip of form
    # correct
    ("les vieilles tables sont vertes", "les vieilles tables sont vertes", None),
]


def _french_vocabulary() -> set[str]:
    numbers = {w for n in data.NUMBERS for gender in "mf" for w in data.number_words(n, "fr", gender)}
    return {w for group in _french_forms() for w in group} | numbers | {"ne", "pas"}


@pytest.mark.parametrize("case", LABELLED, ids=lambda case: f"{case[2]}: {case[1] or '(empty)'}")
def test_error_classifier_agrees_with_hand_labels(case):
    reference, hypothesis, kind = case[:3]
    max_len = case[3] if len(case) > 3 else None
    assert set(reference.split()) <= _french_vocabulary(), "not a sentence of the toy grammar"
    assert errors.classify_error(reference, hypothesis, max_len) == kind
    assert errors.classify_error(reference.split(), hypothesis.split(), max_len) == kind
    assert kind is None or kind in errors.KINDS


def test_the_hand_labels_cover_every_kind():
    kinds = Counter(case[2] for case in LABELLED)
    assert len(LABELLED) >= 25 and all(kinds[kind] >= 3 for kind in errors.KINDS)


def test_an_output_that_runs_on_after_a_slip_has_no_end():
    assert errors.classify_error("la voiture noire dort", "la voiture noir dort dort") == "no end"
