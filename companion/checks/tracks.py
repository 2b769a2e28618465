"""Helpers that the checkers of every chapter share: inputs for each track, tolerances, reading results, and the
one-call shortcuts that exercises forbid.

A checker receives the student's object, or in the grader a proxy of it (see :mod:`companion.checks`); these
helpers build the inputs of a track (NumPy arrays, torch tensors, Keras tensors) and read what came back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from companion.checks import CheckFailed, defer, proxy_hooks, to_numpy


def to_torch(*arrays: np.ndarray) -> tuple:
    """NumPy arrays -> torch tensors (bool stays bool, floats keep their precision)."""
    import torch

    return tuple(torch.as_tensor(np.ascontiguousarray(a)) for a in arrays)


def to_keras(*arrays: np.ndarray) -> tuple:
    """NumPy arrays -> tensors of the active Keras backend."""
    from keras import ops

    return tuple(ops.convert_to_tensor(a) for a in arrays)


def converter(track: str) -> Callable[..., tuple]:
    """The input converter of a track: ``to_torch``, ``to_keras`` or the identity for NumPy."""
    return {"torch": to_torch, "keras": to_keras, "numpy": lambda *a: a}[track]


def tolerance(track: str) -> dict[str, float]:
    """atol/rtol for comparing a float32 answer with the float64 oracle.

    Keras computes on TensorFlow's default device: on a recent NVIDIA GPU its float32 matrix products use TF32
    (about 3 significant digits), so the Keras track gets a looser tolerance; every mistake the checks name changes
    the result by far more. The torch checks build their tensors on the CPU.
    """
    return {"atol": 2e-3, "rtol": 2e-3} if track == "keras" else {"atol": 1e-5, "rtol": 1e-4}


def output_pair(
    result: Any, name: str, first: str = "output", second: str = "weights"
) -> tuple[np.ndarray, np.ndarray]:
    """Read the ``(first, second)`` pair a student's function returns, as NumPy arrays."""
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise CheckFailed(f"{name} should return a pair ({first}, {second}); got {type(result).__name__}")
    return to_numpy(result[0]), to_numpy(result[1])


def expect_type(result: Any, track: str, what: str, dtype: str | None = None) -> None:
    """The result is of the track's type (a NumPy array, a torch tensor, a Keras tensor) and, if given, dtype kind.

    ``dtype`` is ``"float"``, ``"int"`` or ``"bool"``. The failure is deferred (:func:`companion.checks.defer`):
    it is reported once every value has been compared, so that a known mistake is named first.
    """
    try:
        _expect_type(result, track, what, dtype)
    except CheckFailed as failure:
        defer(failure)


def _expect_type(result: Any, track: str, what: str, dtype: str | None) -> None:
    module = type(result).__module__ or ""
    if track == "torch":
        import torch

        ok = isinstance(result, torch.Tensor)
        expected = "a torch.Tensor"
    elif track == "keras":
        ok = module.startswith(("tensorflow", "keras", "jax", "torch")) and hasattr(result, "shape") and \
            not isinstance(result, np.ndarray)
        expected = "a Keras tensor (keras.ops)"
    else:
        ok = isinstance(result, np.ndarray)
        expected = "a NumPy array"
    if not ok:
        raise CheckFailed(f"{what} should be {expected}; got {type(result).__name__}. Likely: {_LEFT_TRACK[track]}")
    if dtype is not None:
        kind = to_numpy(result).dtype.kind
        if {"float": "f", "int": "iu", "bool": "b"}[dtype].find(kind) < 0:
            raise CheckFailed(f"{what} should have a {dtype} dtype; got {to_numpy(result).dtype}. Likely: the result "
                              f"took the dtype of another value (an integer constant, an input); make it {dtype}")


#: Why a result is not of its track's type, for the messages of :func:`expect_type`.
_LEFT_TRACK = {
    "torch": "a step left torch (a NumPy round trip, .numpy(), .tolist()): keep every step in torch",
    "keras": "a step left keras.ops (a NumPy round trip, ops.convert_to_numpy): keep every step in keras.ops",
    "numpy": "the result was left as another kind of value (a list, a tensor): return a NumPy array",
}


def expect_answer_dict(answer: Any, keys: Sequence[str], what: str) -> dict:
    """A graded question's answer: a dict holding at least ``keys`` (the failure quotes the keys the text names)."""
    if not isinstance(answer, dict) or set(keys) - set(answer):
        got = sorted(map(str, answer)) if isinstance(answer, dict) else type(answer).__name__
        raise CheckFailed(f"the text says: {what} should return a dict with the keys {', '.join(keys)}; got {got}")
    return answer


#: The exercises' rule for answers whose type the text names (stated in the conventions of chapter 1's exercises).
ANSWER_TYPE_RULE = ("the rule of every chapter's exercises, stated in chapter 1: an answer has the type the text "
                    "names; 12.0 is not an int, 12 is not a float, a list is not a tuple, and a NumPy scalar counts "
                    "as the Python number of its kind")
_ANSWER_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int, np.integer),
    "float": (float, np.floating),
    "tuple": (tuple,),
    "list": (list,),
    "dict": (dict,),
    "str": (str,),
}


def expect_answer_type(value: Any, kind: str, what: str) -> None:
    """The one check of an answer whose type the text names: ``kind`` is ``"int"``, ``"float"``, ``"tuple"``,
    ``"list"``, ``"dict"`` or ``"str"``.

    A bool is never a number; a NumPy integer counts as an int and a NumPy float as a float (see
    :data:`ANSWER_TYPE_RULE`). Unlike :func:`expect_type`, the failure is raised at once: the value checks that
    follow may rely on the type.
    """
    if kind not in _ANSWER_TYPES:
        raise ValueError(f"kind must be one of {', '.join(_ANSWER_TYPES)}; got {kind!r}")
    if isinstance(value, bool | np.bool_) or not isinstance(value, _ANSWER_TYPES[kind]):
        from companion.checks import _short

        article = "an" if kind == "int" else "a"
        raise CheckFailed(f"the text says: {what} is {article} {kind}; got {type(value).__name__} {_short(value)}. "
                          f"Likely: a value of a neighbouring type ({ANSWER_TYPE_RULE})")


def expect_number(value: Any, expected: float, what: str, mistakes: dict[str, float | None] | None = None,
                  rtol: float = 1e-6) -> None:
    """A numeric answer (an int or a float; not a bool, not a string) equal to ``expected`` within ``rtol``.

    Infinities compare exactly. When the value matches one of ``mistakes`` (message -> wrong value, None to skip),
    the failure names it.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise CheckFailed(f"the text says: {what} is a number; got {type(value).__name__}")
    value = float(value)

    def same(number: float, target: float) -> bool:
        return number == target or bool(np.isfinite(target) and np.isclose(number, target, rtol=rtol))

    if same(value, expected):
        return
    for message, wrong in (mistakes or {}).items():
        if wrong is not None and same(value, wrong):
            raise CheckFailed(f"{what} = {value:.6g} is not right. Likely: {message}")
    raise CheckFailed(f"{what} should be {expected:.6g}; got {value:.6g}")


#: One-call answers to attention: allowed is everything else (softmax, matmul, masked_fill, ...).
ATTENTION_SHORTCUTS = (
    "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.functional.multi_head_attention_forward",
    "torch.nn.MultiheadAttention",
    "keras.ops.dot_product_attention",
    "keras.layers.MultiHeadAttention",
    "keras.layers.Attention",
)
EMBEDDING_SHORTCUTS = ("torch.nn.functional.embedding", "torch.nn.Embedding", "keras.layers.Embedding")
LAYER_NORM_SHORTCUTS = ("torch.nn.functional.layer_norm", "torch.nn.LayerNorm", "keras.layers.LayerNormalization")
LOSS_SHORTCUTS = (
    "torch.nn.functional.cross_entropy",
    "torch.nn.CrossEntropyLoss",
    "keras.losses.CategoricalCrossentropy",
    "keras.losses.SparseCategoricalCrossentropy",
    "keras.losses.categorical_crossentropy",
    "keras.ops.categorical_crossentropy",
)
MODEL_SHORTCUTS = ("torch.nn.Transformer", "torch.nn.TransformerEncoderLayer", "torch.nn.TransformerDecoderLayer")


def torch_gradients(fn: Any, args: tuple, upstream: Any, index: int | None = None) -> tuple[Any, list, str]:
    """Call ``fn`` with its float tensor arguments requiring gradients and back-propagate ``upstream``.

    ``index`` picks the output to differentiate when ``fn`` returns several. Works on the student's function in
    the notebook and, in the grader, on its proxy (the backward pass then runs in the student's process).
    Returns (the result, the gradient of each argument or None, why there are none).
    """
    hooks = proxy_hooks(fn)
    if hooks is not None:
        return hooks.gradients(fn, args, upstream, index, "torch")
    import torch

    prepared = [a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
                else a for a in args]
    result = fn(*prepared)
    output = result if index is None else result[index]
    if not isinstance(output, torch.Tensor):
        return result, [None] * len(args), f"the output is a {type(output).__name__}, not a tensor"
    if not output.requires_grad:
        return result, [None] * len(args), ("the output does not depend on the inputs through autograd (detached, "
                                            "or computed outside torch)")
    output.backward(torch.ones_like(output) if upstream is None else torch.as_tensor(upstream, dtype=output.dtype))
    return result, [getattr(a, "grad", None) for a in prepared], ""


def keras_gradients(fn: Any, args: tuple, upstream: Any, index: int | None = None) -> tuple[Any, list, str]:
    """Like :func:`torch_gradients`, for a Keras answer: the active backend's autodiff (``tf.GradientTape`` on
    TensorFlow, autograd on torch, ``jax.vjp`` on JAX), in the student's process when ``fn`` is a grader proxy.
    """
    hooks = proxy_hooks(fn)
    if hooks is not None:
        return hooks.gradients(fn, args, upstream, index, "keras")
    from companion.grade.sandbox.keras_grad import keras_gradients as local

    return local(fn, args, upstream, index)


#: How each track's answer loses its gradient, for the messages.
_GRAPH = {
    "torch": "torch's graph (no .detach(), no torch.no_grad(), no NumPy round trip)",
    "keras": "the backend's autodiff graph (no keras.ops.stop_gradient, no NumPy round trip)",
}


def gradients(track: str, fn: Any, args: tuple, upstream: Any, index: int | None = None) -> tuple[Any, list, str]:
    """:func:`torch_gradients` or :func:`keras_gradients`, by track."""
    if track not in _GRAPH:
        raise ValueError(f"track must be 'torch' or 'keras'; got {track!r}")
    return (torch_gradients if track == "torch" else keras_gradients)(fn, args, upstream, index)


def expect_differentiable(fn: Any, args: tuple, what: str, inputs: tuple[int, ...], index: int | None = None,
                          track: str = "torch") -> None:
    """The gradient of the output (``index`` of several) reaches each float tensor argument listed in ``inputs``.

    Catches a ``.detach()``, a ``torch.no_grad()`` or a NumPy round trip inside a torch answer, and a
    ``keras.ops.stop_gradient`` or a NumPy round trip inside a Keras answer.
    """
    from companion.checks import call

    if track not in _GRAPH:
        raise ValueError(f"track must be 'torch' or 'keras'; got {track!r}")
    result, grads, why = call(torch_gradients if track == "torch" else keras_gradients, fn, args, None, index)
    if why.startswith("the output is a"):
        return  # not a tensor at all: expect_type names that
    for position in inputs:
        grad = grads[position]
        if grad is None or not bool(np.isfinite(to_numpy(grad)).all()):
            raise CheckFailed(f"{what}: no gradient reaches argument {position + 1}; the computation must stay in "
                              f"{_GRAPH[track]}" + (f" ({why})" if why else ""))
