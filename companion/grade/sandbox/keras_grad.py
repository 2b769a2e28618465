"""Gradients of a Keras answer with the active backend's own autodiff (TensorFlow, torch or JAX).

Runs where the answer runs: in the student's process under the grader (:mod:`.child`, request ``grad`` with
``framework: keras``) and in the notebook for the in-notebook check (:mod:`companion.checks.tracks`). It imports
nothing from ``companion``: this package is all of the course the sandbox holds.
"""

from __future__ import annotations

from typing import Any

NOT_TRACED = ("the output does not depend on the inputs through the backend's autodiff (keras.ops.stop_gradient, "
              "or computed outside keras.ops, e.g. through NumPy)")


def _floating(value: Any) -> bool:
    from keras import ops

    try:
        return ops.is_tensor(value) and "float" in str(value.dtype)
    except Exception:  # an object that only looks like a tensor
        return False


def keras_gradients(fn: Any, args: tuple, upstream: Any = None, index: int | None = None
                    ) -> tuple[Any, list, str]:
    """Call ``fn`` on ``args`` and back-propagate ``upstream`` (ones when None) from output ``index``.

    Returns (the result, the gradient of each argument, None for those it does not reach, why there are none).
    """
    import keras
    from keras import ops

    args = list(args)
    watched = [i for i, a in enumerate(args) if _floating(a)]
    backend = keras.backend.backend()

    def pick(result: Any) -> Any:
        return result if index is None else result[index]

    def seed(output: Any) -> Any:
        return ops.ones_like(output) if upstream is None else ops.cast(ops.convert_to_tensor(upstream), output.dtype)

    if backend == "tensorflow":
        import tensorflow as tf

        args = [tf.identity(a) if i in watched else a for i, a in enumerate(args)]
        with tf.GradientTape() as tape:
            for i in watched:
                tape.watch(args[i])
            result = fn(*args)
        output = pick(result)
        if not tf.is_tensor(output):
            return result, [None] * len(args), f"the output is a {type(output).__name__}, not a tensor"
        found = tape.gradient(output, [args[i] for i in watched], output_gradients=seed(output))
        # A gather (ops.take) gives IndexedSlices: make them the dense gradient they stand for.
        found = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in found]
    elif backend == "torch":
        import torch

        args = [a.detach().clone().requires_grad_(True) if i in watched else a for i, a in enumerate(args)]
        result = fn(*args)
        output = pick(result)
        if not isinstance(output, torch.Tensor):
            return result, [None] * len(args), f"the output is a {type(output).__name__}, not a tensor"
        if not output.requires_grad:
            return result, [None] * len(args), NOT_TRACED
        output.backward(seed(output))
        found = [args[i].grad for i in watched]
    elif backend == "jax":
        import jax

        def partial(*floats: Any) -> Any:
            full = list(args)
            for i, value in zip(watched, floats, strict=True):
                full[i] = value
            return pick(fn(*full))

        result = fn(*args)
        output = pick(result)
        if not hasattr(output, "dtype") or not hasattr(output, "shape"):
            return result, [None] * len(args), f"the output is a {type(output).__name__}, not a tensor"
        _, backward = jax.vjp(partial, *(args[i] for i in watched))
        found = [g if bool(ops.any(ops.not_equal(g, 0))) else None for g in backward(seed(output))]
    else:  # pragma: no cover - a backend Keras may add
        raise ValueError(f"gradients are not supported on the {backend} backend")
    grads: list = [None] * len(args)
    for i, grad in zip(watched, found, strict=True):
        grads[i] = grad
    return result, grads, "" if any(g is not None for g in grads) else NOT_TRACED
