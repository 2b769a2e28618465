"""Messages between the trusted grader and the sandboxed student process: JSON headers plus ``.npy`` buffers.

A message is ``<header length: 8 bytes><buffers length: 8 bytes><JSON header><buffer bytes ...>``; the header's
``nbytes`` lists the size of each buffer. Values are written as trees of JSON values:

- ``null``, booleans, integers, floats and strings stand for themselves (a Python ``int`` stays an ``int``);
- ``{"list": [...]}``, ``{"tuple": [...]}``, ``{"dict": [[key, value], ...]}``, ``{"set": [...]}``;
- ``{"array": i, "kind": "numpy" | "torch" | "keras" | "scalar", "dtype": ..., "grad": bool}``: buffer ``i`` holds an
  ``.npy`` file (read with ``allow_pickle=False``); the kind says which type to rebuild;
- ``{"ref": n, ...}``: an object that stays in the student's process (a function, a layer, a parameter);
- ``{"cb": n, ...}``: an object that stays in the grader's process (a model the checker scripts, a callback).

Nothing is ever pickled, so reading a message cannot run code.
"""

from __future__ import annotations

import io
import json
import os
import select
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

#: The largest message either side accepts (a forged length cannot make the reader allocate more): the arrays of
#: one reply, and its JSON header on its own. Python objects cost far more than their JSON text (an empty ``{}``
#: of 2 bytes becomes a dictionary of 64), so the header's limit is what bounds the reader's memory.
MAX_MESSAGE = 64 * 2**20
MAX_HEADER = 4 * 2**20
_PREFIX = struct.Struct("<QQ")
_PLAIN = (type(None), bool, int, float, str)


class ChannelClosed(Exception):
    """The other side closed its end (it exited or crashed)."""


class ChannelTimeout(Exception):
    """No message arrived before the deadline."""


class ProtocolError(Exception):
    """A message that does not follow the protocol."""


def write_message(fd: int, header: dict, buffers: list[bytes] | None = None) -> None:
    buffers = buffers or []
    header = dict(header, nbytes=[len(b) for b in buffers])
    data = json.dumps(header, allow_nan=True).encode("utf-8")
    payload = b"".join([_PREFIX.pack(len(data), sum(len(b) for b in buffers)), data, *buffers])
    view = memoryview(payload)
    while view:
        try:
            written = os.write(fd, view)
        except BrokenPipeError:
            raise ChannelClosed("the other side is gone") from None
        view = view[written:]


class Reader:
    """Reads whole messages from a file descriptor, waiting at most until a deadline (``time.monotonic``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = bytearray()

    def _fill(self, size: int, deadline: float | None) -> None:
        while len(self.data) < size:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelTimeout()
                ready, _, _ = select.select([self.fd], [], [], left)
                if not ready:
                    raise ChannelTimeout()
            try:
                chunk = os.read(self.fd, max(1 << 16, min(size - len(self.data), 1 << 24)))
            except OSError as error:
                raise ChannelClosed(str(error)) from None
            if not chunk:
                raise ChannelClosed("end of stream")
            self.data += chunk

    def read(self, deadline: float | None = None) -> tuple[dict, list[bytes]]:
        self._fill(_PREFIX.size, deadline)
        header_size, buffer_size = _PREFIX.unpack(bytes(self.data[: _PREFIX.size]))
        total = _PREFIX.size + header_size + buffer_size
        if header_size + buffer_size > MAX_MESSAGE or header_size > MAX_HEADER:
            raise ProtocolError(f"a message of {header_size} + {buffer_size} bytes (the limits are {MAX_HEADER} for "
                                f"its header, {MAX_MESSAGE} in all)")
        self._fill(total, deadline)
        text = bytes(self.data[_PREFIX.size : _PREFIX.size + header_size])
        try:
            header = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ProtocolError(f"a header that is not JSON ({str(error)[:200]})") from None
        except (RecursionError, MemoryError):  # json's decoder stops at the interpreter's recursion limit
            raise ProtocolError("a header too deeply nested or too large to read") from None
        if not isinstance(header, dict) or not isinstance(header.get("nbytes", []), list):
            raise ProtocolError("a header that is not an object")
        buffers, offset = [], _PREFIX.size + header_size
        for size in header.get("nbytes", []):
            if not isinstance(size, int) or size < 0 or offset + size > total:
                raise ProtocolError("buffer sizes that do not add up")
            buffers.append(bytes(self.data[offset : offset + size]))
            offset += size
        del self.data[:total]
        return header, buffers


# ---------------------------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------------------------


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array if array.flags.c_contiguous else array.copy(order="C"), allow_pickle=False)
    return buffer.getvalue()


def load_array(data: bytes) -> np.ndarray:
    """An ``.npy`` buffer as a plain array; object arrays and pickles are refused."""
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as error:
        raise ProtocolError(f"an array that cannot be read ({type(error).__name__}: {error})") from None
    if not isinstance(array, np.ndarray) or array.dtype.kind in "OV":
        raise ProtocolError("an array of Python objects")
    return array


def tensor_kind(value: Any) -> str | None:
    """``"torch"`` or ``"keras"`` for a framework tensor that travels as data (parameters and variables do not)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return None if isinstance(value, torch.nn.Parameter) else "torch"
    module = type(value).__module__ or ""
    if module.startswith(("tensorflow", "jax", "jaxlib")) and hasattr(value, "shape") and hasattr(value, "dtype"):
        if "Variable" in type(value).__name__:
            return None
        return "keras"
    return None


def encode(value: Any, buffers: list[bytes], other: Callable[[Any], dict], depth: int = 0) -> Any:
    """``value`` as a JSON tree; arrays and tensors go into ``buffers``, anything else through ``other``."""
    if depth > 50:
        raise ValueError("a value nested more than 50 levels deep")
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is list or kind is tuple:
        return {kind.__name__: [encode(v, buffers, other, depth + 1) for v in value]}
    if isinstance(value, tuple | list):  # torch.Size, a named tuple: sent as the plain container
        base = tuple if isinstance(value, tuple) else list
        return {base.__name__: [encode(v, buffers, other, depth + 1) for v in base.__iter__(value)]}
    if kind is dict:
        return {"dict": [[encode(k, buffers, other, depth + 1), encode(v, buffers, other, depth + 1)]
                         for k, v in value.items()]}
    if kind is set or kind is frozenset:
        return {"set": [encode(v, buffers, other, depth + 1) for v in value]}
    if isinstance(value, np.generic) and value.dtype.kind not in "OV":
        buffers.append(_npy(np.asarray(value)))
        return {"array": len(buffers) - 1, "kind": "scalar", "dtype": value.dtype.name}
    if kind is np.ndarray and value.dtype.kind not in "OV":
        buffers.append(_npy(value))
        return {"array": len(buffers) - 1, "kind": "numpy", "dtype": value.dtype.name}
    if kind.__name__ == "TensorShape" and kind.__module__.startswith("tensorflow"):
        dims = value.as_list() if value.rank is not None else None
        return {"tuple": dims} if dims is not None else None
    framework = tensor_kind(value)
    if framework == "torch":
        import torch

        data = value.detach().cpu()
        dtype = str(data.dtype).replace("torch.", "")
        if data.dtype == torch.bfloat16:
            data = data.float()
        buffers.append(_npy(data.numpy()))
        return {"array": len(buffers) - 1, "kind": "torch", "dtype": dtype,
                "grad": bool(value.requires_grad), "leaf": bool(value.is_leaf)}
    if framework == "keras":
        array = np.asarray(value)
        buffers.append(_npy(array))
        return {"array": len(buffers) - 1, "kind": "keras", "dtype": array.dtype.name}
    return other(value)


def decode(tree: Any, buffers: list[bytes], resolve: Callable[[dict], Any]) -> Any:
    """The inverse of :func:`encode`; ``resolve`` turns ``{"ref": ...}`` and ``{"cb": ...}`` nodes into objects.

    Whatever the tree holds, the only exception that comes out of a malformed one is :class:`ProtocolError`.
    """
    try:
        return _decode(tree, buffers, resolve, 0)
    except (TypeError, KeyError, IndexError, ValueError, AttributeError, RecursionError) as error:
        raise ProtocolError(f"a malformed value ({type(error).__name__})") from None


def _decode(tree: Any, buffers: list[bytes], resolve: Callable[[dict], Any], depth: int) -> Any:
    if depth > 60:
        raise ProtocolError("a value nested too deeply")
    if type(tree) in _PLAIN:
        return tree
    if isinstance(tree, list):
        raise ProtocolError("a bare JSON list")
    if not isinstance(tree, dict):
        raise ProtocolError(f"an unexpected {type(tree).__name__}")
    if "list" in tree:
        return [_decode(v, buffers, resolve, depth + 1) for v in tree["list"]]
    if "tuple" in tree:
        return tuple(_decode(v, buffers, resolve, depth + 1) for v in tree["tuple"])
    if "dict" in tree:
        result = {}
        for pair in tree["dict"]:
            key = _decode(pair[0], buffers, resolve, depth + 1)
            try:
                result[key] = _decode(pair[1], buffers, resolve, depth + 1)
            except TypeError:
                raise ProtocolError("a dictionary key that cannot be hashed") from None
        return result
    if "set" in tree:
        try:
            return {_decode(v, buffers, resolve, depth + 1) for v in tree["set"]}
        except TypeError:
            raise ProtocolError("a set item that cannot be hashed") from None
    if "array" in tree:
        index = tree["array"]
        if not isinstance(index, int) or not 0 <= index < len(buffers):
            raise ProtocolError("an array without its buffer")
        array = load_array(buffers[index])
        kind = tree.get("kind")
        if kind == "scalar":
            return array[()] if array.ndim == 0 else array
        if kind == "torch":
            import torch

            tensor = torch.from_numpy(array.copy())
            dtype = getattr(torch, str(tree.get("dtype", "")), None)
            if isinstance(dtype, torch.dtype) and dtype != tensor.dtype:
                tensor = tensor.to(dtype)
            if tree.get("grad") and tensor.is_floating_point():
                tensor.requires_grad_(True)
            return tensor
        if kind == "keras":
            from keras import ops

            return ops.convert_to_tensor(array)
        return array
    if "ref" in tree or "cb" in tree:
        return resolve(tree)
    raise ProtocolError("an unknown kind of value")
