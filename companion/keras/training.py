"""Training for the Keras Transformer: label-smoothed loss, the paper's optimizer and schedule, a
trainer with a loss history. Decoding (greedy, beam search, ``translate``) is in ``.decoding``.

Same names and arguments as ``companion.torch.training``. The model-facing code uses ``keras.ops`` only; the
update itself goes through Keras' own ``train_on_batch``, so every backend (TensorFlow, PyTorch, JAX) computes
gradients its own way. On TensorFlow the step is traced into a graph the first time it runs (tens of seconds on
a small CPU, then fast); with a GPU it is also compiled with XLA.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from ..data import iterate_batches
from ..training import EpochLoop, shift_targets, warmup_learning_rate

# Decoding lives in .decoding; its names stay importable from here, where the course first used them.
from .decoding import (  # noqa: F401
    NextTokenLogits,
    batch_beam_search,
    beam_search,
    greedy_decode,
    next_token_logits,
    translate,
)
from .device import default_device

ADAM_BETAS = (0.9, 0.98)  # section 5.3 of the paper
ADAM_EPSILON = 1e-9


def label_smoothed_cross_entropy(logits, labels, smoothing: float = 0.1, pad_id: int = 0):
    """Cross-entropy against a smoothed target, averaged over the non-PAD positions only.

    The target puts ``1 - smoothing`` on the right token and spreads ``smoothing`` evenly over the whole
    vocabulary (the convention of ``keras.losses.CategoricalCrossentropy(label_smoothing=...)`` and of torch):
    ``loss = (1 - smoothing) * (-log p[label]) + smoothing * mean_over_vocab(-log p)``.

    Args:
        logits: ``(batch, tgt_len, vocab)``, before any softmax.
        labels: ``(batch, tgt_len)`` integer ids; positions holding ``pad_id`` add nothing.
        smoothing: in ``[0, 1)``; 0 gives the plain cross-entropy.

    Returns:
        a scalar tensor (0 when every label is PAD).
    """
    if len(logits.shape) != 3 or len(labels.shape) != 2:
        raise ValueError(
            f"logits must be (batch, tgt_len, vocab) and labels (batch, tgt_len); got {tuple(logits.shape)} and "
            f"{tuple(labels.shape)}"
        )
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must lie in [0, 1); got {smoothing}")
    labels = ops.cast(labels, "int32")
    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # (batch, tgt_len, vocab)
    nll = -ops.squeeze(ops.take_along_axis(log_probs, ops.expand_dims(labels, -1), axis=-1), -1)  # (batch, tgt_len)
    uniform = -ops.mean(log_probs, axis=-1)  # (batch, tgt_len)
    per_token = (1.0 - smoothing) * nll + smoothing * uniform
    keep = ops.cast(ops.not_equal(labels, pad_id), "float32")
    return ops.sum(per_token * keep) / ops.maximum(ops.sum(keep), 1.0)


@keras.saving.register_keras_serializable(package="companion")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """:func:`label_smoothed_cross_entropy` as a Keras loss: ``loss(labels, logits)``, already averaged."""

    def __init__(self, smoothing: float = 0.1, pad_id: int = 0, name: str = "label_smoothed_cross_entropy", **kw):
        # "sum" of the one scalar that call returns: Keras must not divide again by the number of positions.
        kw.pop("reduction", None)
        super().__init__(name=name, reduction="sum", **kw)
        self.smoothing, self.pad_id = smoothing, pad_id

    def call(self, y_true, y_pred):
        return label_smoothed_cross_entropy(y_pred, y_true, self.smoothing, self.pad_id)

    def get_config(self):
        return {**super().get_config(), "smoothing": self.smoothing, "pad_id": self.pad_id}


@keras.saving.register_keras_serializable(package="companion")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """``companion.training.warmup_learning_rate`` for a Keras optimizer.

    Keras calls the schedule with the number of updates done so far (0 before the first), so the rate of update
    ``n`` (counting from 1) is ``schedule(n - 1)``, as with torch's ``LambdaLR``.
    """

    def __init__(self, d_model: int, warmup_steps: int = 4000, factor: float = 1.0):
        if d_model < 1 or warmup_steps < 1:
            raise ValueError(f"d_model and warmup_steps must be positive; got {d_model} and {warmup_steps}")
        self.d_model, self.warmup_steps, self.factor = d_model, warmup_steps, factor

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        rate = ops.minimum(ops.rsqrt(step), step * float(self.warmup_steps) ** -1.5)
        return self.factor * float(self.d_model) ** -0.5 * rate

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "factor": self.factor}


@keras.saving.register_keras_serializable(package="companion")
class PaperAdam(keras.optimizers.Adam):
    """Adam exactly as in Kingma & Ba's Algorithm 1 (and ``torch.optim.Adam``), for dense and sparse gradients.

    ``keras.optimizers.Adam`` differs in two details that matter when comparing with torch step by step:

    * it adds ``epsilon`` to ``sqrt(v)`` *before* the bias correction (the "epsilon hat" of the paper's
      section 2), so in the first steps its effective epsilon is several times larger: with ``epsilon=1e-9``
      that changes the update of any weight whose gradient is around 1e-8;
    * on TensorFlow the gradient of an embedding lookup is a ``tf.IndexedSlices`` with one row per
      *occurrence* of a token, and Keras squares those rows one by one: a token seen four times in a batch gets
      ``4 * g**2`` in its second moment instead of ``(4 * g)**2``, hence a larger step.

    Here sparse gradients are first added to a dense zero tensor (which sums repeated rows), and the update is
    ``w -= lr / (1 - beta_1**t) * m / (sqrt(v / (1 - beta_2**t)) + epsilon)``, written with ``keras.ops``.
    """

    def apply(self, grads, trainable_variables=None):
        variables = trainable_variables if trainable_variables is not None else self._trainable_variables
        grads = [
            ops.add(ops.zeros(variable.shape, variable.dtype), grad) if hasattr(grad, "indices") else grad
            for grad, variable in zip(grads, variables, strict=True)
        ]
        return super().apply(grads, trainable_variables)

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        step = ops.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        self.assign(m, ops.add(ops.multiply(m, self.beta_1), ops.multiply(gradient, 1.0 - self.beta_1)))
        self.assign(v, ops.add(ops.multiply(v, self.beta_2), ops.multiply(ops.square(gradient), 1.0 - self.beta_2)))
        correction1 = 1.0 - ops.power(ops.cast(self.beta_1, dtype), step)
        correction2 = 1.0 - ops.power(ops.cast(self.beta_2, dtype), step)
        denominator = ops.add(ops.divide(ops.sqrt(v), ops.sqrt(correction2)), self.epsilon)
        self.assign_sub(variable, ops.multiply(ops.divide(lr, correction1), ops.divide(m, denominator)))


def make_optimizer(model, d_model: int, warmup_steps: int = 4000, factor: float = 1.0) -> keras.optimizers.Adam:
    """Adam with betas (0.9, 0.98) and epsilon 1e-9, its learning rate given by :class:`WarmupSchedule`.

    ``model`` is unused (Keras optimizers find their variables at the first update); it is there so the call
    reads like the torch one. See :class:`PaperAdam` for why this is not the plain ``keras.optimizers.Adam``.
    """
    schedule = WarmupSchedule(d_model, warmup_steps, factor)
    return PaperAdam(schedule, beta_1=ADAM_BETAS[0], beta_2=ADAM_BETAS[1], epsilon=ADAM_EPSILON)


class TeacherForcing(keras.Model):
    """Wraps a Transformer so that Keras' ``fit`` / ``train_on_batch`` can drive it.

    Keras passes a model one input ``x``; here ``x = (src_ids, decoder_input)`` and the output is the logits
    ``(batch, tgt_len - 1, vocab)`` to compare with the labels. The wrapper has no weights of its own.
    """

    def __init__(self, transformer: keras.Model, **kwargs):
        super().__init__(**kwargs)
        self.transformer = transformer

    def call(self, inputs, training=None):
        src_ids, decoder_input = inputs
        return self.transformer(src_ids, decoder_input, training=training)


class Trainer(EpochLoop):
    """Teacher-forcing training of a :class:`companion.keras.Transformer` with a per-step loss history.

    Args:
        model: the Transformer. It is built on the first batch if it is not built yet.
        warmup_steps, factor: the learning-rate schedule (see ``companion.training.warmup_learning_rate``).
        smoothing: label smoothing of the loss (0.1 in the paper).
        device: a Keras device string; default ``default_device()``.
        jit_compile: compile the step with XLA; default: on the TensorFlow backend with a GPU. On a CPU, XLA's
            compile time (measured: about 10 s more than tracing alone on 2 cores) buys nothing for a model this
            small: the steps themselves took the same time with and without it.

    ``history`` holds lists: ``step``, ``loss``, ``lr`` (one entry per update) and ``val_step``, ``val_loss``.
    ``fit`` (the epoch loop) is :class:`companion.training.EpochLoop`'s, the same for the PyTorch trainer.
    """

    progress_label = "keras"  # the progress bar's name

    def __init__(
        self,
        model: keras.Model,
        warmup_steps: int = 4000,
        factor: float = 1.0,
        smoothing: float = 0.1,
        device: str | None = None,
        jit_compile: bool | None = None,
    ):
        self.device = device or default_device()
        self.model = model
        self.d_model, self.pad_id, self.smoothing = model.d_model, model.pad_id, smoothing
        self.schedule = WarmupSchedule(self.d_model, warmup_steps, factor)
        # The rate of update n, for the history, without a tensor op per step (tests check it equals the schedule).
        self._rate = lambda n: warmup_learning_rate(n, self.d_model, warmup_steps, factor)
        self.optimizer = make_optimizer(model, self.d_model, warmup_steps, factor)
        self.wrapper = TeacherForcing(model)
        if jit_compile is None:
            jit_compile = keras.backend.backend() == "tensorflow" and self.device.startswith("gpu")
        self.wrapper.compile(
            optimizer=self.optimizer,
            loss=LabelSmoothedCrossEntropy(smoothing, self.pad_id),
            jit_compile=jit_compile,
        )
        self.step = 0
        self.history: dict[str, list[float]] = {"step": [], "loss": [], "lr": [], "val_step": [], "val_loss": []}

    def train_step(self, src_ids: np.ndarray, tgt_ids: np.ndarray) -> float:
        """One update on a batch: src ``(batch, src_len)``, tgt ``(batch, tgt_len)`` = ``<s> ... </s>`` + PAD.

        Returns the batch loss before the update.
        """
        src_ids, tgt_ids = np.asarray(src_ids, dtype="int32"), np.asarray(tgt_ids, dtype="int32")
        decoder_input, labels = shift_targets(tgt_ids)
        if not self.model.built:
            self.model(src_ids[:1], decoder_input[:1])
        if not self.optimizer.built:
            # Adam's moment variables, made here rather than inside the traced step: TensorFlow traces a step
            # that creates variables twice, and the trace is most of the first step's time.
            self.optimizer.build(self.wrapper.trainable_variables)
        lr = self._rate(self.step + 1)
        with keras.device(self.device):
            loss = self.wrapper.train_on_batch((src_ids, decoder_input), labels)
        self.step += 1
        value = float(loss)
        for key, item in (("step", self.step), ("loss", value), ("lr", lr)):
            self.history[key].append(item)
        return value

    def evaluate(self, src_ids: np.ndarray, tgt_ids: np.ndarray, batch_size: int = 500) -> float:
        """The same label-smoothed loss on held-out pairs (no update, no dropout), averaged over tokens."""
        total, count = 0.0, 0
        with keras.device(self.device):
            for src, tgt in iterate_batches(src_ids, tgt_ids, batch_size, shuffle=False):
                decoder_input, labels = shift_targets(tgt.astype("int32"))
                logits = self.model(src.astype("int32"), decoder_input, training=False)
                loss = label_smoothed_cross_entropy(logits, labels, self.smoothing, self.pad_id)
                tokens = int((labels != self.pad_id).sum())
                total += float(ops.convert_to_numpy(loss)) * tokens
                count += tokens
        return total / max(count, 1)
