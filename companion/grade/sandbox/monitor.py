"""Watch what runs while the student's answer runs, so that a forbidden computation is seen whatever its name.

An exercise declares the one-call answers it forbids (``shortcuts=`` in :mod:`companion.checks`, e.g.
``torch.nn.functional.scaled_dot_product_attention``). Each declared name belongs to a family of computations
(:data:`FAMILIES`: attention, embedding, layer norm, cross-entropy, autograd); while an armed exercise's function
or class runs, this module records

- for an answer of the PyTorch track, every PyTorch operator dispatched (a ``TorchDispatchMode``): the fused
  attention kernels, ``native_layer_norm``, ``embedding``, the NLL kernels, whatever Python name, alias, private
  function, closure or ``functools.partial`` reached them;
- every execution of the family's Python functions (a profile hook that compares code objects: Keras ops and
  their backend implementations, layers' ``call``, PyTorch's Python-level modules and autograd entry points), so
  a function taken back out of a tripwire's closure is still the same code;
- calls of built-in functions by name, from Python: PyTorch's private entry points that decompose before they
  are dispatched (``torch._scaled_dot_product_attention_math``), ``torch.embedding``, the autograd engine's
  ``run_backward``.

If the student's code removes the profile hook or the dispatch mode while it runs, the call reports that the
monitoring was switched off. Everything here runs in the student's process, which the student's code controls:
it is a detector for shortcuts, not a guarantee (see ``book/grading.md``).
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from typing import Any

#: family: (words in a declared name, aten operator names containing, Python functions as "module:qualname",
#: patterns that the whole name of a built-in (C) function called from Python matches)
FAMILIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "attention": (
        ("attention", "Attention"),
        ("scaled_dot_product", "_native_multi_head_attention", "_flash_attention", "_efficient_attention"),
        ("torch.nn.functional:multi_head_attention_forward", "torch.nn:MultiheadAttention.forward",
         "keras.ops:dot_product_attention", "keras.src.ops.nn:dot_product_attention",
         "keras.src.ops.nn:DotProductAttention.call", "keras.layers:MultiHeadAttention.call",
         "keras.layers:Attention.call", "keras.layers:AdditiveAttention.call", "@backend.nn:dot_product_attention"),
        (r".*scaled_dot_product.*", r".*multi_head_attention.*"),
    ),
    "embedding": (
        ("embedding", "Embedding"),
        ("aten.embedding.", "aten.embedding_bag", "aten._embedding_bag"),
        ("torch.nn.functional:embedding", "torch.nn:Embedding.forward", "keras.layers:Embedding.call"),
        (r"_?embedding(_bag)?",),
    ),
    "layer_norm": (
        ("layer_norm", "LayerNorm", "LayerNormalization"),
        ("native_layer_norm", "aten.layer_norm"),
        ("torch.nn.functional:layer_norm", "torch.nn:LayerNorm.forward", "keras.ops:layer_normalization",
         "keras.src.ops.nn:layer_normalization", "keras.layers:LayerNormalization.call",
         "@backend.nn:layer_normalization"),
        (r"_?(native_)?layer_norm",),
    ),
    "cross_entropy": (
        ("cross_entropy", "CrossEntropy", "crossentropy", "Crossentropy"),
        ("nll_loss", "cross_entropy_loss"),
        ("torch.nn.functional:cross_entropy", "torch.nn.functional:nll_loss", "torch.nn:CrossEntropyLoss.forward",
         "keras.ops:categorical_crossentropy", "keras.ops:sparse_categorical_crossentropy",
         "keras.src.ops.nn:categorical_crossentropy", "keras.src.ops.nn:sparse_categorical_crossentropy",
         "keras.losses:categorical_crossentropy", "keras.losses:sparse_categorical_crossentropy",
         "@backend.nn:categorical_crossentropy", "@backend.nn:sparse_categorical_crossentropy"),
        (r".*(cross_entropy_loss|nll_loss).*",),
    ),
    "autograd": (
        ("torch.autograd", "backward", "torch.func"),
        (),
        ("torch.autograd:backward", "torch.autograd:grad", "torch:Tensor.backward", "torch.func:vjp",
         "torch.func:grad", "torch.func:grad_and_value", "torch.autograd.functional:vjp",
         "torch.autograd.functional:jacobian"),
        (r"_?run_backward",),
    ),
}


def families_of(names: set[str]) -> list[str]:
    """The families that the declared shortcut names belong to."""
    return [family for family, (words, *_rest) in FAMILIES.items() if any(w in n for n in names for w in words)]


def _resolve(spec: str) -> Any:
    module_name, _, qualname = spec.partition(":")
    if module_name.startswith("@backend."):
        keras = sys.modules.get("keras")
        if keras is None:
            return None
        try:
            backend = keras.config.backend()
        except Exception:  # an unusual Keras: nothing to watch there
            return None
        module_name = f"keras.src.backend.{backend}.{module_name[len('@backend.'):]}"
    root = module_name.split(".")[0]
    if root not in sys.modules:  # never import a framework the answer does not use
        return None
    try:
        value: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError):
        return None
    return value


def _code_of(value: Any) -> Any:
    for candidate in (value, getattr(value, "__func__", None), getattr(value, "__wrapped__", None)):
        code = getattr(candidate, "__code__", None)
        if code is not None:
            return code
    return None


def code_index() -> dict[str, Any]:
    """The code object of every watched Python function of the frameworks imported now, by its spec.

    Taken before the tripwires are set and before the student's code is loaded, so that replacing a module's
    attribute later cannot steer the watch away from the real function.
    """
    index = {}
    for _words, _aten, python, _c in FAMILIES.values():
        for spec in python:
            code = _code_of(_resolve(spec))
            if code is not None:
                index[spec] = code
    return index


class Monitor:
    """What ran, for the families of the armed names; :meth:`run` calls the student's code under watch."""

    def __init__(self, names: set[str], index: dict[str, Any] | None = None, operators: bool = True) -> None:
        self.families = families_of(names)
        self.index = index or {}
        self.operators = operators  # watch PyTorch's dispatched operators too (costly: for torch answers only)
        self.found: list[str] = []
        self.switched_off = False
        self._cache: tuple[tuple[str, ...], dict[Any, str], re.Pattern] | None = None

    def _watched(self) -> tuple[tuple[str, ...], dict[Any, str], re.Pattern]:
        patterns: list[str] = []
        codes: dict[Any, str] = {}
        c_names: list[str] = []
        for family in self.families:
            _words, aten, python, c_functions = FAMILIES[family]
            patterns += aten
            c_names += c_functions
            for spec in python:  # a framework imported only by the student's code is looked up now
                code = self.index.get(spec) or _code_of(_resolve(spec))
                if code is not None:
                    codes[code] = spec.replace(":", ".").replace("@backend.", "keras backend ")
        return tuple(patterns), codes, re.compile("|".join(c_names) or "(?!)")

    def run(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)`` with the profile hook and the dispatch mode in place."""
        if not self.families:
            return function(*args, **kwargs)
        if self._cache is None:
            self._cache = self._watched()
        patterns, codes, c_names = self._cache
        found = self.found

        def hook(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                label = codes.get(frame.f_code)
                if label is not None:
                    found.append(label)
            elif event == "c_call":
                name = getattr(arg, "__name__", "")
                if isinstance(name, str) and c_names.fullmatch(name):
                    found.append(f"the built-in function {name}")

        mode = _dispatch_mode(patterns, found) if patterns and self.operators else None
        previous = sys.getprofile()
        if mode is not None:
            mode.__enter__()
        sys.setprofile(hook)
        try:
            return function(*args, **kwargs)
        finally:
            still_watching = sys.getprofile() is hook
            sys.setprofile(previous)
            if mode is not None:
                still_watching &= _leave(mode)
            if not still_watching:
                self.switched_off = True


_RECORDER: list[type] = []


def _dispatch_mode(patterns: tuple[str, ...], found: list[str]) -> Any:
    """A dispatch mode that adds the operators matching ``patterns`` to ``found`` (None without PyTorch)."""
    if sys.modules.get("torch") is None:
        return None
    if not _RECORDER:
        from torch.utils._python_dispatch import TorchDispatchMode

        class Recorder(TorchDispatchMode):
            def __init__(self, patterns: tuple[str, ...], found: list[str]) -> None:
                super().__init__()
                self.patterns, self.found, self.seen = patterns, found, {}

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - PyTorch's signature
                hit = self.seen.get(func)
                if hit is None:
                    name = str(func)
                    hit = self.seen[func] = any(p in name for p in self.patterns)
                if hit:
                    self.found.append(f"the PyTorch operator {func}")
                return func(*args, **(kwargs or {}))

        _RECORDER.append(Recorder)
    return _RECORDER[0](patterns, found)


def warm_up() -> None:
    """Run one PyTorch operator under a dispatch mode, as an armed torch exercise will.

    The first dispatch mode of a process imports hundreds of PyTorch's modules (seconds of CPU); the zygote does it
    once before it forks, so that each student process starts with them imported, as after any other import.
    """
    mode = _dispatch_mode(("warm-up",), [])
    if mode is None:
        return
    import torch

    with mode:
        torch.zeros(1).add(1)


def _leave(mode: Any) -> bool:
    """Take the dispatch mode off the stack; whether it was still there (on top) when the call returned."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    stack = _get_current_dispatch_mode_stack()
    if not stack or stack[-1] is not mode:
        return False
    try:
        mode.__exit__(None, None, None)
    except Exception:  # the stack was changed under it
        return False
    return True
