"""Copy weights between a companion torch module and the same companion Keras layer, in either direction.

Both frameworks give every weight-holding sublayer the same attribute name (``wq``, ``linear1``, ``norm``,
``layers``, ...), so no layer needs converter code of its own: :func:`copy_weights` walks the torch module's
children by name, finds the Keras attribute of the same name, and applies a rule at each leaf:

=====================  ====================================  ==============================================
torch                  keras                                 rule
=====================  ====================================  ==============================================
``nn.Linear``          ``keras.layers.Dense``                ``kernel = weight.T`` (torch computes x W^T + b)
``nn.LayerNorm``       ``keras.layers.LayerNormalization``   ``gamma = weight``, ``beta = bias``, same epsilon
``nn.Embedding``       ``keras.layers.Embedding``            ``embeddings = weight``
``nn.ModuleList``      a Python list of layers               element by element
``nn.Parameter``       a Keras variable of the same name     as is
=====================  ====================================  ==============================================

Children without weights (dropout, activations, fixed positional tables) are skipped. Neither framework is
imported here: an object is recognised by the modules already loaded, so this file works with either one alone.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["as_numpy", "copy_weights", "dense_numpy", "params_numpy"]


def _is_torch(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _is_keras(obj: Any) -> bool:
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(obj, keras.layers.Layer)


def as_numpy(value: Any) -> np.ndarray:
    """A torch tensor or parameter, a Keras variable or backend tensor, a list or an array as a NumPy array.

    The dtype is kept, except torch's bfloat16 (NumPy has none), which becomes float32. Gradients are not
    tracked and the result lives on the CPU. Every part of the package that turns a framework's numbers into
    NumPy goes through here.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return (value.float() if value.dtype == torch.bfloat16 else value).numpy()
    keras = sys.modules.get("keras")
    if keras is not None and (isinstance(value, keras.Variable) or keras.ops.is_tensor(value)):
        return keras.ops.convert_to_numpy(value)
    return np.asarray(value)


def _weight_numpy(value: Any, dtype: Any = None) -> np.ndarray:
    """A weight as NumPy: float32 or float64 kept, any other dtype as float32; ``dtype`` casts to that instead."""
    array = as_numpy(value)
    if dtype is not None:
        return array.astype(dtype)
    return array if array.dtype in (np.float32, np.float64) else array.astype(np.float32)


def _has_weights(module) -> bool:
    return any(True for _ in module.parameters())


class _Copier:
    """One walk over a torch module and its Keras twin; ``to_keras`` says which way the numbers flow."""

    def __init__(self, to_keras: bool):
        self.to_keras = to_keras
        self.written: set[int] = set()  # ids of the Keras variables touched, to find the ones left over

    def pair(self, parameter, variable, path: str, transform=None) -> None:
        """Copy one torch parameter <-> one Keras variable; ``transform`` maps torch layout to Keras layout."""
        if variable is None:
            raise ValueError(f"{path}: no such weight in the Keras layer (torch has shape {tuple(parameter.shape)})")
        torch_value = _weight_numpy(parameter)
        keras_shape = tuple(variable.shape)
        expected = tuple((transform(torch_value) if transform else torch_value).shape)
        if expected != keras_shape:
            raise ValueError(
                f"{path}: shape mismatch, torch {tuple(parameter.shape)} (as Keras {expected}) vs Keras {keras_shape}"
            )
        self.written.add(id(variable))
        if self.to_keras:
            variable.assign(transform(torch_value) if transform else torch_value)
        else:
            import torch

            value = _weight_numpy(variable)
            value = transform(value) if transform else value  # every transform we use is its own inverse (.T)
            with torch.no_grad():
                parameter.copy_(torch.as_tensor(np.ascontiguousarray(value)))

    def walk(self, module, layer, path: str) -> None:
        import keras
        from torch import nn

        if isinstance(layer, keras.layers.Layer) and not layer.built:
            raise ValueError(
                f"{path}: the Keras layer {layer.name!r} is not built yet; call it once on an input (any batch) "
                "so that its weights exist, then copy"
            )
        if isinstance(module, nn.Linear):
            self._expect(layer, keras.layers.Dense, path)
            self.pair(module.weight, layer.kernel, f"{path}.weight", transform=np.transpose)
            self._optional(module.bias, getattr(layer, "bias", None), f"{path}.bias")
        elif isinstance(module, nn.LayerNorm):
            self._expect(layer, keras.layers.LayerNormalization, path)
            if not np.isclose(module.eps, layer.epsilon):
                raise ValueError(f"{path}: epsilon differs, torch {module.eps} vs Keras {layer.epsilon}")
            self._optional(module.weight, getattr(layer, "gamma", None), f"{path}.weight")  # None: no scale
            self._optional(module.bias, getattr(layer, "beta", None), f"{path}.bias")  # None: no centre
        elif isinstance(module, nn.Embedding):
            self._expect(layer, keras.layers.Embedding, path)
            self.pair(module.weight, layer.embeddings, f"{path}.weight")
        elif isinstance(module, nn.ModuleList | nn.Sequential):
            self._walk_list(module, layer, path)
        else:
            for name, parameter in module.named_parameters(recurse=False):
                self.pair(parameter, self._attribute(layer, name, path), f"{path}.{name}")
            for name, child in module.named_children():
                if _has_weights(child):
                    self.walk(child, self._attribute(layer, name, path), f"{path}.{name}")

    def _walk_list(self, module, layer, path: str) -> None:
        import keras

        layers = layer.layers if isinstance(layer, keras.Sequential) else layer
        if not isinstance(layers, list | tuple):
            raise ValueError(f"{path}: torch has a {type(module).__name__}, Keras a {type(layer).__name__}, not a list")
        # Pair the elements that hold weights, in order (a Sequential may hold activations on one side only).
        torch_items = [(name, child) for name, child in module.named_children() if _has_weights(child)]
        keras_items = [
            item for item in layers if not isinstance(item, keras.layers.Layer) or not item.built or item.weights
        ]
        if len(torch_items) != len(keras_items):
            raise ValueError(f"{path}: {len(torch_items)} torch layers with weights vs {len(keras_items)} in Keras")
        for (name, child), item in zip(torch_items, keras_items, strict=True):
            self.walk(child, item, f"{path}[{name}]")

    def _optional(self, parameter, variable, path: str) -> None:
        """A weight that a layer may be built without (a bias, a LayerNorm scale): both sides or neither."""
        if (parameter is None) != (variable is None):
            raise ValueError(f"{path}: present in {'Keras' if parameter is None else 'torch'} only")
        if parameter is not None:
            self.pair(parameter, variable, path)

    @staticmethod
    def _expect(layer, cls, path: str) -> None:
        if not isinstance(layer, cls):
            raise ValueError(f"{path}: expected a keras.layers.{cls.__name__}, found {type(layer).__name__}")

    @staticmethod
    def _attribute(layer, name: str, path: str):
        value = getattr(layer, name, None)
        if value is None:  # absent, or set to None (an optional part that this Keras layer was built without)
            raise ValueError(f"{path}.{name}: the Keras layer {type(layer).__name__} has no attribute {name!r}")
        return value


def copy_weights(src, dst) -> None:
    """Copy every weight of ``src`` into ``dst``: a companion torch module -> the same Keras layer, or back.

    The Keras layer must be built (called once). Raises ValueError naming the path (``Transformer.encoder.
    layers[0].ffn.linear1.weight``) of the first attribute that is missing or has a different shape, and of any
    Keras weight left without a torch counterpart.
    """
    if _is_torch(src) and _is_keras(dst):
        module, layer, to_keras = src, dst, True
    elif _is_keras(src) and _is_torch(dst):
        module, layer, to_keras = dst, src, False
    else:
        raise TypeError(
            f"copy_weights needs a torch.nn.Module and a keras.layers.Layer; got {type(src).__name__} and "
            f"{type(dst).__name__}"
        )
    copier = _Copier(to_keras)
    copier.walk(module, layer, type(module).__name__)
    # Seed generators own a variable too, but it is a random state, not a weight.
    left = [v.path for v in layer.weights if id(v) not in copier.written and "seed_generator" not in v.path]
    if left:
        raise ValueError(f"{type(module).__name__}: Keras weights with no torch counterpart: {', '.join(left)}")


def dense_numpy(layer: Any, dtype: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(w, b)`` of an ``nn.Linear`` or a ``keras.layers.Dense`` in the oracle's ``x @ w + b`` convention.

    ``w`` has shape ``(d_in, d_out)`` in both cases (torch stores the transpose); ``b`` is None without bias.
    The arrays keep the weights' float32 (or float64); ``dtype`` (``np.float64`` for the NumPy oracle) casts them.
    """
    if _is_torch(layer) and isinstance(layer, sys.modules["torch"].nn.Linear):
        weight, bias = _weight_numpy(layer.weight, dtype).T, layer.bias
    elif _is_keras(layer) and isinstance(layer, sys.modules["keras"].layers.Dense):
        weight, bias = _weight_numpy(layer.kernel, dtype), getattr(layer, "bias", None)
    else:
        raise TypeError(f"expected an nn.Linear or a keras.layers.Dense; got {type(layer).__name__}")
    return weight, None if bias is None else _weight_numpy(bias, dtype)


def params_numpy(mha: Any, dtype: Any = None) -> dict[str, np.ndarray]:
    """The weights of a companion MultiHeadAttention (torch or Keras) as the oracle's dict.

    Keys ``wq, bq, wk, bk, wv, bv, wo, bo``, ready for ``companion.reference.multi_head_attention``; ``dtype`` as
    for :func:`dense_numpy`.
    """
    params = {}
    for name in "qkvo":
        params[f"w{name}"], params[f"b{name}"] = dense_numpy(getattr(mha, f"w{name}"), dtype)
    return params
