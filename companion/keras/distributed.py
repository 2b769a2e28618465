"""Data-parallel training in Keras: ``tf.distribute.MirroredStrategy`` over two logical CPU devices.

The twin of ``companion.torch.distributed``, with the same names. It needs the TensorFlow backend (Keras 3's
own ``keras.distribution`` API is documented for JAX only, and with the torch backend one uses
``torch.distributed``). This is the one module of ``companion.keras`` that calls ``tf.*``.

``MirroredStrategy`` keeps one copy of every variable per device, splits each global batch between the copies,
and sums their gradients with an all-reduce before every update, after Keras has divided each replica's loss by
the number of replicas: the result equals one device training on the whole batch. A CPU is one device for
TensorFlow; :func:`split_cpu` cuts it into several *logical* devices, which must happen before TensorFlow starts
its runtime (before the first tensor is made). In a notebook that has already used TensorFlow, run this module
in a fresh process: ``python -m companion.keras.distributed`` trains a small model both ways and prints the
largest difference between the weights.

Keras creates a model's variables on the devices of the strategy that is active when the model is built, so the
functions here take a *builder*, a function that returns a new model, rather than a model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import keras
import numpy as np

from ..corpus import global_batches

__all__ = ["global_batches", "max_parameter_difference", "split_cpu", "train_data_parallel", "train_single_process"]

OPTIMIZERS = {
    "sgd": lambda lr: keras.optimizers.SGD(lr, momentum=0.9),
    "adamw": lambda lr: keras.optimizers.AdamW(lr),
}


def split_cpu(num_devices: int = 2) -> list[str]:
    """Cut the CPU into ``num_devices`` logical devices; returns their names (``"/cpu:0"``, ...).

    Raises RuntimeError when TensorFlow has already started (too late to change its devices).
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
    except RuntimeError as error:
        if len(tf.config.list_logical_devices("CPU")) != num_devices:
            raise RuntimeError(
                "TensorFlow has already started, so its CPU can no longer be split into logical devices: "
                "run `python -m companion.keras.distributed` (or call split_cpu first thing in a fresh process)"
            ) from error
    return [f"/cpu:{i}" for i in range(num_devices)]


def _fit(make_model, inputs, targets, batches, lr, optimizer):
    model = make_model()
    model.compile(
        optimizer=OPTIMIZERS[optimizer](lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    order = np.concatenate(batches)  # the global batches one after the other; fit cuts them again, in order
    history = model.fit(inputs[order], targets[order], batch_size=len(batches[0]), epochs=1, shuffle=False, verbose=0)
    return model, history


def _check(inputs, targets, batch_size, world_size, optimizer) -> None:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}; got {optimizer!r}")
    if inputs.ndim != 2 or inputs.shape != targets.shape:
        raise ValueError(
            f"inputs and targets must both have shape (num_examples, seq_len); got {inputs.shape} and {targets.shape}"
        )
    if world_size < 1 or batch_size % world_size:
        raise ValueError(f"batch_size ({batch_size}) must be a multiple of world_size ({world_size})")


def train_single_process(
    make_model: Callable[[], keras.Model], inputs: np.ndarray, targets: np.ndarray, steps: int, batch_size: int,
    lr: float = 0.1, optimizer: str = "sgd", seed: int = 0,
) -> tuple[keras.Model, list[float]]:
    """Build a model with ``make_model()`` and train it for ``steps`` steps on one device.

    Args:
        make_model: returns a new, seeded model mapping ids ``(batch, seq_len)`` to logits
            ``(batch, seq_len, vocab_size)``.
        inputs, targets: int arrays of shape ``(num_examples, seq_len)``.

    Returns:
        the trained model and the mean loss of the run (Keras reports one number per epoch).
    """
    _check(inputs, targets, batch_size, 1, optimizer)
    model, history = _fit(make_model, inputs, targets, global_batches(len(inputs), batch_size, steps, seed), lr,
                          optimizer)
    return model, history.history["loss"]


def train_data_parallel(
    make_model: Callable[[], keras.Model], inputs: np.ndarray, targets: np.ndarray, steps: int, batch_size: int,
    lr: float = 0.1, optimizer: str = "sgd", seed: int = 0, world_size: int = 2,
) -> tuple[keras.Model, list[float]]:
    """The same training as :func:`train_single_process`, mirrored over ``world_size`` logical CPU devices.

    Call :func:`split_cpu` first, before TensorFlow has started.
    """
    import tensorflow as tf

    _check(inputs, targets, batch_size, world_size, optimizer)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:world_size]
    if len(devices) < world_size:
        raise RuntimeError(f"{world_size} logical CPU devices are needed; got {len(devices)}: call split_cpu first")
    strategy = tf.distribute.MirroredStrategy(devices)
    batches = global_batches(len(inputs), batch_size, steps, seed)
    with strategy.scope():
        model, history = _fit(make_model, inputs, targets, batches, lr, optimizer)
    return model, history.history["loss"]


def max_parameter_difference(a: keras.Model, b: keras.Model) -> float:
    """The largest absolute difference between corresponding weights of two models of the same shape."""
    return max(float(np.abs(p - q).max()) for p, q in zip(a.get_weights(), b.get_weights(), strict=True))


def tiny_language_model(vocab_size: int = 40, seq_len: int = 8) -> keras.Model:
    """A small model for the demonstration, seeded with ``COURSE_SEED``: embedding, self-attention, output layer."""
    from companion.seed import course_seed

    keras.utils.set_random_seed(course_seed())
    ids = keras.Input((seq_len,), dtype="int32")
    x = keras.layers.Embedding(vocab_size, 16)(ids)
    x = x + keras.layers.MultiHeadAttention(2, 8)(x, x)
    return keras.Model(ids, keras.layers.Dense(vocab_size)(x))


def main() -> None:
    """Train :func:`tiny_language_model` on one device and on two mirrored ones; print both as JSON."""
    from companion.seed import course_seed

    devices = split_cpu(2)
    seed = course_seed()
    ids = np.random.default_rng(seed).integers(0, 40, size=(48, 9))
    inputs, targets = ids[:, :-1], ids[:, 1:]
    untrained = tiny_language_model()
    single, single_loss = train_single_process(tiny_language_model, inputs, targets, steps=6, batch_size=8, seed=seed)
    mirrored, mirrored_loss = train_data_parallel(tiny_language_model, inputs, targets, steps=6, batch_size=8,
                                                  seed=seed)
    print(json.dumps({
        "devices": devices,
        "replicas": 2,
        "moved": max_parameter_difference(single, untrained),
        "difference": max_parameter_difference(single, mirrored),
        "single_loss": single_loss[0],
        "mirrored_loss": mirrored_loss[0],
    }))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
